"""HTTP front of the emulator: RunPod's worker and client URLs on 127.0.0.1.

Paths are `/v2/{endpoint}/...`. Workers authenticate with the raw API key, clients
with `Bearer <key>`. Every answer is one write with Nagle off, so a round trip costs
no delayed-ACK stall. The rules themselves live in `state.EndpointState`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .config import EmulatorConfig
from .state import EndpointState

log = logging.getLogger(__name__)

WORKER_ROUTES = {"job-take", "job-take-batch", "job-stop", "job-done", "job-stream", "ping"}


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Many workers reconnect at once after a restart; the default backlog of 5 is small.
    request_queue_size = 128

    def __init__(self, config: EmulatorConfig, state: EndpointState) -> None:
        self.config = config
        self.state = state
        self.take_delay_s = config.take_delay_s
        super().__init__(("127.0.0.1", config.port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A worker killed mid-request resets its connection: expected in fault tests, not a
        # traceback on stderr. Anything else is a bug in the emulator: logged with its stack.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            log.debug("connection from %s reset", client_address)
            return
        log.exception("emulator request from %s failed", client_address)


class _PayloadTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload too large: {size} bytes > {limit}")
        self.size = size


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: EmulatorHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        # Request lines carry job ids and query strings: debug level only.
        log.debug("%s %s", self.address_string(), format % args)

    # ---------------------------------------------------------------- plumbing
    def _send(self, status: int, payload: Any = None, *, close: bool = False) -> None:
        self.log_request(status)
        head = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Date: {self.date_time_string()}",
        ]
        body = b""
        if status != 204:
            body = json.dumps(payload if payload is not None else {}).encode()
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        if close:
            head.append("Connection: close")
            self.close_connection = True
        # Headers and body leave in one write (see module docstring).
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def _read_body(self, limit: int) -> bytes:
        size = int(self.headers.get("Content-Length") or 0)
        if size > self.server.config.body_hard_limit:
            raise _PayloadTooLarge(size, limit)
        body = self.rfile.read(size) if size else b""
        if size > limit:
            raise _PayloadTooLarge(size, limit)
        return body

    def _route(self, method: str) -> None:
        parts = urlsplit(self.path)
        segments = [s for s in parts.path.split("/") if s]
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        config = self.server.config
        if len(segments) < 3 or segments[0] != "v2" or segments[1] != config.endpoint_id:
            self._discard_body()
            self._send(404, {"error": "unknown endpoint"})
            return
        action, args = segments[2], segments[3:]
        auth = self.headers.get("Authorization", "")
        if action in WORKER_ROUTES:
            if auth != config.api_key:
                # The SDK prefers an api_key from ~/.runpod/config.toml over
                # RUNPOD_AI_API_KEY; that is the usual cause. Never log the header.
                log.warning("worker request with a wrong key refused (401)")
                self._discard_body()
                self._send(401, {"error": "unauthorized"})
                return
            self._worker(method, action, args, query)
        else:
            if auth != f"Bearer {config.api_key}":
                self._discard_body()
                self._send(401, {"error": "unauthorized"})
                return
            self._client(method, action, args, query)

    def _discard_body(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        if size > self.server.config.body_hard_limit:
            self.close_connection = True
        elif size:
            self.rfile.read(size)

    def do_GET(self) -> None:  # noqa: N802
        self._guarded("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._guarded("POST")

    def _guarded(self, method: str) -> None:
        try:
            self._route(method)
        except _PayloadTooLarge as exc:
            close = exc.size > self.server.config.body_hard_limit
            self._send(413, {"error": str(exc)}, close=close)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ------------------------------------------------------------ worker side
    def _worker(self, method: str, action: str, args: list[str], query: dict[str, str]) -> None:
        state = self.server.state
        config = self.server.config
        expected = "POST" if action in ("job-done", "job-stream") else "GET"
        if method != expected or len(args) != (2 if expected == "POST" else 1):
            self._discard_body()
            self._send(405 if method != expected else 404, {"error": "bad worker request"})
            return
        worker_id = args[0]
        if action in ("job-take", "job-take-batch"):
            if self.server.take_delay_s > 0:
                time.sleep(self.server.take_delay_s)
            batch = action == "job-take-batch"
            size = _int(query.get("batch_size"), 1) if batch else 1
            jobs = state.take(worker_id, max(1, size), config.take_poll_s, batch=batch)
            if not jobs:
                self._send(204)
            else:
                self._send(200, jobs if batch else jobs[0])
        elif action == "job-stop":
            ids = state.stop_poll(worker_id, config.stop_poll_s)
            if ids:
                self._send(200, {"jobsToStop": ids})
            else:
                self._send(204)
        elif action == "ping":
            ids = [i for i in query.get("job_id", "").split(",") if i]
            if query.get("status") == "unhealthy":  # the SDK's fitness check failed
                state.unhealthy(worker_id, query.get("check", ""), query.get("reason", ""))
            state.ping(worker_id, ids)
            self._send(200, {})
        else:
            # Read the whole body whatever its size: an oversized result is a job
            # outcome, not a transport error (up to the hard limit).
            body = self._read_body(config.body_hard_limit)
            if action == "job-done":
                is_stream = query.get("isStream") == "true"
                status, payload = state.job_done(worker_id, args[1], body, is_stream)
            else:
                status, payload = state.job_stream(worker_id, args[1], body)
            self._send(status, payload)

    # ------------------------------------------------------------ client side
    def _client(self, method: str, action: str, args: list[str], query: dict[str, str]) -> None:
        state = self.server.state
        config = self.server.config
        if action in ("run", "runsync") and method == "POST" and not args:
            limit = config.run_payload_limit if action == "run" else config.runsync_payload_limit
            body = self._read_body(limit)
            try:
                request = json.loads(body or b"{}")
            except (ValueError, RecursionError):  # RecursionError: nested past the limit
                self._send(400, {"error": "body is not JSON (or nests too deeply)"})
                return
            if not isinstance(request, dict) or "input" not in request:
                self._send(400, {"error": "missing input"})
                return
            policy = request.get("policy")
            job = state.submit(
                request["input"],
                kind=action,
                webhook=request.get("webhook") if isinstance(request.get("webhook"), str) else None,
                policy=policy if isinstance(policy, dict) else None,
                input_bytes=len(body),
            )
            if action == "run":
                self._send(200, {"id": job.id, "status": "IN_QUEUE"})
                return
            wait_ms = _int(query.get("wait"), config.runsync_default_wait_ms)
            wait_s = min(max(wait_ms, 1000), 300_000) / 1000.0
            self._send(200, state.wait_terminal(job.id, wait_s))
            return
        self._discard_body()
        if action in ("status", "stream") and len(args) == 1:
            if action == "status":
                answer = state.status(args[0])
            else:
                answer = state.take_stream(args[0], config.stream_poll_s)
            if answer:
                self._send(200, answer)
            else:
                self._send(404, {"error": "job not found"})
        elif action in ("cancel", "retry") and len(args) == 1 and method == "POST":
            answer = state.cancel(args[0]) if action == "cancel" else state.retry(args[0])
            if answer is None:
                self._send(404, {"error": "job not found"})
            elif not answer:
                self._send(400, {"error": "only FAILED or TIMED_OUT jobs can be retried"})
            else:
                self._send(200, answer)
        elif action == "health" and not args and method == "GET":
            self._send(200, state.health())
        elif action == "purge-queue" and not args and method == "POST":
            self._send(200, {"removed": state.purge_queue(), "status": "completed"})
        else:
            self._send(404, {"error": "unknown route"})


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
