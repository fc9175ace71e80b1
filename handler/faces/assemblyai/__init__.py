"""AssemblyAI's pre-recorded API, for the clients that speak it (AssemblyAI's SDKs with their
``base_url`` set to this server, anything written against ``api.assemblyai.com``):

- ``POST /v2/upload``: the audio as the body; ``{"upload_url"}``, kept
  ``WHISPER_RESULT_TTL_S``;
- ``POST /v2/transcript``: a transcript request (handler.faces.assemblyai.request), queued
  at once as a job of RunPod's job API (the server's own engine, or the broker's
  consumers on a gateway) and answered with the transcript, ``queued``;
- ``GET /v2/transcript/{id}``: ``queued``, ``processing``, ``completed`` (text, words,
  utterances with ``speaker_labels``, language, duration) or ``error`` with the reason;
- ``GET /v2/transcript``: the transcripts still held, newest first (``limit``,
  ``status``, ``created_on``, ``before_id``, ``after_id``; pages linked);
- ``GET /v2/transcript/{id}/sentences``, ``/paragraphs``, ``/srt``, ``/vtt``
  (``chars_per_caption``), ``/word-search`` (``words``); ``DELETE /v2/transcript/{id}``
  cancels a job not ended and forgets the transcript;
- ``webhook_url``: AssemblyAI's call (``{"transcript_id", "status"}``, with the header the
  request named) when the transcript ends, as every job's webhook is delivered.

The key (``WHISPER_API_KEY``) is taken as AssemblyAI's clients send it,
``Authorization: <key>`` (or ``Bearer <key>``). Errors are AssemblyAI's ``{"error": ...}``.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse

from handler.faces.admission import loaded_models
from handler.faces.assemblyai import records, shape
from handler.faces.assemblyai import request as aai_request
from handler.faces.assemblyai.live import AssemblyAISession
from handler.faces.assemblyai.request import Refused, job_for, webhook_of
from handler.faces.broker.gateway import BROKER_GONE, BrokerDown
from handler.faces.jobs import StoreFull, call_store

UPLOAD_PATH = "/v2/upload/"
NOT_FOUND = "Transcript lookup error, transcript id not found"
LIST_SCAN = 1000
"""Transcripts looked at, newest first, for one page of ``GET /v2/transcript``."""


def error(status: int, message: str) -> JSONResponse:
    """AssemblyAI's error body."""
    headers = {"Retry-After": "2"} if status in (429, 503) else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class AssemblyAI:
    """The routes' work over ``state`` (a handler.faces.http_server.ServerState)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        settings, gateway = state.settings, state.gateway  # set before the routes are made
        self.uploads: records.Memory | records.InRedis
        self.transcripts: records.Memory | records.InRedis
        if gateway is not None:
            self.uploads = self.transcripts = records.InRedis(gateway.store.r, settings)
        else:
            # Two stores here: an upload never pushes out a transcript's request.
            self.uploads, self.transcripts = records.Memory(settings), records.Memory(settings)

    async def guarded(self, owner: Any, method: str, *args: Any) -> Any:
        """As ``call``, the store's refusals as AssemblyAI's errors."""
        try:
            return await call_store(owner, method, *args)
        except (StoreFull, records.Full):
            return error(429, "too many jobs or uploads held here; retry later")
        except BrokerDown as exc:
            return error(503, exc.reason or BROKER_GONE)

    async def upload(self, request: Request) -> Response:
        body = await request.body()
        if not body:
            return error(400, "the upload is empty: send the audio file as the body")
        token = uuid.uuid4().hex
        encoded = base64.b64encode(body).decode()
        stored = await self.guarded(self.uploads, "put", "upload:" + token, encoded)
        if isinstance(stored, Response):
            return stored
        return JSONResponse(
            {"upload_url": f"{str(request.base_url).rstrip('/')}{UPLOAD_PATH}{token}"}
        )

    async def create(self, request: Request) -> Response:
        if self.state.gateway is None and self.state.worker is None:
            return error(503, "the model is still loading; retry shortly")
        try:
            body = json.loads(await request.body() or b"null")
        except (ValueError, RecursionError):
            return error(400, "the body is not JSON (or nests too deeply)")
        try:
            loaded = await loaded_models(self.state)
            job, echo = job_for(body, loaded)
            webhook = webhook_of(body)
        except Refused as exc:
            return error(400, str(exc))
        except BrokerDown as exc:
            return error(503, exc.reason or BROKER_GONE)
        audio = await self.audio(echo["audio_url"], job)
        if isinstance(audio, Response):
            return audio
        size = len(job.get("audio_base64", ""))
        rec = await self.guarded(self.state.jobs, "submit", job, size, webhook)
        if isinstance(rec, Response):
            return rec
        echo["speech_model_used"] = job.get("model") or (loaded[0] if loaded else "whisper")
        echo["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        kept = await self.guarded(self.transcripts, "put", "transcript:" + rec.id, json.dumps(echo))
        if isinstance(kept, Response):
            await call_store(self.state.jobs, "cancel", rec)
            return kept
        return JSONResponse(shape.transcript(rec.id, rec.status_object(), echo))

    async def audio(self, url: str, job: dict[str, Any]) -> Response | None:
        """Put the audio in ``job``: an upload's bytes, else the URL to fetch."""
        try:
            parts = urlsplit(url)
        except ValueError:  # "http://[::1": not a URL (urlsplit raised, a 500 before)
            return error(400, "audio_url: not a valid URL")
        if parts.path.startswith(UPLOAD_PATH):
            token = parts.path[len(UPLOAD_PATH) :]
            data = await self.guarded(self.uploads, "get", "upload:" + token)
            if isinstance(data, Response):
                return data
            if data is None:
                return error(
                    400, "audio_url: this upload is not held here (expired?); upload again"
                )
            job["audio_base64"] = data
            return None
        job["audio_url"] = url
        return None

    async def listing(self, request: Request) -> Response:
        """``GET /v2/transcript``: the transcripts still held, newest first, ``limit`` of
        them (1-200, default 10), of one ``status`` and ``created_on`` (YYYY-MM-DD) if asked,
        older than ``before_id`` or newer than ``after_id``; ``page_details`` links the
        older page (``prev_url``) and the newer (``next_url``), as AssemblyAI's do."""
        q = request.query_params
        limit = int(q["limit"]) if q.get("limit", "").isdigit() else 10
        status, day = q.get("status"), q.get("created_on")
        if not 1 <= limit <= 200 or status not in (None, *set(shape.STATUS.values())):
            return error(400, "limit: 1 to 200; status: queued, processing, completed or error")
        kept = await self.guarded(self.transcripts, "many", "transcript:")
        if isinstance(kept, Response):
            return kept
        echoes = {i: json.loads(v) for i, v in kept.items()}
        newest = sorted(echoes, key=lambda i: (echoes[i].get("created", ""), i), reverse=True)
        newest = [i for i in newest if not day or echoes[i].get("created", "").startswith(day)]
        older, newer = _around(newest, q.get("before_id"), q.get("after_id"))
        base = str(request.base_url).rstrip("/")
        items: list[dict[str, Any]] = []
        for transcript_id in (older or newer[::-1])[:LIST_SCAN]:
            rec = await self.guarded(self.state.jobs, "get", transcript_id)
            if isinstance(rec, Response):
                return rec
            if rec is None:
                continue
            item = shape.list_item(rec.id, rec.status_object(), echoes[transcript_id], base)
            if status is None or item["status"] == status:
                items.append(item)
            if len(items) == limit:
                break
        if not older:
            items.reverse()  # after_id: the newer ones nearest it, shown newest first
        page = {"limit": limit, "result_count": len(items), "current_url": str(request.url)}
        links = _page_links(request, items, newest, limit)
        return JSONResponse({"page_details": {**page, **links}, "transcripts": items})

    async def lookup(self, transcript_id: str) -> tuple[Any, dict[str, Any]] | Response:
        """The job's record and the request's echo (``{}`` once the echo has expired: a job
        that waited long, whose result is still held), or AssemblyAI's 404."""
        if len(transcript_id) > 64:
            return error(404, NOT_FOUND)
        rec = await self.guarded(self.state.jobs, "get", transcript_id)
        if isinstance(rec, Response):
            return rec
        if rec is None:
            return error(404, NOT_FOUND)
        kept = await self.guarded(self.transcripts, "get", "transcript:" + transcript_id)
        if isinstance(kept, Response):
            return kept
        return rec, (json.loads(kept) if kept else {})

    async def get(self, transcript_id: str) -> Response:
        found = await self.lookup(transcript_id)
        if isinstance(found, Response):
            return found
        rec, echo = found
        return JSONResponse(shape.transcript(rec.id, rec.status_object(), echo))

    async def delete(self, transcript_id: str) -> Response:
        found = await self.lookup(transcript_id)
        if isinstance(found, Response):
            return found
        rec, echo = found
        deleted = await self.guarded(self.state.jobs, "delete", rec)
        if isinstance(deleted, Response):
            return deleted
        if not deleted:
            return error(400, "Transcript is not completed: it can be deleted once it ends")
        gone = await self.guarded(self.transcripts, "forget", "transcript:" + transcript_id)
        if isinstance(gone, Response):
            return gone
        obj = shape.transcript(rec.id, {"status": "COMPLETED"}, echo)
        obj.update(text="Deleted by user.", words=[], audio_url="http://deleted_by_user")
        return JSONResponse(obj)

    async def completed(self, transcript_id: str) -> tuple[dict[str, Any], Any] | Response:
        """A completed transcript's result and echo, or the error saying why not."""
        found = await self.lookup(transcript_id)
        if isinstance(found, Response):
            return found
        rec, echo = found
        status = rec.status_object()
        if status["status"] != "COMPLETED":
            state = shape.STATUS.get(status["status"], "queued")
            return error(400, f"Transcript is not completed (its status: {state})")
        return status.get("output") or {}, echo

    async def parts(self, transcript_id: str, kind: str) -> Response:
        done = await self.completed(transcript_id)
        if isinstance(done, Response):
            return done
        result, echo = done
        obj = shape.transcript(transcript_id, {"status": "COMPLETED", "output": result}, echo)
        cut = shape.sentences if kind == "sentences" else shape.paragraphs
        return JSONResponse(
            {
                kind: cut(obj["words"]),
                "id": transcript_id,
                "confidence": obj["confidence"],
                "audio_duration": obj["audio_duration"],
            }
        )

    async def search(self, transcript_id: str, request: Request) -> Response:
        """``GET /v2/transcript/{id}/word-search?words=a,b c``."""
        try:
            terms = shape.search_terms(request.query_params.get("words"))
        except ValueError as exc:
            return error(400, str(exc))
        done = await self.completed(transcript_id)
        if isinstance(done, Response):
            return done
        result, echo = done
        obj = shape.transcript(transcript_id, {"status": "COMPLETED", "output": result}, echo)
        return JSONResponse({"id": transcript_id, **shape.word_search(obj["words"], terms)})

    async def subtitles(self, transcript_id: str, kind: str, request: Request) -> Response:
        chars = request.query_params.get("chars_per_caption")
        if chars is not None and (not chars.isdigit() or not 10 <= int(chars) <= 200):
            return error(400, "chars_per_caption: a whole number from 10 to 200")
        done = await self.completed(transcript_id)
        if isinstance(done, Response):
            return done
        result, echo = done
        spelling = aai_request.spelling(echo.get("custom_spelling"))
        if echo.get("redact_pii"):
            result = shape.hashed(result)
        text = shape.subtitles(result, kind, None if chars is None else int(chars), spelling)
        return PlainTextResponse(text, media_type="text/vtt" if kind == "vtt" else "text/plain")


