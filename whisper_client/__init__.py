"""whisper_client: call a deployed whisper-worker endpoint (RunPod's /run, /runsync, /status,
/stream, /cancel) from Python or the command line (``python -m whisper_client``).

A product of its own: it imports nothing from the worker package (``handler``), so it
installs and runs on a laptop that has neither faster-whisper nor a model.
"""

from whisper_client.client import DEFAULT_BASE_URL, Client, ClientError, main

__all__ = ["DEFAULT_BASE_URL", "Client", "ClientError", "main"]
