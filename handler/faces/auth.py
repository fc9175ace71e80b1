"""An optional API key for the HTTP face (``WHISPER_API_KEY``), as vLLM's ``--api-key`` and
speaches' ``API_KEY`` work.

On RunPod the platform authenticates callers, but on Kubernetes, Cloud Run or a laptop the
server is open to whoever reaches its port. With a key set, every route but the health
routes needs ``Authorization: Bearer <key>`` (what the OpenAI SDKs send), compared in
constant time; a WebSocket may instead offer the key as the subprotocol
``openai-insecure-api-key.<key>``, which is how OpenAI's browser clients send it (a browser
cannot set headers on a WebSocket). A refusal is OpenAI's 401 body; on a WebSocket, that
401 when the server can send an HTTP answer to the handshake, else a close with 1008
(policy violation). The key itself is never logged. A live WebSocket also opens with a
short-lived token minted with the key (handler.faces.tokens): offered as a key is, as
Deepgram's browsers offer theirs (the subprotocols ``bearer, <token>``) or as AssemblyAI's
do (``?token=``).

Also here, the other guards every HTTP request passes: the body cap (``BodyLimit``) and
the number of bodies received at once (``ReceiveLimit``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handler.faces import tokens

log = logging.getLogger(__name__)

SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
UNAUTHORIZED = {
    "error": {
        "message": "Incorrect or missing API key: send Authorization: Bearer <key>.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


def presented_keys(scope: Scope) -> list[bytes]:
    """The keys a request offers: the bearer token (or Deepgram's ``Token`` scheme, or
    AssemblyAI's bare key), and on
    a WebSocket the subprotocol (OpenAI's prefixed one, or Deepgram's ``token, <key>``)."""
    keys = []
    for name, value in scope.get("headers") or []:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            keys.append(value[7:].strip())
        elif name == b"authorization" and value[:6].lower() == b"token ":
            keys.append(value[6:].strip())
        elif name == b"authorization" and b" " not in value.strip():
            keys.append(value.strip())  # AssemblyAI's: the key alone
    if scope["type"] == "websocket":
        offered = list(scope.get("subprotocols") or [])
        for i, proto in enumerate(offered):
            if proto.startswith(SUBPROTOCOL_PREFIX):
                keys.append(proto[len(SUBPROTOCOL_PREFIX) :].encode())
            elif proto in ("token", "bearer") and i + 1 < len(offered):
                keys.append(offered[i + 1].encode())
        for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            if name == "token":  # AssemblyAI's browsers: a short-lived token (tokens.py)
                keys.append(value.encode())
    return keys


class ApiKey:
    """ASGI middleware: refuse every request without the key, but those to ``open_paths``."""

    def __init__(self, app: ASGIApp, key: str, open_paths: set[str]) -> None:
        self.app = app
        self.key = key.encode()
        self.open_paths = open_paths

    def allowed(self, scope: Scope) -> bool:
        # Every offered key is compared (constant time each), so timing says nothing. A
        # short-lived token (handler.faces.tokens) opens a live WebSocket, nothing else.
        ok = False
        for offered in presented_keys(scope):
            ok |= hmac.compare_digest(offered, self.key)
            if scope["type"] == "websocket":
                ok |= tokens.valid(self.key.decode(), offered)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        if self.allowed(scope):
            await self.app(scope, receive, send)
            return
        log.info("refused a request without a valid API key (%s)", scope["type"])
        body = json.dumps(UNAUTHORIZED).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "invalid API key"})


class BodyTooLarge(Exception):
    """The request body passed ``max_upload_bytes`` (declared or counted)."""


class BodyLimit:
    """ASGI middleware: refuse a body over the cap by its Content-Length, or count it."""

    def __init__(self, app: ASGIApp, limit: int, refusal: Callable[[], ASGIApp]) -> None:
        self.app = app
        self.limit = limit
        self.refusal = refusal
        """The answer to a body declared over the cap (413 in the face's own shape)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self.refusal()(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge
            return message

        await self.app(scope, counted, send)


class ReceiveLimit:
    """ASGI middleware: at most ``limit`` request bodies being received at once; past it,
    ``refusal()`` at once with the body unread (uvicorn discards the rest as it comes).

    Without it every upload was taken in full, however many came together, each spooled to
    a temporary file and then read into memory; the routes refuse past their queue only
    after the body is in. With ``limit`` the worker's capacity (running plus waiting jobs),
    what bodies hold is bounded by ``limit`` times the body cap. A body's place is freed
    when its last byte has been read, or when its request ends.
    """

    def __init__(self, app: ASGIApp, limit: int, refusal: Callable[[], ASGIApp]) -> None:
        self.app = app
        self.limit = limit
        self.refusal = refusal
        self.receiving = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        sized = headers.get(b"content-length", b"0") not in (b"0", b"")
        if not sized and b"transfer-encoding" not in headers:  # no body: nothing to hold
            await self.app(scope, receive, send)
            return
        if self.receiving >= self.limit:
            await self.refusal()(scope, receive, send)
            return
        self.receiving += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.receiving -= 1

        async def counted() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                release()
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            release()