def add_routes(app: FastAPI, state: Any) -> None:
    """AssemblyAI's ``/v2/upload`` and ``/v2/transcript`` routes, and its streaming
    ``/v3/ws``, on ``app``."""
    from handler.faces.realtime import serve_on

    api = AssemblyAI(state)

    @app.websocket("/v3/ws")
    async def stream(ws: WebSocket) -> None:
        await serve_on(ws, state, AssemblyAISession)

    app.add_api_route("/v2/upload", api.upload, methods=["POST"])
    app.add_api_route("/v2/transcript", api.create, methods=["POST"])
    app.add_api_route("/v2/transcript", api.listing, methods=["GET"])
    app.add_api_route("/v2/transcript/{transcript_id}", api.get, methods=["GET"])
    app.add_api_route("/v2/transcript/{transcript_id}", api.delete, methods=["DELETE"])
    app.add_api_route("/v2/transcript/{transcript_id}/word-search", api.search, methods=["GET"])
    for kind in ("sentences", "paragraphs"):
        app.add_api_route(
            f"/v2/transcript/{{transcript_id}}/{kind}", _parts_route(api, kind), methods=["GET"]
        )
    for kind in ("srt", "vtt"):
        app.add_api_route(
            f"/v2/transcript/{{transcript_id}}/{kind}", _subtitles_route(api, kind), methods=["GET"]
        )


