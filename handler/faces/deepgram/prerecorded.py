"""Deepgram's pre-recorded API: ``POST /v1/listen`` with the audio as the body (any
content type but JSON) or ``{"url": "..."}``, the options in the query, answered with
Deepgram's response (``metadata``, ``results.channels[0].alternatives[0]`` with its
transcript, confidence and words, ``utterances`` when asked).

Options: ``model`` (a model loaded here by name; any other name is the default model),
``language`` (``en``, ``en-US``, ``multi``), ``detect_language`` (the channel then says
``detected_language`` and ``language_confidence``), ``diarize`` (a worker with
``WHISPER_DIARIZATION``: each word's ``speaker``; otherwise refused as a file job is),
``utterances`` (one per segment), ``keywords`` and ``keyterm`` (hotwords),
``multichannel`` (each channel transcribed on its own: one entry of ``results.channels``
per channel, utterances with their ``channel``), ``replace`` and ``search`` (over the
words as written); formatting options are accepted (Whisper punctuates as it
transcribes). ``callback`` is refused with a sentence saying what to use, and the
analyses this worker does not run (``redact``, ``sentiment``, ``summarize``, ...) too.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from handler.faces import openai_api
from handler.faces.admission import loaded_models, run_admitted
from handler.faces.broker.gateway import BROKER_GONE, BrokerDown
from handler.faces.deepgram import shape
from handler.faces.deepgram.query import (
    QueryError,
    flag,
    keywords,
    refuse_unserved,
    replacements,
    searches,
    served_model,
)
from handler.faces.deepgram.shape import whole_words
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
    if params.get("callback"):
        raise Refused("callback is not served here; use /v2/{id}/run with a webhook")
    if params.get("channels") not in (None, "1"):
        raise Refused("channels describes raw audio; send a file with a header (WAV, FLAC, ...)")
    refuse_unserved(params)
    replacements(params)  # checked now: answer() applies them after the job
    searches(params)
    model = params.get("model") or ""
    job: dict[str, Any] = {"output": ["text", "segments", "words"], "word_timestamps": True}
    if model in loaded:
        job["model"] = model
    language = shape.language_of(params.get("language"))
    if language and not flag(params, "detect_language"):
        job["language"] = language
    if flag(params, "diarize"):
        job["diarize"] = True
    if flag(params, "multichannel"):
        job["multichannel"] = True
    if flag(params, "profanity_filter"):
        job["profanity_filter"] = True
    flag(params, "utterances")  # checked now: answer() reads them after the job
    flag(params, "paragraphs")
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


class _Words:
    """A job's words as Deepgram's: whole words, speakers numbered by first word,
    ``replace``'s table applied."""

    def __init__(self, table: dict[str, str], paragraphs: bool) -> None:
        self.table = table
        self.speakers: dict[str, int] = {}
        self.paragraphs = paragraphs
        """``paragraphs=true``: each alternative gets its paragraphs."""

    def speaker(self, w: dict[str, Any]) -> int | None:
        label = w.get("speaker")
        return None if label is None else self.speakers.setdefault(str(label), len(self.speakers))

    def __call__(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        words = [shape.word(w, 0.0, self.speaker(w)) for w in whole_words(raw)]
        return shape.replaced(words, self.table)

    def said(self, text: str, words: list[dict[str, Any]]) -> str:
        """The transcript: the job's text, or with ``replace`` its words as it left them."""
        return " ".join(w["punctuated_word"] for w in words) if self.table else text


def answer(result: dict[str, Any], model: str, params: Any, audio: bytes | None) -> dict[str, Any]:
    """Deepgram's response for a job's result: a channel per channel of a ``multichannel``
    job (one that repeats another has its words), else the one channel."""
    detected = "language" not in params or flag(params, "detect_language")
    whole = {"channel": None, "text": result["text"], "language": result.get("language")}
    whole["language_probability"] = result.get("language_probability")
    heard = result.get("channels") or [whole]
    words_of = _Words(replacements(params), flag(params, "paragraphs"))
    terms = searches(params)
    channels = [_channel(result, entry, words_of, detected, terms) for entry in heard]
    request_id = str(uuid.uuid4())
    meta = shape.metadata(request_id, model, float(result.get("duration", 0.0)))
    meta["sha256"] = hashlib.sha256(audio).hexdigest() if audio else ""
    meta["channels"] = len(channels)
    body: dict[str, Any] = {"metadata": meta, "results": {"channels": channels}}
    if flag(params, "utterances"):
        body["results"]["utterances"] = [
            _utterance(seg, words_of) for seg in result.get("segments", []) if seg["text"].strip()
        ]
    return body


def _channel(
    result: dict[str, Any],
    entry: dict[str, Any],
    words_of: _Words,
    detected: bool,
    terms: list[str],
) -> dict[str, Any]:
    """One of ``results.channels``: its transcript and words (``entry["channel"]`` None:
    the whole result's), ``replace`` applied, ``search``'s hits when asked."""
    index = entry.get("same_as", entry["channel"])
    words = words_of(
        [w for w in result.get("words", []) if index is None or w.get("channel") == index]
    )
    alt = shape.alternative(words_of.said(entry["text"], words), words)
    if words_of.paragraphs:
        alt["paragraphs"] = shape.paragraphs(words)
    channel: dict[str, Any] = {"alternatives": [alt]}
    if detected:
        channel["detected_language"] = entry.get("language")
        channel["language_confidence"] = entry.get("language_probability")
    if terms:
        channel["search"] = shape.search(words, terms)
    return channel


def _utterance(seg: dict[str, Any], words_of: _Words) -> dict[str, Any]:
    words = words_of(seg.get("words") or [])
    alt = shape.alternative(words_of.said(seg["text"].strip(), words), words)
    out = {
        "start": round(float(seg["start"]), 3),
        "end": round(float(seg["end"]), 3),
        "confidence": alt["confidence"],
        "channel": int(seg.get("channel", 0)),
        "transcript": alt["transcript"],
        "words": words,
        "id": str(uuid.uuid4()),
    }
    if words and "speaker" in words[0]:
        out["speaker"] = words[0]["speaker"]
    return out


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
        audio = await audio_of(request, job)
    except Refused as exc:
        return error(400, str(exc))
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
    body = await run_in_threadpool(answer, result, model, request.query_params, audio)
    return JSONResponse(body)
