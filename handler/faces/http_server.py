"""HTTP mode: OpenAI's ``/v1/audio/transcriptions`` over the same job pipeline as the queue.

``python -m handler serve`` (or ``WHISPER_MODE=http`` with the image's plain ``python -m
handler``) serves, on ``PORT``:

- ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: OpenAI's multipart API
  (``file``, ``model``, ``language``, ``prompt``, ``response_format``, ``temperature``,
  ``timestamp_granularities[]``, ``stream``) plus our job options as extra fields;
- ``GET /v1/models``: the loaded models (and ``whisper-1``, OpenAI's name for the default);
  ``GET /v1/models/{id}``: one of them, else OpenAI's 404 ``model_not_found``;
- ``/v2/{endpoint_id}/run``, ``runsync``, ``status``, ``stream``, ``cancel``, ``health``,
  ``purge-queue``: RunPod's job API, jobs that outlive a request (handler.faces.runpod_api);
- ``POST /v1/jobs``: our own job JSON (``{"input": {...}}``, as a queue job), answering the
  same output object;
- ``HEALTH_CHECK_PATH`` (default ``/ping``) on ``PORT_HEALTH`` (default ``PORT``): 204
  while the model loads, 200 once it serves, as RunPod's load balancer expects.

With ``WHISPER_BROKER_URL`` (a gateway, no model) the jobs run on the broker's consumers.

FastAPI + uvicorn (the runpod SDK already depends on both, so the image gains nothing):
multipart parsing by python-multipart, the event loop free while jobs run in threads.
At most ``WHISPER_MAX_CONCURRENCY`` requests run and ``WHISPER_HTTP_MAX_QUEUE`` wait;
beyond that a request gets 429 with ``Retry-After`` at once. A client that disconnects
cancels its job, which frees its slot at the job's next cancel check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from handler.contract import Segment, is_openai_model
from handler.errors import Code, WorkerError
from handler.faces import assemblyai, deepgram, openai_api, realtime, tokens
from handler.faces.admission import loaded_models, run_admitted, settle
from handler.faces.auth import ApiKey, BodyLimit, BodyTooLarge, ReceiveLimit
from handler.faces.broker.gateway import BROKER_GONE, BrokerDown
from handler.faces.metrics import Metrics, RequestMetrics
from handler.faces.openai_errors import request_error
from handler.faces.runpod_api import add_runpod_routes
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from handler.settings import Settings

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2


def _too_large(limit: int) -> Response:
    return _error(
        Code.INPUT_TOO_LARGE,
        f"the request body is over {limit} bytes; send a URL as audio_url instead",
    )


def _error(code: Code, message: str) -> JSONResponse:
    return _error_response(WorkerError(code, message).to_result())


def _error_response(error: dict[str, Any]) -> JSONResponse:
    status, body = openai_api.error_body(error)
    return JSONResponse(body, status_code=status, headers=_retry_after(status))


def _retry_after(status: int) -> dict[str, str] | None:
    """Retry-After on every answer that says "later" (429, 503)."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None


@dataclass
class ServerState:
    """What the routes share: the worker once loaded, and the admission counters."""

    settings: Settings
    worker: Runtime | None = None
    admitted: int = 0
    """Requests holding a place: running or waiting for a slot (the 429 accounting)."""
    running: int = 0
    executor: ThreadPoolExecutor = field(init=False)
    slots: asyncio.Semaphore | None = None
    metrics: Metrics = field(default_factory=Metrics)
    failure: str | None = None
    """Why this server will never serve (the speech self-test failed): /ping and /ready
    answer 503 with it."""
    gateway: Any = None
    """With a broker: the job API's store in Redis (handler.faces.broker.gateway); no model here."""
    jobs: Any = None
    """The job API's store (handler.faces.jobs.Jobs; with a broker, the gateway's)."""
    live: realtime.LiveState = field(init=False)
    """What the live sessions share: their count, their thread pool."""

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(
            max_workers=self.settings.concurrency, thread_name_prefix="http-job"
        )
        # A live turn's thread mostly waits on the engine; two per session (interim, final).
        self.live = realtime.LiveState(
            ThreadPoolExecutor(
                max_workers=max(1, 2 * self.settings.realtime_max_sessions),
                thread_name_prefix="live",
            )
        )

    @property
    def capacity(self) -> int:
        return self.settings.concurrency + self.settings.http_max_queue


