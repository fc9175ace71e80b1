"""Settings of the local RunPod serverless emulator, with the platform's defaults.

Every knob a test or the benchmark may turn lives here, in one dataclass, so the
emulator's behaviour is described in one place. Times are seconds unless named `_ms`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from handler.contract import TERMINAL_JOB_STATES

MIB = 1024 * 1024

IN_QUEUE = "IN_QUEUE"
IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMED_OUT = "TIMED_OUT"
TERMINAL = TERMINAL_JOB_STATES
assert {COMPLETED, FAILED, CANCELLED, TIMED_OUT} == TERMINAL


def default_worker_command() -> list[str]:
    """The project's worker entry point, run with this interpreter."""
    return [sys.executable, "-m", "handler"]


@dataclass
class EmulatorConfig:
    """How the emulated endpoint behaves. Defaults follow RunPod's documented ones,
    except where a long value would only slow tests down (noted per field)."""

    endpoint_id: str = "local-endpoint"
    """The `{endpoint}` path segment of every URL."""
    api_key: str = "local-emulator-key"
    """Clients send `Authorization: Bearer <key>`, workers the raw key."""
    port: int = 0
    """TCP port on 127.0.0.1; 0 picks a free one."""

    # Long-polls. The SDK asks again at once after a 204, so the server holds the
    # request; short holds keep SIGTERM drains fast (the SDK waits for open polls).
    take_poll_s: float = 1.0
    """How long an empty job-take / job-take-batch is held before 204."""
    stop_poll_s: float = 1.0
    """How long an empty job-stop is held before 204."""
    stream_poll_s: float = 0.5
    """How long `GET /stream` waits for a new item while the job runs."""
    withhold_from_stopping: bool = True
    """Hand no job to a worker the emulator is stopping (the platform knows it sent
    SIGTERM). False reproduces the real race where an open job-take can still hand
    over one job during the drain (the job is then lost and handled as below)."""

    # Job lifetime.
    execution_timeout_s: float = 600.0
    """IN_PROGRESS longer than this -> TIMED_OUT and a job-stop to the worker.
    Per job: `policy.executionTimeout` (ms)."""
    ttl_s: float = 24 * 3600.0
    """IN_QUEUE longer than this -> TIMED_OUT. Per job: `policy.ttl` (ms)."""
    run_result_keep_s: float = 30 * 60.0
    """After this, `/status` of a finished `/run` job answers 404."""
    runsync_result_keep_s: float = 60.0
    """Same for `/runsync` jobs."""
    runsync_default_wait_ms: int = 90_000
    """`/runsync` without `?wait=`; the given value is clamped to 1 s..300 s."""

    # A job whose worker died (process exited, or an external worker went silent).
    max_requeues: int = 1
    """Requeue a lost job at the front of the queue this many times..."""
    lost_job_status: Literal["FAILED", "TIMED_OUT"] = "FAILED"
    """...then end it with this status (FAILED carries error "worker lost")."""
    external_worker_timeout_s: float = 30.0
    """A worker not started by the emulator is lost after this long without a request."""

    # Payload limits (the platform says 10 MB / 20 MB; read here as MiB).
    run_payload_limit: int = 10 * MIB
    runsync_payload_limit: int = 20 * MIB
    oversize_result: Literal["no_output", "fail"] = "no_output"
    """A job-done body over the job's limit is answered 400 (the SDK logs it and
    drops the result). "no_output": the job shows COMPLETED without output, as users
    report from the platform (runpod-python#309); "fail": FAILED with an error."""
    body_hard_limit: int = 64 * MIB
    """Bodies above this are refused without being read (connection closed)."""

    # Webhooks.
    webhook_attempts: int = 3
    """One POST, retried twice until a 2xx..."""
    webhook_retry_delay_s: float = 10.0
    """...this far apart (the platform waits 10 s; tests set it low)."""
    webhook_timeout_s: float = 5.0

    # Worker processes.
    worker_command: list[str] = field(default_factory=default_worker_command)
    worker_cwd: str | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every worker (on top of the emulator's)."""
    ping_interval_ms: int = 10_000
    """RUNPOD_PING_INTERVAL; the SDK needs >= 1000."""
    log_dir: str | None = None
    """Where `<worker_id>.log` files go; None makes a temporary directory."""
    stop_grace_s: float = 30.0
    """A worker still running this long after SIGTERM is killed (SIGKILL)."""
    initial_workers: int = 0
    """Workers started by `Emulator.start()`."""

    # Fault injection (also settable at run time through Emulator methods).
    take_delay_s: float = 0.0
    """Sleep before answering every job-take (a slow control plane)."""
