"""How each HTTP request may arrive and its answer leave: a deadline against slow senders
(Slowloris), a cap on the size of its request line and headers and on pipelined requests,
and a deadline against clients that do not read their answers.

uvicorn has none (its issue 157, open since 2018): ``timeout_keep_alive`` only covers the
quiet between requests and is reset by every byte, so a connection that sends half a
request line, or trickles one byte now and then, was held for ever; hundreds of them took
as many sockets (measured: 300 half-sent requests all still open after 40 s). ASGI
middleware cannot help: it runs once the headers are in.

The rule is Apache's mod_reqtimeout default (``header=20-40,MinRate=500
body=20,MinRate=500``): the headers must arrive within ``timeout`` seconds of the
connection (or of the request's first byte on a kept-alive one), extended by one second
for every ``min_rate`` bytes received, to twice ``timeout`` at most; the body within
``timeout`` of the headers, extended the same way with no ceiling. A real upload, however
large, keeps extending its own deadline; a sender slower than ``min_rate`` bytes a second
(500 by default: 4 kbit/s, far below any uplink that can send audio) is disconnected.
Nothing applies while the response is written or once a WebSocket is upgraded (the
realtime face keeps its own idle limits, and send_guard.py cuts a live client that stops
reading).

The request line and headers may take ``MAX_HEADER_BYTES`` (64 KiB; nginx's default is
32 KiB, Node's 16 KiB); past it the answer is 431 and the connection closes. httptools has
no cap of its own: one connection's endless header lines grew the worker by 200 MB in
0.4 s (measured), and a single endless header line is buffered whole by the parser before
uvicorn sees it, so the cap counts the bytes as they arrive.

A client may pipeline requests, but at most ``MAX_PIPELINED`` may wait behind the one being
answered; past that the connection is cut. uvicorn parses every request a read brings (up
to 256 KiB) and queues each: a client that sent 7 MB of ``GET /v1/models`` and read
nothing grew the worker by 470 MB (measured; 5 such connections, 2.3 GB), and the worker
then ignored SIGTERM, waiting on them. No HTTP client or proxy pipelines that deep.

And the answer must be taken: once the server's writes wait on a client (the transport's
buffer over its high-water mark) for ``timeout`` seconds during which it took less than
``min_rate`` bytes a second, the connection is aborted ("slow_reader"): a client that reads
nothing held its connection, its task and the answer in memory for ever.

Built on uvicorn's httptools protocol (its callbacks ``on_headers_complete`` and
``on_message_complete``), the parser uvicorn itself prefers when httptools is installed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


MAX_HEADER_BYTES = 64 * 1024
MAX_PIPELINED = 32
TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
TOO_LARGE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)


class ReceiveGuard(HttpToolsProtocol):
    """uvicorn's httptools protocol with a receive deadline and a header cap (made by
    guarded_protocol)."""

    timeout = 20.0
    min_rate = 500.0
    on_cut: tuple[Callable[[str], None], ...] = ()  # a tuple: a bare function would bind

    _phase: str | None = None
    _started = 0.0
    _received = 0
    _timer: asyncio.TimerHandle | None = None
    _stall_timer: asyncio.TimerHandle | None = None
    _write_waiting = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._begin("headers")

    def data_received(self, data: bytes) -> None:
        if self._phase is not None:  # credited to the phase the bytes arrive in
            self._received += len(data)
            self._arm()
        super().data_received(data)  # may complete the headers or the request
        if self._phase == "headers" and self._received > MAX_HEADER_BYTES:
            if not self.transport.is_closing():
                self._refuse("headers_too_large", TOO_LARGE_431)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is None:  # a kept-alive connection's next request
            self._begin("headers")

    def on_headers_complete(self) -> None:
        if self.transport.is_closing():
            return  # cut: the rest of what this read brought is not queued
        super().on_headers_complete()
        if len(self.pipeline) > MAX_PIPELINED:
            self._refuse("pipeline_too_long", b"", abort=True)
        elif self._phase == "headers":
            self._begin("body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._end()

    def handle_websocket_upgrade(self) -> None:
        self._end()
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self._unstall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_waiting = self.transport.get_write_buffer_size()
        self._stall_timer = self.loop.call_later(self.timeout, self._stalled)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        """Writes have waited ``timeout``: cut the client unless it took ``min_rate`` bytes
        a second of what waits meanwhile (a slow reader, not a stalled one)."""
        waiting = self.transport.get_write_buffer_size()
        if self._write_waiting - waiting >= self.min_rate * self.timeout:
            self._write_waiting = waiting
            self._stall_timer = self.loop.call_later(self.timeout, self._stalled)
            return
        self._stall_timer = None
        self._refuse("slow_reader", b"", abort=True)

    def _begin(self, phase: str) -> None:
        self._phase, self._started, self._received = phase, self.loop.time(), 0
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        allowed = self.timeout + self._received / self.min_rate
        if self._phase == "headers":
            allowed = min(allowed, 2 * self.timeout)
        self._timer = self.loop.call_at(self._started + allowed, self._expired)

    def _end(self) -> None:
        self._phase = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        phase, self._phase, self._timer = self._phase, None, None
        if phase is None or self.transport is None or self.transport.is_closing():
            return
        # (while headers arrive, self.cycle is still the previous request's, answered)
        answered = phase == "body" and self.cycle is not None and self.cycle.response_started
        self._refuse(f"slow_{phase}", b"" if answered else TIMEOUT_408)

    def _refuse(self, reason: str, answer: bytes, abort: bool = False) -> None:
        """Close the connection (after ``answer``), or ``abort`` it (what waits to be
        written is dropped: a client that reads nothing would hold a close for ever); tell
        on_cut why."""
        self._end()
        log.debug("closed a connection: %s", reason)
        for tell in self.on_cut:
            tell(reason)
        if abort:
            self.transport.abort()
            return
        if answer:
            self.transport.write(answer)
        self.transport.close()


def guarded_protocol(
    timeout: float, min_rate: float, on_cut: Callable[[str], None] | None = None
) -> type[ReceiveGuard]:
    """The protocol class for uvicorn's ``http=``: ``timeout`` and ``min_rate`` as above;
    ``on_cut(reason)`` is told of each connection closed: "slow_headers", "slow_body",
    "headers_too_large", "pipeline_too_long" or "slow_reader"."""
    told = (on_cut,) if on_cut is not None else ()
    attrs = {"timeout": timeout, "min_rate": float(min_rate), "on_cut": told}
    return type("GuardedReceive", (ReceiveGuard,), attrs)
