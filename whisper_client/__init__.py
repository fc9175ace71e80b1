"""whisper_client: call a deployed whisper-worker endpoint (RunPod's /run, /runsync, /status,
/stream, /cancel) from Python or the command line (``python -m whisper_client``).

A product of its own: of the worker package it imports only ``handler.contract`` (the
standard library alone; importing it changes nothing in the caller's process), so it runs on
a laptop that has neither faster-whisper nor a model. ``result_of`` finds the result in
what the runpod SDK's ``Endpoint.run_sync`` or ``Job.output()`` returns.
"""

from whisper_client.client import DEFAULT_BASE_URL, Client, ClientError, main, result_of

__all__ = ["DEFAULT_BASE_URL", "Client", "ClientError", "main", "result_of"]
