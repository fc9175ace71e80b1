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
import logging
import os
import sys
from typing import Any

from fastapi import FastAPI

from handler.faces.http_server import ServerState, add_health_route, build_asgi
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


def _uvicorn(app: Any, host: str, port: int, settings: Settings) -> Any:
    import uvicorn  # in the caller's thread, before the loader starts (it imports nothing)

    # An oversized WebSocket message closes the socket with 1009 (message too big).
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        ws_max_size=settings.realtime_max_message_bytes,
    )
    return uvicorn.Server(config)


def serve(settings: Settings | None = None) -> int:
    """Serve until stopped; 1 when the settings or the model load fail."""
    try:
        loader = Loader(settings)  # settings, logging and imports, in this thread
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1

    state = _state(loader.settings)
    gateway = state.gateway is not None
    port = int(os.environ.get("PORT") or 80)
    health_port = int(os.environ.get("PORT_HEALTH") or port)
    health_path = os.environ.get("HEALTH_CHECK_PATH") or "/ping"
    host = os.environ.get("HOST") or "0.0.0.0"

    def server(app: Any, at: int) -> Any:
        return _uvicorn(app, host, at, loader.settings)

    servers = [server(build_asgi(state, health_path), port)]
    if health_port != port:
        health = FastAPI(docs_url=None, redoc_url=None)
        add_health_route(health, state, health_path)
        servers.append(server(health, health_port))

    def ready(worker: Runtime) -> None:
        loader.ready()
        state.metrics.load.set(loader.times.model_load + loader.times.warmup)
        state.worker = worker
        log.info("serving on port %d (health %s on %d)", port, health_path, health_port)

    def failed(message: str) -> None:
        if loader.self_test_failed:  # keep answering 503 with the reason; never serve
            log.error("%s", message)
            state.failure = message
            return
        for s in servers:
            s.should_exit = True

    async def main() -> None:
        state.slots = asyncio.Semaphore(loader.settings.concurrency)
        tasks = [asyncio.ensure_future(s.serve()) for s in servers]
        # Load once the health route answers (204 meanwhile), so a load balancer sees the
        # worker as starting rather than unreachable.
        while not all(s.started for s in servers) and not any(t.done() for t in tasks):
            await asyncio.sleep(0.01)
        if gateway:  # a gateway loads no model: it queues jobs for the consumers
            log.info("gateway serving on port %d (health %s on %d)", port, health_path, health_port)
        else:
            loader.start(on_ready=ready, on_error=failed)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    if loader.error is not None and not loader.self_test_failed:
        print(f"whisper-worker: {loader.error}", file=sys.stderr)
        return 1
    return 0
