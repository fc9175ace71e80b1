"""How a live WebSocket client must take what the server sends it: a deadline on each send.

Found by a probe: a client that sent events and read none of the answers held its live
session for ever (151 s and counting; with WHISPER_REALTIME_MAX_SESSIONS at 1 every other
client got ``session_limit``), and a SIGTERM waited on it. uvicorn's WebSocket protocol
waits for the socket to drain before each send with no deadline, so the session's loop
stopped there, past the reach of its own idle limit; uvicorn's keepalive ping did not end
it either, because its close waits for the same buffer to drain first.

Here a send that waits longer than ``timeout`` seconds for the client to read, or a
keepalive ping left unanswered, aborts the connection: what is still buffered for the
client is dropped, the socket closed, and the session ends as if the client had left
(``on_cut("slow_reader")``). A client that reads, however slowly its answers come, is
never cut; a session with nothing to send is the realtime face's idle limit's business.

Built on uvicorn's sans-I/O websockets protocol (``pause_writing`` / ``resume_writing``
set its ``writable`` event; ``keepalive_timeout`` is its ping deadline), the one uvicorn
itself picks when ``websockets`` is installed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)


class SendGuard(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a send deadline (made by guarded_ws_protocol)."""

    timeout = 20.0
    on_cut: tuple[Callable[[str], None], ...] = ()  # a tuple: a bare function would bind

    async def send(self, message: Any) -> None:
        if not self.writable.is_set():
            try:
                await asyncio.wait_for(self.writable.wait(), self.timeout)
            except asyncio.TimeoutError:
                self._cut()
                raise ClientDisconnected() from None
        await super().send(message)

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()  # writes a close frame, then a close that waits to drain
        if self.transport.get_write_buffer_size():
            self._cut()  # it cannot drain: the client reads nothing

    def _cut(self) -> None:
        if self.disconnected:
            return
        log.info("closed a live connection: its client stopped reading")
        for tell in self.on_cut:
            tell("slow_reader")
        self.transport.abort()  # connection_lost: the session sees the client leave


def guarded_ws_protocol(
    timeout: float, on_cut: Callable[[str], None] | None = None
) -> type[SendGuard]:
    """The protocol class for uvicorn's ``ws=``: a send waits at most ``timeout`` seconds
    for the client to read; ``on_cut("slow_reader")`` is told of each connection cut."""
    told = (on_cut,) if on_cut is not None else ()
    return type("GuardedSend", (SendGuard,), {"timeout": timeout, "on_cut": told})
