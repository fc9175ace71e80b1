"""Worker processes for the emulator: the environment the SDK reads, spawn, stop, kill.

Each worker runs in its own session (process group) because the SDK forks a
heartbeat process: killing only the worker's main process would leave that child
pinging forever, so a kill goes to the whole group.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

log = logging.getLogger(__name__)


def worker_env(
    base_url: str, endpoint_id: str, api_key: str, worker_id: str, ping_interval_ms: int
) -> dict[str, str]:
    """The variables the runpod SDK's worker loop reads (see runpod-protocol.md)."""
    prefix = f"{base_url}/{endpoint_id}"
    return {
        # The SDK appends `&job_in_progress=`, `&isStream=`: the `?` must be there.
        "RUNPOD_WEBHOOK_GET_JOB": f"{prefix}/job-take/$ID?gpu=emulated",
        "RUNPOD_WEBHOOK_POST_OUTPUT": f"{prefix}/job-done/$RUNPOD_POD_ID/$ID?gpu=emulated",
        "RUNPOD_WEBHOOK_POST_STREAM": f"{prefix}/job-stream/$RUNPOD_POD_ID/$ID?gpu=emulated",
        "RUNPOD_WEBHOOK_PING": f"{prefix}/ping/$RUNPOD_POD_ID",
        "RUNPOD_PING_INTERVAL": str(max(1000, int(ping_interval_ms))),
        "RUNPOD_AI_API_KEY": api_key,
        "RUNPOD_POD_ID": worker_id,
        "RUNPOD_ENDPOINT_BASE_URL": base_url,
        # RunPod sets it in every worker: a job that splits submits its pieces here.
        "RUNPOD_ENDPOINT_ID": endpoint_id,
        "RUNPOD_LOG_LEVEL": "INFO",
        "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
        "RUNPOD_SKIP_GPU_CHECK": "true",
    }


def _no_proxy_for_loopback(env: dict[str, str]) -> None:
    # The heartbeat uses requests, which honours proxy variables; 127.0.0.1 must
    # never go through one.
    for key in ("NO_PROXY", "no_proxy"):
        current = [p for p in env.get(key, "").split(",") if p]
        for host in ("127.0.0.1", "localhost"):
            if host not in current:
                current.append(host)
        env[key] = ",".join(current)


@dataclass
class WorkerProcess:
    worker_id: str
    popen: subprocess.Popen[bytes]
    log_path: str
    log_file: IO[bytes]
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def terminate(self) -> None:
        """SIGTERM to the main process only, as a container runtime does."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_group(self) -> None:
        """SIGKILL the worker and every process it started."""
        self.killed = True
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """After exit: reap leftover children (the heartbeat process) and the log."""
        self.kill_group()
        if not self.log_file.closed:
            self.log_file.close()


def spawn_worker(
    worker_id: str,
    command: list[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    log_path: str,
) -> WorkerProcess:
    full_env = {**os.environ, **env}
    _no_proxy_for_loopback(full_env)
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed by WorkerProcess.close
    try:
        popen = subprocess.Popen(
            command,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError:
        log_file.close()
        raise
    log.info("started worker %s (pid %d), log %s", worker_id, popen.pid, log_path)
    return WorkerProcess(worker_id, popen, log_path, log_file)
