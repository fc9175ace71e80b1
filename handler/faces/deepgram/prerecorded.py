"""Deepgram's pre-recorded API: ``POST /v1/listen`` with the audio as the body (any
content type but JSON) or ``{"url": "..."}``, the options in the query, answered with
Deepgram's response (``metadata``, ``results.channels[0].alternatives[0]`` with its
transcript, confidence and words, ``utterances`` when asked).

Options: ``model`` (a model loaded here by name; any other name is the default model),
``language`` (``en``, ``en-US``, ``multi``: each word's language, with ``language_hint``
the languages detected among), ``detect_language`` (the channel then says
``detected_language`` and ``language_confidence``), ``diarize`` or ``diarize_model`` (a
worker with ``WHISPER_DIARIZATION``: each word's ``speaker``; otherwise refused as a file
job is), ``utterances`` (one per segment, or broken at pauses of ``utt_split``),
``dictation`` (spoken punctuation as marks), ``keywords`` and ``keyterm`` (hotwords),
``multichannel`` (each channel transcribed on its own: one entry of ``results.channels``
per channel, utterances with their ``channel``), ``replace`` and ``search`` (over the
words as written); formatting options are accepted (Whisper punctuates as it
transcribes), ``profanity_filter``, ``redact`` (numbers: handler.faces.deepgram.query.redaction).
``callback`` (``callback_method`` post or put): the
job is queued and ``{"request_id"}`` answered at once; the response (or Deepgram's error
body) is sent there when it ends. The analyses this worker does not run (``redact=pii``,
``sentiment``, ``summarize``, ...) are refused with a sentence.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from handler.audio.netpost import check_url
from handler.errors import WorkerError
from handler.faces import openai_api, webhooks
from handler.faces.admission import loaded_models, run_admitted
from handler.faces.broker.gateway import BROKER_GONE, BrokerDown
from handler.faces.deepgram import shape
from handler.faces.deepgram.query import (
    ACCEPTED,
    QueryError,
    diarization,
    extra,
    flag,
    keywords,
    language_hints,
    redaction,
    refuse_unserved,
    replacements,
    searches,
    served_model,
    utt_split,
)
from handler.faces.deepgram.response import answer
from handler.faces.jobs import StoreFull, call_store
from handler.pipeline.job import run_job


class Refused(Exception):
    """A request that can never succeed as sent: 400 with the reason."""


def error(status: int, message: str, code: str = "Bad Request") -> JSONResponse:
    """Deepgram's error body."""
    body = {"err_code": code, "err_msg": message, "request_id": str(uuid.uuid4())}
    headers = {"Retry-After": "2"} if status in (429, 503) else None
    return JSONResponse(body, status_code=status, headers=headers)


def job_input(params: Any, loaded: list[str]) -> tuple[dict[str, Any], str]:
    """The job for the query's options, and the model name the answer gives."""
    try:
        return _job_input(params, loaded)
    except QueryError as exc:
        raise Refused(str(exc)) from None


def _job_input(params: Any, loaded: list[str]) -> tuple[dict[str, Any], str]:
    if params.get("channels") not in (None, "1"):
        raise Refused("channels describes raw audio; send a file with a header (WAV, FLAC, ...)")
    refuse_unserved(params)
    for name in ACCEPTED:
        flag(params, name)
    replacements(params)  # checked now: answer() applies them after the job
    extra(params)  # and carries these back in its metadata
    searches(params)
    model = params.get("model") or ""
    job: dict[str, Any] = {"output": ["text", "segments", "words"], "word_timestamps": True}
    if model in loaded:
        job["model"] = model
    language = shape.language_of(params.get("language"))
    if language and not flag(params, "detect_language"):
        job["language"] = language
    if hints := language_hints(params):
        job["languages"] = hints  # language=multi: each part detected among them
    if diarization(params):
        job["diarize"] = True
    if flag(params, "multichannel"):
        job["multichannel"] = True
    if flag(params, "profanity_filter"):
        job["profanity_filter"] = "full"  # Deepgram writes every letter: "****"
    if kinds := redaction(params):
        job["redact"] = kinds
    flag(params, "utterances")  # checked now: answer() reads them after the job
    utt_split(params)
    flag(params, "paragraphs")
    flag(params, "dictation")
    terms = keywords(params)
    if terms:
        job["hotwords"] = ", ".join(terms)
    return job, served_model(model, loaded)