def create_app(state: ServerState, *, health_path: str = "/ping") -> FastAPI:
    """The routes: health, service (metrics, realtime), models, OpenAI's audio, our jobs."""
    app = FastAPI(title="whisper-worker", docs_url=None, redoc_url=None)
    app.add_exception_handler(
        BodyTooLarge, lambda _r, _e: _too_large(state.settings.max_upload_bytes)
    )

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.error("request failed with an unexpected %s", type(exc).__name__, exc_info=exc)
        return _error(Code.INTERNAL, "internal error while processing the request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = openai_api.not_routed(request.method, request.url.path, exc.status_code)
        return JSONResponse(body, status_code=exc.status_code)

    add_health_route(app, state, health_path)
    add_service_routes(app, state)
    deepgram.add_routes(app, state)
    add_job_routes(app, state)
    state.jobs = add_runpod_routes(app, state, settle)
    assemblyai.add_routes(app, state)  # after RunPod's: /v2/{id}/health stays RunPod's
    key = state.settings.api_key
    tokens.add_routes(app, key.get_secret_value() if key is not None else None)
    return app


def add_job_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/models``, OpenAI's audio routes and ``/v1/jobs``."""

    @app.get("/v1/models")
    async def models() -> Response:
        names = await _loaded_models(state)
        if isinstance(names, Response):
            return names
        data = [_model(n) for n in ["whisper-1", *names]]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        names = await _loaded_models(state)
        if isinstance(names, Response):
            return names
        if name in names or is_openai_model(name):  # OpenAI's names mean the default
            return JSONResponse(_model(name))
        message = f"The model '{name}' does not exist here; GET /v1/models lists them"
        return JSONResponse(request_error(message[:300], "model_not_found"), status_code=404)

    async def audio_route(request: Request) -> Response:
        return await _audio(state, request)

    for route in openai_api.ROUTES:
        app.add_api_route(route, audio_route, methods=["POST"])

    @app.post("/v1/jobs")
    async def native(request: Request) -> Response:
        return await _native(state, request)


def _model(name: str) -> dict[str, Any]:
    """OpenAI's model object."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "whisper-worker"}


async def _loaded_models(state: ServerState) -> list[str] | Response:
    """This server's models, or (a gateway) those its consumers loaded."""
    if state.gateway is not None:
        try:
            return await loaded_models(state)
        except BrokerDown:
            return _error(Code.NOT_READY, BROKER_GONE)
    worker = _ready_worker(state)
    return worker if isinstance(worker, Response) else worker.pool.names


async def _audio_request(
    request: Request, loaded: list[str]
) -> tuple[openai_api.OpenAIRequest, bytes | None] | Response:
    """The multipart form as a request and its upload, or the error answer."""
    try:
        form = await request.form(max_files=1, max_fields=openai_api.MAX_FIELDS)
    except BodyTooLarge:
        raise
    except Exception as exc:  # python-multipart's and Starlette's parse errors
        log.info("unreadable form: %s", type(exc).__name__)
        return _error(Code.INVALID_INPUT, "the body is not a valid multipart form")
    upload = form.get("file")
    items = [(k, v) for k, v in form.multi_items() if k != "file" and isinstance(v, str)]
    try:
        fields = openai_api.fold_form(items)
        req = openai_api.build_request(
            request.url.path,
            fields,
            loaded_models=loaded,
            has_file=isinstance(upload, UploadFile),
        )
    except WorkerError as exc:
        return _error_response(exc.to_result())
    audio: bytes | None = None
    if isinstance(upload, UploadFile):
        audio = await upload.read()
        await upload.close()
    elif not any(k in req.job_input for k in ("audio_url", "audio_base64", "audio")):
        return _error(Code.INVALID_INPUT, "file: a file upload (or audio_url) is required")
    return req, audio


async def _audio(state: ServerState, request: Request) -> Response:
    """OpenAI's ``/v1/audio/transcriptions`` and ``/translations``."""
    loaded = await _loaded_models(state)
    if isinstance(loaded, Response):
        return loaded
    parsed = await _audio_request(request, loaded)
    if isinstance(parsed, Response):
        return parsed
    req, audio = parsed
    worker = state.worker
    if req.stream:
        return await _stream(state, worker, request, req, audio)
    if state.gateway is not None or worker is None:  # a gateway: a consumer runs it
        result = await state.gateway.result(req.job_input, request.is_disconnected, audio)
    else:
        result = await _run_admitted(
            state,
            request,
            lambda cancel: run_job(
                req.job_input, worker, job_id="http", cancel=cancel, audio=audio
            ),
        )
    if isinstance(result, Response):
        return result
    if "error" in result:
        return _error_response(result)
    body, media = openai_api.response_body(req, result)
    if isinstance(body, str):
        return PlainTextResponse(body, media_type=media)
    return JSONResponse(body)


async def _native(state: ServerState, request: Request) -> Response:
    """``POST /v1/jobs``: a queue job's JSON (either shape), answered as the queue does."""
    worker = None if state.gateway is not None else _ready_worker(state)
    if isinstance(worker, Response):
        return worker
    try:
        job = json.loads(await request.body())
    except BodyTooLarge:
        raise
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        return _error(Code.INVALID_INPUT, "the body is not JSON (or nests too deeply)")
    if not isinstance(job, dict) or "input" not in job:
        return _error(Code.INVALID_INPUT, 'a job is {"input": {...}}')
    if worker is None:
        result = await state.gateway.result(job["input"], request.is_disconnected)
    else:
        result = await _run_admitted(
            state,
            request,
            lambda cancel: openai_api.run_any_job(
                job["input"], worker, job_id="http", cancel=cancel
            ),
        )
    if isinstance(result, Response):
        return result
    if isinstance(result, dict) and "error" in result:
        status, _ = openai_api.error_body(result)
        return JSONResponse(result, status_code=status, headers=_retry_after(status))
    return JSONResponse({"output": result})


def add_service_routes(app: FastAPI, state: ServerState) -> None:
    """``/metrics`` and live audio (``/v1/realtime``, handler.faces.realtime)."""

    @app.get("/metrics")
    async def metrics() -> Response:
        m = state.metrics
        m.running.set(state.running)
        m.waiting.set(max(0, state.admitted - state.running))
        m.sessions.set(state.live.sessions)
        return Response(m.render(), media_type=m.content_type)

    @app.websocket("/v1/realtime")
    async def live(ws: WebSocket) -> None:
        await realtime.serve_on(ws, state)


def add_health_route(app: FastAPI, state: ServerState, path: str) -> None:
    @app.get(path)
    async def ping() -> Response:
        if state.failure is not None:
            return JSONResponse({"status": "failed", "reason": state.failure}, status_code=503)
        if state.worker is None and state.gateway is None:
            return Response(status_code=204)  # loading: the load balancer waits
        return JSONResponse({"status": "healthy"})

    @app.get("/ready")
    async def ready() -> Response:
        # For probes that take any 2xx as ready (Kubernetes): 503 until the model serves.
        if state.failure is not None:
            return JSONResponse({"status": "failed", "reason": state.failure}, status_code=503)
        if state.worker is None and state.gateway is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready"})


def _ready_worker(state: ServerState) -> Runtime | Response:
    if state.failure is not None:  # another worker may serve it: retryable
        return _error(Code.NOT_READY, f"this worker will not serve: {state.failure}")
    if state.worker is None:
        return _error(Code.NOT_READY, "the model is still loading; retry shortly")
    return state.worker


def _queue_full(state: ServerState, holding: str = "requests running or waiting") -> JSONResponse:
    return _error(Code.QUEUE_FULL, f"the server is busy ({state.capacity} {holding}); retry later")


async def _run_admitted(
    state: ServerState,
    request: Request,
    job: Callable[[threading.Event], Any],
    admitted: bool = False,
) -> Any:
    """handler.faces.admission.run_admitted, full answered in OpenAI's shape (429)."""
    return await run_admitted(state, request, job, lambda: _queue_full(state), admitted)


def _delta_sender(queue: asyncio.Queue[Any], with_logprobs: bool) -> Callable[[Segment], None]:
    """The job's ``on_segment`` for a stream: each decoded segment's delta event put on
    ``queue`` (from the decoding thread, through the running loop)."""
    loop = asyncio.get_running_loop()
    first = [True]

    def on_segment(seg: Segment) -> None:
        text = seg["text"].strip()
        if not text:
            return
        delta = text if first[0] else " " + text
        first[0] = False
        event = openai_api.delta_event(delta, seg.get("words"), with_logprobs)
        loop.call_soon_threadsafe(queue.put_nowait, event)

    return on_segment


async def _stream(
    state: ServerState,
    worker: Runtime | None,
    request: Request,
    req: openai_api.OpenAIRequest,
    audio: bytes | None,
) -> Response:
    """Server-sent events in OpenAI's shape: text deltas as segments decode, then done.

    The place is taken here, before the 200 goes out: a full server answers 429 itself,
    never a 200 stream that carries a 429 (seen in the HTTP soak under load)."""
    if state.admitted >= state.capacity:
        return _queue_full(state)
    state.admitted += 1
    queue: asyncio.Queue[Any] = asyncio.Queue()
    on_segment = _delta_sender(queue, req.logprobs)
    started = [False]

    async def run() -> None:
        started[0] = True  # from here _run_admitted (or _on_a_consumer) gives it back
        try:
            if worker is None:  # a gateway: the job runs on a consumer, its segments in Redis
                result = await _on_a_consumer(state, request, req, audio, on_segment)
            else:
                result = await _run_admitted(
                    state,
                    request,
                    lambda cancel: run_job(
                        req.job_input,
                        worker,
                        job_id="http",
                        cancel=cancel,
                        on_segment=on_segment,
                        audio=audio,
                    ),  # fmt: skip
                    admitted=True,
                )
        except Exception:  # a bug of ours: the stream still ends, with an error event
            log.exception("a streamed transcription failed")
            result = _error(Code.INTERNAL, "internal error while transcribing")
        await queue.put(("done", result))

    def give_back(_task: asyncio.Future) -> None:
        if not started[0]:  # cancelled before it ran: the place taken above is freed here
            state.admitted -= 1

    task = asyncio.ensure_future(run())
    task.add_done_callback(give_back)
    segments = req.response_format == "diarized_json"
    return StreamingResponse(
        _events(queue, task, segments, req.logprobs), media_type="text/event-stream"
    )


async def _on_a_consumer(
    state: ServerState,
    request: Request,
    req: openai_api.OpenAIRequest,
    audio: bytes | None,
    on_segment: Callable[[Any], None],
) -> Any:
    """A gateway's stream: the job run on a consumer, its segments as the consumer stores
    them; the place _stream took is given back here."""
    try:
        result = await state.gateway.result(
            req.job_input, request.is_disconnected, audio, on_segment
        )
        await asyncio.sleep(0)  # the deltas on_segment scheduled go in before done
    finally:
        state.admitted -= 1
    return result


async def _events(
    queue: asyncio.Queue[Any],
    task: asyncio.Future,
    segments: bool = False,
    with_logprobs: bool = False,
) -> AsyncIterator[str]:
    """The stream's body: a delta per decoded segment, then (``diarized_json``) OpenAI's
    ``transcript.text.segment`` event per speaker segment once the speakers are known,
    then done (or the error); a client that goes away cancels ``task`` (its job is then
    cancelled by _run_admitted)."""
    try:
        while True:
            item = await queue.get()
            if not isinstance(item, tuple):  # a delta event
                yield f"data: {json.dumps(item)}\n\n"
                continue
            result = item[1]
            if isinstance(result, Response):
                body = json.loads(bytes(result.body))
            elif "error" in result:
                _, body = openai_api.error_body(result)
            else:
                if segments:
                    for event in result["diarized_json"]["segments"]:
                        yield f"data: {json.dumps(event)}\n\n"
                body = openai_api.done_event(result, with_logprobs)
            yield f"data: {json.dumps(body)}\n\n"
            return
    finally:
        if not task.done():
            task.cancel()


def build_asgi(state: ServerState, health_path: str = "/ping") -> ASGIApp:
    """The routes inside their guards: the API key (when set) outermost but for the health
    routes, then the body cap; every request counted by route and status."""
    app = create_app(state, health_path=health_path)
    limit = state.settings.max_upload_bytes
    inner: ASGIApp = BodyLimit(app, limit, lambda: _too_large(limit))
    inner = ReceiveLimit(
        inner, state.capacity, lambda: _queue_full(state, "uploads being received")
    )
    key = state.settings.api_key
    if key is not None:
        inner = ApiKey(inner, key.get_secret_value(), open_paths={health_path, "/ready"})
    if state.settings.cors_origins:  # outside the key: a preflight never carries it
        inner = CORSMiddleware(
            inner,
            allow_origins=state.settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "OpenAI-Beta", "X-Request-Id"],
            expose_headers=["Retry-After"],
            max_age=600,
        )
    routes = {getattr(r, "path", "") for r in app.routes}
    return RequestMetrics(inner, state.metrics, lambda: routes)
