"""Deepgram's API, for the clients and voice-agent frameworks that speak it (Deepgram's SDKs,
Pipecat's and LiveKit's Deepgram plugins, anything pointed at a self-hosted Deepgram):
``/v1/listen`` as a WebSocket (live audio: ``live``) and as a POST (a file:
``prerecorded``).

- ``shape``: Deepgram's words, alternatives and metadata from a job's result;
- ``live``: the live protocol over a session of handler.faces.realtime;
- ``prerecorded``: the pre-recorded API over the same job pipeline as every face.

The key (``WHISPER_API_KEY``) is taken as Deepgram's clients send it: ``Authorization:
Token <key>`` (or ``Bearer``), or in a browser the subprotocols ``token, <key>``
(handler.faces.auth).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response, WebSocket

from handler.faces.deepgram.flux import FluxSession
from handler.faces.deepgram.live import DeepgramSession
from handler.faces.deepgram.prerecorded import listen as listen_to_a_file


def add_routes(app: FastAPI, state: Any) -> None:
    """Deepgram's ``/v1/listen`` on ``app`` (a handler.faces.http_server.ServerState)."""
    from handler.faces.realtime import serve_on

    @app.post("/v1/listen")
    async def transcribe(request: Request) -> Response:
        return await listen_to_a_file(state, request)

    @app.websocket("/v1/listen")
    async def listen(ws: WebSocket) -> None:
        await serve_on(ws, state, DeepgramSession)

    @app.websocket("/v2/listen")
    async def flux(ws: WebSocket) -> None:
        await serve_on(ws, state, FluxSession)