async def audio_of(request: Request, job: dict[str, Any]) -> bytes | None:
    """The audio bytes of the body, or (a JSON body) its ``url`` put in ``job``."""
    body = await request.body()
    if request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            url = json.loads(body).get("url")
        except (ValueError, AttributeError, RecursionError):
            raise Refused('a JSON body is {"url": "https://..."}') from None
        if not isinstance(url, str) or not url:
            raise Refused('a JSON body is {"url": "https://..."}')
        job["audio_url"] = url
        return None
    if not body:
        raise Refused("the body is empty: send the audio, or JSON {'url': ...}")
    return body


def callback_of(params: Any) -> tuple[str, str] | None:
    """``callback`` (and ``callback_method``: post or put) as (URL, method), or None; a URL
    that can never be called is refused now (its address is judged when it is called)."""
    url, method = params.get("callback"), (params.get("callback_method") or "post").lower()
    if url is None:
        if params.get("callback_method") is not None:
            raise Refused("callback_method: with a callback")
        return None
    if len(url) > 2048 or method not in ("post", "put"):
        raise Refused("callback: an http(s) URL; callback_method: post or put")
    try:
        check_url(url, "callback")
    except WorkerError as exc:
        raise Refused(exc.message) from None
    return url, method.upper()


async def _queued(
    state: Any, job: dict[str, Any], audio: bytes | None, model: str, params: Any, to: Any
) -> Response:
    """A ``callback`` request: the job queued in the job store (its audio inside it), the
    ``request_id`` answered at once; Deepgram's response is sent to the callback when the
    job ends (handler.faces.webhooks, handler.faces.deepgram.response)."""
    if audio is not None:
        job["audio_base64"] = base64.b64encode(audio).decode()
    sha = hashlib.sha256(audio).hexdigest() if audio else ""
    url, method = to
    spec = webhooks.target(
        url, "deepgram", method=method, query=str(params), model=model, sha256=sha
    )
    try:
        rec = await call_store(state.jobs, "submit", job, len(job.get("audio_base64", "")), spec)
    except StoreFull:
        return error(429, "too many jobs held here; retry later", "TOO_MANY_REQUESTS")
    except BrokerDown as exc:
        return error(503, exc.reason or BROKER_GONE, "NOT_READY")
    return JSONResponse({"request_id": rec.id})


async def listen(state: Any, request: Request) -> Response:
    """``POST /v1/listen`` (``state``: a handler.faces.http_server.ServerState)."""
    if state.gateway is None and state.worker is None:
        return error(503, "the model is still loading; retry shortly", "NOT_READY")
    try:
        loaded = await loaded_models(state)
    except BrokerDown as exc:
        return error(503, exc.reason or BROKER_GONE, "NOT_READY")
    try:
        job, model = job_input(request.query_params, loaded)
        callback = callback_of(request.query_params)
        audio = await audio_of(request, job)
    except Refused as exc:
        return error(400, str(exc))
    if callback is not None:
        return await _queued(state, job, audio, model, request.query_params, callback)
    if state.gateway is not None:  # a consumer runs it
        result = await state.gateway.result(job, request.is_disconnected, audio)
    else:
        worker = state.worker
        result = await run_admitted(
            state,
            request,
            lambda cancel: run_job(job, worker, job_id="deepgram", cancel=cancel, audio=audio),
            lambda: error(429, "the server is busy; retry later", "TOO_MANY_REQUESTS"),
        )
    if isinstance(result, Response):
        return result
    if "error" in result:
        status, _ = openai_api.error_body(result)
        return error(status, result["error"], result["error_code"])
    # Off the event loop: a 4-hour file's 40,000 words, paragraphs and searches take about
    # 0.3 s to shape here, time the live sessions' sockets would wait.
    sha = hashlib.sha256(audio).hexdigest() if audio else ""
    body = await run_in_threadpool(answer, result, model, request.query_params, sha)
    return JSONResponse(body)
