"""RunPod's own job API on the HTTP face, so the clients users already have (the runpod
SDK's ``Endpoint`` with ``runpod.endpoint_url_base`` set to this server's ``/v2``,
whisper_client, plain HTTP) work unchanged against a self-hosted URL:

- ``POST /v2/{endpoint_id}/run``: ``{"input": {...}, "webhook"?: url}``, answered at once
  with ``{"id", "status": "IN_QUEUE"}``;
- ``POST /v2/{endpoint_id}/runsync?wait=ms``: waits up to ``wait`` (1-300 s, default 90 s),
  then the status object, ended or not;
- ``GET /v2/{endpoint_id}/status/{id}``, ``GET /v2/{endpoint_id}/stream/{id}`` (each
  streamed segment handed out once), ``POST /v2/{endpoint_id}/cancel/{id}``,
  ``GET /v2/{endpoint_id}/health``, ``POST /v2/{endpoint_id}/purge-queue``.

Statuses, ``output``, ``error``, ``delayTime`` and ``executionTime`` as RunPod's. Any
endpoint id is taken unless ``WHISPER_ENDPOINT_ID`` names one; ``WHISPER_API_KEY`` guards
these routes as every other. The jobs run in this server's engine (handler.faces.jobs),
or, with ``WHISPER_BROKER_URL``, on the broker's consumers (handler.faces.broker.gateway).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from handler.audio.netpost import check_url
from handler.errors import WorkerError
from handler.faces.broker.gateway import BrokerDown
from handler.faces.jobs import Jobs, StoreFull, call_store

RUNSYNC_WAIT_MS = 90_000
BROKER_DOWN = "the job broker (Redis) cannot be reached; nothing was queued; retry later"


def _answer(status: int, body: dict[str, Any], retry: bool = False) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Retry-After": "2"} if retry else None)


class RunPodApi:
    """The routes' work over ``state`` (handler.faces.http_server.ServerState)."""

    def __init__(self, state: Any, settle: Callable[[Any], Any]) -> None:
        self.state, self.settle = state, settle
        self.jobs: Any = state.gateway or Jobs(
            state.settings, lambda: state.worker, self.run_in_slot
        )
        self.own = state.settings.endpoint_id

    async def call(self, method: str, *args: Any) -> Any:
        """``self.jobs.<method>(*args)``: in a thread when the store is on the network."""
        return await call_store(self.jobs, method, *args)

    async def run_in_slot(
        self, job: Callable[[threading.Event], Any], cancel: threading.Event
    ) -> Any:
        """``job(cancel)`` in a thread once one of the server's slots is free."""
        state = self.state
        assert state.slots is not None
        async with state.slots:
            future = asyncio.get_running_loop().run_in_executor(state.executor, job, cancel)
            state.running += 1
            try:
                result = await asyncio.shield(future)
            except asyncio.CancelledError:
                cancel.set()  # the thread leaves the model at its next check
                state.metrics.job_done(await self.settle(future))
                raise
            finally:
                state.running -= 1
            state.metrics.job_done(result)
            return result

    def known(self, endpoint_id: str) -> Response | None:
        """404 in RunPod's shape for another endpoint's id (when one is configured)."""
        if self.own is not None and endpoint_id != self.own:
            return _answer(404, {"error": f"endpoint {endpoint_id[:64]!r} not found"})
        return None

    async def job(self, endpoint_id: str, job_id: str) -> Any:
        """The job's record (or snapshot), or the answer: 404 in RunPod's shape, 503."""
        if (bad := self.known(endpoint_id)) is not None:
            return bad
        rec = await self.call("get", job_id)
        return _answer(404, {"error": "job not found"}) if rec is None else rec

    async def submit(self, request: Request, endpoint_id: str) -> Any:
        if (bad := self.known(endpoint_id)) is not None:
            return bad
        body = await request.body()
        try:
            payload = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return _answer(400, {"error": "the body is not JSON (or nests too deeply)"})
        if not isinstance(payload, dict) or "input" not in payload:
            return _answer(400, {"error": 'a job is {"input": {...}}'})
        if (refused := _webhook_refused(payload.get("webhook"))) is not None:
            return refused
        return await self.call("submit", payload["input"], len(body), payload.get("webhook"))

    async def run(self, request: Request, endpoint_id: str) -> Response:
        rec = await self.submit(request, endpoint_id)
        if isinstance(rec, Response):
            return rec
        return _answer(200, {"id": rec.id, "status": "IN_QUEUE"})

    async def runsync(self, request: Request, endpoint_id: str) -> Response:
        rec = await self.submit(request, endpoint_id)
        if isinstance(rec, Response):
            return rec
        try:
            wait_ms = int(request.query_params.get("wait") or RUNSYNC_WAIT_MS)
        except ValueError:
            wait_ms = RUNSYNC_WAIT_MS
        rec = await self.jobs.wait(rec, min(max(wait_ms, 1000), 300_000) / 1000)
        return _answer(200, rec.status_object())

    async def status(self, endpoint_id: str, job_id: str) -> Response:
        rec = await self.job(endpoint_id, job_id)
        return rec if isinstance(rec, Response) else _answer(200, rec.status_object())

    async def stream(self, endpoint_id: str, job_id: str) -> Response:
        rec = await self.job(endpoint_id, job_id)
        if isinstance(rec, Response):
            return rec
        return _answer(200, await self.jobs.take_stream(rec))

    async def cancel(self, endpoint_id: str, job_id: str) -> Response:
        rec = await self.job(endpoint_id, job_id)
        return rec if isinstance(rec, Response) else _answer(200, await self.call("cancel", rec))

    async def health(self, endpoint_id: str) -> Response:
        bad = self.known(endpoint_id)
        return bad if bad is not None else _answer(200, await self.call("health"))

    async def purge(self, endpoint_id: str) -> Response:
        bad = self.known(endpoint_id)
        if bad is not None:
            return bad
        return _answer(200, {"removed": await self.call("purge"), "status": "completed"})


def _webhook_refused(webhook: Any) -> Response | None:
    if webhook is None:
        return None
    if not isinstance(webhook, str):
        return _answer(400, {"error": "webhook: a URL"})
    try:
        check_url(webhook, "webhook")
    except WorkerError as exc:
        return _answer(400, {"error": exc.message})
    return None


def add_runpod_routes(app: FastAPI, state: Any, settle: Callable[[Any], Any]) -> Any:
    """RunPod's job API on ``app``; its jobs' store."""
    api = RunPodApi(state, settle)

    @app.exception_handler(StoreFull)
    async def _full(_request: Request, _exc: StoreFull) -> Response:
        return _answer(429, {"error": "too many jobs held here; retry later"}, retry=True)

    @app.exception_handler(BrokerDown)
    async def _down(_request: Request, exc: BrokerDown) -> Response:
        return _answer(503, {"error": exc.reason or BROKER_DOWN}, retry=True)

    base = "/v2/{endpoint_id}"
    app.add_api_route(f"{base}/run", api.run, methods=["POST"])
    app.add_api_route(f"{base}/runsync", api.runsync, methods=["POST"])
    app.add_api_route(f"{base}/status/{{job_id}}", api.status, methods=["GET", "POST"])
    app.add_api_route(f"{base}/stream/{{job_id}}", api.stream, methods=["GET", "POST"])
    app.add_api_route(f"{base}/cancel/{{job_id}}", api.cancel, methods=["POST"])
    app.add_api_route(f"{base}/health", api.health, methods=["GET"])
    app.add_api_route(f"{base}/purge-queue", api.purge, methods=["POST"])
    return api.jobs
