"""A real threaded HTTP(S) server on 127.0.0.1 for tests, with per-path routes and counters.

Usage::

    with LocalServer() as srv:
        srv.route("/ok", lambda h: respond(h, 200, b"hello"))
        requests.get(srv.url("/ok"))
        assert srv.hits["/ok"] == 1 and srv.connections == 1

A route handler receives the ``BaseHTTPRequestHandler`` and writes the response itself
(``respond`` covers the simple case). Handlers that wait or drip must use
``srv.stop_event.wait(...)`` instead of ``time.sleep`` so that ``stop()`` ends them. Each
connection serves one request (``Connection: close``) so counts stay easy to reason about.
"""

from __future__ import annotations

import collections
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Handler = Callable[[BaseHTTPRequestHandler], None]


def respond(
    h: BaseHTTPRequestHandler,
    status: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> None:
    """Send a complete response with a correct Content-Length (unless headers set one)."""
    h.send_response(status)
    headers = dict(headers or {})
    headers.setdefault("Content-Length", str(len(body)))
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()
    if body and h.command != "HEAD":
        h.wfile.write(body)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _dispatch(self) -> None:
        local = self.server.local
        path = urlsplit(self.path).path
        local._record(self, path)
        self.close_connection = True
        handler = local.find(path)
        try:
            if handler is None:
                respond(self, 404, b"no route\n")
            else:
                handler(self)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass  # the client went away: normal in fault tests

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # keep pytest output clean; the counters are the record


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    local: LocalServer

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        self.local._count_connection()
        super().process_request(request, client_address)


class LocalServer:
    """ThreadingHTTPServer on 127.0.0.1 (port 0), optional TLS, routes and counters."""

    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.routes: dict[str, Handler] = {}
        self.hits: collections.Counter[str] = collections.Counter()
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self.connections = 0
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._httpd = _Server((host, 0), _RequestHandler, bind_and_activate=True)
        self._httpd.local = self
        if tls is not None:
            # Handshake lazily in the handler thread, so a silent client cannot stall accept().
            self._httpd.socket = tls.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self._httpd.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self.base_url = f"{self.scheme}://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def route(self, path: str, handler: Handler) -> None:
        """Serve ``path`` (exact, or a prefix when it ends with ``*``) with ``handler``."""
        self.routes[path] = handler

    def find(self, path: str) -> Handler | None:
        if path in self.routes:
            return self.routes[path]
        for pattern, handler in self.routes.items():
            if pattern.endswith("*") and path.startswith(pattern[:-1]):
                return handler
        return None

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"{self.scheme}://{host or '127.0.0.1'}:{self.port}{path}"

    def headers_for(self, path: str) -> list[dict[str, str]]:
        with self._lock:
            return [h for _, p, h in self.requests if p == path]

    def _record(self, h: BaseHTTPRequestHandler, path: str) -> None:
        with self._lock:
            self.hits[path] += 1
            self.requests.append((h.command, path, dict(h.headers.items())))

    def _count_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def start(self) -> LocalServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
