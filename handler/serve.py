"""HTTP mode's entry (``python -m handler serve`` or ``WHISPER_MODE=http``): start the
server at once (the health route answers 204), load the model meanwhile, then serve.
With ``WHISPER_BROKER_URL`` it is a gateway instead: no model, jobs queued on the broker
(handler.faces.broker.gateway) for ``whisper-worker consume``.

The routes live in handler.faces.http_server; this module owns the process: ports from
``PORT``, ``PORT_HEALTH`` (a second server for RunPod's load balancer when it differs),
``HEALTH_CHECK_PATH`` and ``HOST``, and the start-up (handler.startup.Loader).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI

from handler.faces import webhooks
from handler.faces.http_server import ServerState, add_health_route, build_asgi
from handler.faces.jobs import Jobs
from handler.pipeline.runtime import Runtime
from handler.settings import Settings
from handler.startup import STARTUP_ERRORS, Loader

log = logging.getLogger(__name__)


def _state(settings: Settings) -> ServerState:
    """The routes' state; with a broker, its job store (a gateway: no model here)."""
    state = ServerState(settings)
    if settings.broker_url is not None:
        from handler.faces.broker.gateway import BrokerJobs

        state.gateway = BrokerJobs(settings)
    return state


def port_from_env(name: str, default: int) -> int:
    """A port setting, or ValueError saying in one sentence what it must be."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{name} must be a port number from 0 to 65535, not {raw[:20]!r}")
    return int(raw)


def listen(host: str, port: int, name: str) -> socket.socket:
    """A listening socket on host:port, or ValueError with one line saying what to change.

    Bound here rather than by uvicorn, which answers a refused bind with SystemExit(3) and
    a traceback from inside the event loop. Under 1024 as a user (the image runs as uid
    10001) only Docker's default ``net.ipv4.ip_unprivileged_port_start=0`` allows it;
    podman and a Kubernetes pod keep 1024.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # "::" takes IPv4 too, as uvicorn's own bind did (create_server sets IPV6_V6ONLY else)
    both = host == "::" and socket.has_dualstack_ipv6()
    try:
        return socket.create_server((host, port), family=family, backlog=2048, dualstack_ipv6=both)
    except OSError as exc:
        where = f"{host}:{port} ({name})"
        if exc.errno == errno.EACCES and 0 < port < 1024:
            raise ValueError(
                f"cannot listen on {where}: permission denied; ports under 1024 need "
                "CAP_NET_BIND_SERVICE or net.ipv4.ip_unprivileged_port_start=0 (Docker's "
                f"default; podman and Kubernetes keep 1024) and this process (uid {os.getuid()}) "
                f"has neither: set {name} to 1024 or more, e.g. 8000"
            ) from None
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"cannot listen on {where}: another process holds it; set {name} to a free port"
            ) from None
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"cannot listen on {where}: {reason}; check HOST and {name}") from None


OPEN_FILES_CAP = 1 << 20


