"""Short-lived tokens for live audio from a browser, so that a web page never holds the
worker's ``WHISPER_API_KEY``: the page's server asks for one with the key, as each vendor's
clients do, and hands it to the page, which opens its live WebSocket with it.

- OpenAI: ``POST /v1/realtime/client_secrets`` -> ``{"value", "expires_at", "session"}``,
  or the Realtime beta's ``POST /v1/realtime/transcription_sessions`` -> the session with
  ``client_secret`` (the browser offers ``openai-insecure-api-key.<value>``, or sends it
  as a bearer). The session given is answered back, not bound to the token: the browser
  sends its ``session.update`` as it would anyway;
- Deepgram: ``POST /v1/auth/grant`` (``{"ttl_seconds"}``) -> ``{"access_token",
  "expires_in"}`` (the browser offers the subprotocols ``bearer, <token>``);
- AssemblyAI: ``GET /v3/token?expires_in_seconds=N`` -> ``{"token"}`` (the browser adds
  ``?token=<token>`` to ``/v3/ws``).

A token is ``wt_<expiry>.<HMAC-SHA256>``, signed with a key derived from the API key, so
any replica that holds the same key checks it with no shared state. It opens live
WebSockets only, until it expires (at most ``MAX_TTL_S``): a token taken from a page can
never call the file routes or the job API, nor mint another token. Each mint route needs
the API key itself. Without ``WHISPER_API_KEY`` the routes still answer (a client's code
runs unchanged), with tokens that nothing needs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

PREFIX = "wt_"
MAX_TTL_S = 7200
"""The longest a token lives: two hours, OpenAI's longest client secret."""
_UNKEYED = secrets.token_bytes(32)
"""The signing key without an API key (tokens nothing needs)."""


def _signing_key(api_key: str | None) -> bytes:
    if api_key is None:
        return _UNKEYED
    return hmac.new(api_key.encode(), b"whisper-worker live tokens", hashlib.sha256).digest()


def mint(api_key: str | None, ttl_s: float, now: float | None = None) -> tuple[str, int]:
    """(a token for live WebSockets, its expiry in Unix seconds)."""
    expires = int((time.time() if now is None else now) + max(1.0, min(ttl_s, MAX_TTL_S)))
    stamp = str(expires)
    mac = hmac.new(_signing_key(api_key), stamp.encode(), hashlib.sha256).hexdigest()
    return f"{PREFIX}{stamp}.{mac}", expires


def valid(api_key: str | None, token: bytes | str, now: float | None = None) -> bool:
    """Whether ``token`` was minted with this API key and has not expired."""
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    if not text.startswith(PREFIX) or len(text) > 200:
        return False
    stamp, _, mac = text[len(PREFIX) :].partition(".")
    if not stamp.isdigit():
        return False
    want = hmac.new(_signing_key(api_key), stamp.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac.encode(), want.encode()):
        return False
    return int(stamp) > (time.time() if now is None else now)


SECRET_IN_QUERY = re.compile(r"(?i)\b((?:access_)?token|(?:api_)?key)=[^&\s\"]*")


class RedactQuery(logging.Filter):
    """uvicorn logs each WebSocket's path with its query ("WebSocket /v3/ws?...&token=...
    [accepted]"): a token there (AssemblyAI's browsers send it so) is written as
    ``token=<redacted>``, as any ``key=`` would be."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
            isinstance(a, str) and "=" in a for a in record.args
        ):
            record.args = tuple(
                SECRET_IN_QUERY.sub(r"\1=<redacted>", a) if isinstance(a, str) else a
                for a in record.args
            )
        return True


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return {"": None}  # refused below as not an object of the fields asked
    return body if isinstance(body, dict) else {"": None}


def _seconds(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        return None
    return int(value)


def _openai_error(message: str, param: str | None = None) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return JSONResponse({"error": error}, status_code=400)


def openai_secret(body: dict[str, Any], api_key: str | None) -> JSONResponse:
    """``POST /v1/realtime/client_secrets``: ``{"value", "expires_at", "session"}``."""
    after = body.get("expires_after") or {}
    seconds = (
        _seconds(after.get("seconds", 600), 10, MAX_TTL_S) if isinstance(after, dict) else None
    )
    if seconds is None or "" in body:
        return _openai_error(
            f"expires_after.seconds: a number from 10 to {MAX_TTL_S}", "expires_after"
        )
    value, expires = mint(api_key, seconds)
    given = body.get("session")
    session = given if isinstance(given, dict) else {"type": "transcription"}
    return JSONResponse({"value": value, "expires_at": expires, "session": session})


def openai_beta_session(body: dict[str, Any], api_key: str | None) -> JSONResponse:
    """The Realtime beta's ``POST /v1/realtime/transcription_sessions``: the session's
    config, and a key that lasts a minute."""
    if "" in body:
        return _openai_error("the body is a transcription session's config (a JSON object)")
    value, expires = mint(api_key, 60)
    session = {**body, "object": "realtime.transcription_session"}
    session["client_secret"] = {"value": value, "expires_at": expires}
    return JSONResponse(session)


def deepgram_grant(body: dict[str, Any], api_key: str | None) -> JSONResponse:
    """``POST /v1/auth/grant``: ``{"access_token", "expires_in"}``."""
    ttl = _seconds(body.get("ttl_seconds", 30), 1, 3600)
    if ttl is None or "" in body:
        err = {"err_code": "Bad Request", "err_msg": "ttl_seconds: a number from 1 to 3600"}
        return JSONResponse(err, status_code=400)
    token, _ = mint(api_key, ttl)
    return JSONResponse({"access_token": token, "expires_in": ttl})


def add_routes(app: FastAPI, api_key: str | None) -> None:
    """The three vendors' routes that mint a token (each needs the API key)."""
    for path, make in (
        ("/v1/realtime/client_secrets", openai_secret),
        ("/v1/realtime/transcription_sessions", openai_beta_session),
        ("/v1/auth/grant", deepgram_grant),
    ):
        app.add_api_route(path, _posted(make, api_key), methods=["POST"])

    @app.get("/v3/token")
    async def assemblyai_token(request: Request) -> JSONResponse:
        asked = request.query_params.get("expires_in_seconds", "")
        ttl = int(asked) if asked.isdigit() and 1 <= int(asked) <= 600 else None
        if ttl is None:
            message = "expires_in_seconds: a whole number from 1 to 600"
            return JSONResponse({"error": message}, status_code=400)
        token, _ = mint(api_key, ttl)
        return JSONResponse({"token": token})


def _posted(make: Any, api_key: str | None) -> Any:
    async def route(request: Request) -> JSONResponse:
        return make(_body(await request.body()), api_key)

    return route
