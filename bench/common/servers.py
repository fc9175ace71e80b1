"""Local servers the benches start (the worker's HTTP mode, LiteLLM's proxy): a free port
on 127.0.0.1 and a start that waits for the health route, with the log's tail when the
process dies or never answers."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_until_healthy(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    health_url: str,
    *,
    cwd: Path | None = None,
    wait_s: float = 180,
) -> subprocess.Popen:
    """Start ``argv`` with stdout and stderr in ``log`` and wait (``wait_s`` at most) until
    ``health_url`` answers 200; RuntimeError with the log's tail otherwise (process killed)."""
    out = open(log, "w")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()  # the child holds its own copy
    deadline = time.time() + wait_s
    while time.time() < deadline and proc.poll() is None:
        try:
            if requests.get(health_url, timeout=5).status_code == 200:
                return proc
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{argv[0]} did not start: {log.read_text()[-2000:]}")