def raise_open_files_limit() -> None:
    """Each connection holds a descriptor, and Docker (25 and later) starts containers with
    a soft limit of 1024: about a thousand connections that send nothing (each held up to
    the receive deadline) used them all, accept failed and every client was locked out.
    The soft limit goes up to the hard one (at most OPEN_FILES_CAP), as Go programs and
    nginx's worker_rlimit_nofile do, and as containerd asks of software that needs more
    (moby/moby#45534, containerd/containerd#8924)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_CAP)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files: the soft limit stays %d (%s)", soft, exc)
        return
    log.info("open files: soft limit raised from %d to %d", soft, want)


def listen_on_ports(host: str) -> list[socket.socket]:
    """``PORT``'s socket, then ``PORT_HEALTH``'s where it differs; ValueError (one line)
    when either cannot be had, with nothing left open."""
    sockets: list[socket.socket] = []
    try:
        port = port_from_env("PORT", 80)
        health_port = port_from_env("PORT_HEALTH", port)
        sockets.append(listen(host, port, "PORT"))
        if health_port != port:
            sockets.append(listen(host, health_port, "PORT_HEALTH"))
    except ValueError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _uvicorn(app: Any, host: str, port: int, state: ServerState) -> Any:
    import uvicorn  # in the caller's thread, before the loader starts (it imports nothing)

    from handler.faces.receive_guard import guarded_protocol
    from handler.faces.send_guard import guarded_ws_protocol
    from handler.faces.tokens import RedactQuery

    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, RedactQuery) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(RedactQuery())  # no short-lived token in a log line
    settings = state.settings
    cut = state.metrics.connections_cut
    protocol = guarded_protocol(
        settings.http_receive_timeout_s,
        settings.http_min_receive_rate,
        lambda reason: cut.labels(reason=reason).inc(),
    )

    ws_protocol = guarded_ws_protocol(
        settings.realtime_send_timeout_s, lambda reason: cut.labels(reason=reason).inc()
    )
    # An oversized WebSocket message closes the socket with 1009 (message too big).
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        ws=ws_protocol,
        log_config=None,
        access_log=False,
        lifespan="off",
        ws_max_size=settings.realtime_max_message_bytes,
    )
    return _quiet_server(uvicorn.Server)(config)


def _quiet_server(base: type) -> type:
    """uvicorn's Server without its own signal handling: uvicorn sets the handler per server
    (a second server replaces the first's) and, once stopped, raises the signal again, which
    killed the process before the job API's jobs could drain. serve() handles SIGTERM and
    SIGINT itself, for every server at once."""

    class Server(base):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server


def serve(settings: Settings | None = None) -> int:
    """Serve until stopped; 1 when the settings, the ports or the model load fail."""
    host = os.environ.get("HOST") or "0.0.0.0"
    try:
        loader = Loader(settings)  # settings, logging and imports, in this thread
        raise_open_files_limit()
        sockets = listen_on_ports(host)  # ValueError: one line saying which port and why
    except (*STARTUP_ERRORS, ValueError) as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1
    process = _Process(loader, host, sockets)
    asyncio.run(process.main())
    webhooks.wait_idle(timeout=loader.settings.drain_s + 30)  # the drained jobs' webhooks
    if loader.error is not None and not loader.self_test_failed:
        print(f"whisper-worker: {loader.error}", file=sys.stderr)
        return 1
    return 0


class _Process:
    """The servers on their sockets, the model's load beside them, and the stop."""

    def __init__(self, loader: Loader, host: str, sockets: list[socket.socket]) -> None:
        self.loader, self.sockets = loader, sockets
        self.port, self.health_port = (k.getsockname()[1] for k in (sockets[0], sockets[-1]))
        self.state = state = _state(loader.settings)
        self.health_path = os.environ.get("HEALTH_CHECK_PATH") or "/ping"
        self.servers = [_uvicorn(build_asgi(state, self.health_path), host, self.port, state)]
        if len(sockets) > 1:
            health = FastAPI(docs_url=None, redoc_url=None)
            add_health_route(health, state, self.health_path)
            self.servers.append(_uvicorn(health, host, self.health_port, state))

    def ready(self, worker: Runtime) -> None:
        self.loader.ready()
        self.state.metrics.load.set(self.loader.times.model_load + self.loader.times.warmup)
        self.state.worker = worker
        log.info("serving on port %d (health %s on %d)", *self.where())

    def where(self) -> tuple[int, str, int]:
        return self.port, self.health_path, self.health_port

    def failed(self, message: str) -> None:
        if self.loader.self_test_failed:  # keep answering 503 with the reason; never serve
            log.error("%s", message)
            self.state.failure = message
            return
        for s in self.servers:
            s.should_exit = True

    def stop(self) -> None:
        """SIGTERM or SIGINT; a second SIGINT (Ctrl-C twice) stops at once."""
        for s in self.servers:
            s.force_exit = s.should_exit
            s.should_exit = True

    async def main(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, self.stop)
        self.state.slots = asyncio.Semaphore(self.loader.settings.concurrency)
        tasks = [
            asyncio.ensure_future(s.serve([k]))
            for s, k in zip(self.servers, self.sockets, strict=True)
        ]
        # Load once the health route answers (204 meanwhile), so a load balancer sees the
        # worker as starting rather than unreachable.
        while not all(s.started for s in self.servers) and not any(t.done() for t in tasks):
            await asyncio.sleep(0.01)
        if self.state.gateway is not None:  # a gateway loads no model: consumers run jobs
            log.info("gateway serving on port %d (health %s on %d)", *self.where())
        else:
            self.loader.start(on_ready=self.ready, on_error=self.failed)
        await asyncio.gather(*tasks)
        if isinstance(self.state.jobs, Jobs):  # stopped: the job API's jobs finish or fail
            await self.state.jobs.drain(self.loader.settings.drain_s)
