"""A local emulator of RunPod serverless: the real SDK worker loop runs against it.

`Emulator` serves RunPod's worker URLs (job-take, job-take-batch, job-stop, job-done,
job-stream, ping) and client URLs (run, runsync, status, stream, cancel, retry,
health, purge-queue) on 127.0.0.1, spawns worker processes and records every
timestamp for the benchmark. `python -m runpod_emulator --help` serves one from the
command line. Modules: config (settings), model (job/worker records), state (the
rules), server (HTTP), workers (processes), core (the Emulator).

Choices where the platform's behaviour is not documented (all in EmulatorConfig):
- A result over the job's limit (10 MiB /run, 20 MiB /runsync) is answered 400; the
  job shows COMPLETED without output (oversize_result="fail" makes it FAILED).
- A job whose worker died is requeued at the front once (max_requeues), then ends
  FAILED with error "worker lost" (or TIMED_OUT: lost_job_status).
- A worker being stopped by the emulator gets no new job (withhold_from_stopping).
- FAILED status objects carry the posted `output` next to `error`; a non-string
  `error` shows COMPLETED without output.
- Webhooks fire for every final status except purged jobs; TTL counts from submit and
  applies to queued jobs; a cancelled or timed-out job gets one job-stop.
- Timestamps are time.time() seconds everywhere.
"""

from .config import EmulatorConfig
from .core import Emulator
from .state import EndpointState

__all__ = ["Emulator", "EmulatorConfig", "EndpointState"]
