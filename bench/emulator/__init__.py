"""A local emulator of RunPod serverless: the real SDK worker loop runs against it.

`Emulator` serves RunPod's worker URLs (job-take, job-stop, job-done, job-stream,
ping) and client URLs (run, runsync, status, stream, cancel, retry, health,
purge-queue) on 127.0.0.1, spawns worker processes and records every timestamp for
the benchmark. `python -m bench.emulator --help` serves one from the command line.
"""

from .config import EmulatorConfig
from .core import Emulator
from .state import EndpointState

__all__ = ["Emulator", "EmulatorConfig", "EndpointState"]