def _parts_route(api: AssemblyAI, kind: str) -> Any:
    async def route(transcript_id: str) -> Response:
        return await api.parts(transcript_id, kind)

    return route


def _subtitles_route(api: AssemblyAI, kind: str) -> Any:
    async def route(transcript_id: str, request: Request) -> Response:
        return await api.subtitles(transcript_id, kind, request)

    return route


def _around(
    newest: list[str], before_id: str | None, after_id: str | None
) -> tuple[list[str], list[str]]:
    """(the ids to list from, newest first; or none) and (with ``after_id``: the ids newer
    than it, newest first): AssemblyAI's ``before_id`` and ``after_id``."""
    if after_id is not None:
        at = newest.index(after_id) if after_id in newest else len(newest)
        return [], newest[:at]
    if before_id is not None:
        return (newest[newest.index(before_id) + 1 :] if before_id in newest else []), []
    return newest, []


def _page_links(
    request: Request, items: list[dict[str, Any]], newest: list[str], limit: int
) -> dict[str, str | None]:
    """``prev_url`` (older: before the page's last) and ``next_url`` (newer: after its
    first), each only when such transcripts are held."""
    if not items:
        return {"prev_url": None, "next_url": None}
    first, last = newest.index(items[0]["id"]), newest.index(items[-1]["id"])
    keep = {
        k: v for k, v in request.query_params.items() if k not in ("before_id", "after_id", "limit")
    }

    def url(**more: str) -> str:
        return str(request.url.replace_query_params(**keep, limit=str(limit), **more))

    return {
        "prev_url": url(before_id=items[-1]["id"]) if last + 1 < len(newest) else None,
        "next_url": url(after_id=items[0]["id"]) if first > 0 else None,
    }
