"""``python -m whisper_client``: send audio to an endpoint and print the result."""

import sys

from whisper_client.client import main

if __name__ == "__main__":
    sys.exit(main())
