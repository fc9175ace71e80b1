"""A job's ``webhook``: its status object POSTed when the job ends, as RunPod does.

Tried 3 times in all, ``WHISPER_WEBHOOK_RETRY_S`` (10 s) apart, until it answers 2xx;
through the same guard as audio URLs (handler.audio.netpost: no private address unless
``WHISPER_ALLOW_PRIVATE_URLS``). With ``WHISPER_WEBHOOK_SECRET`` set, each POST carries
``X-Whisper-Timestamp`` (Unix seconds) and ``X-Whisper-Signature: sha256=<hex>``, the
HMAC-SHA256 of ``"<timestamp>.<body>"`` with the secret, so the receiver can tell the
worker's calls from anyone's and refuse replays. The job's status then says how it went
(``webhook``: ``delivered`` or ``failed``, the tries). The URL is never logged.

A face may ask for its own call (``target``): AssemblyAI's is ``{"transcript_id",
"status"}`` with the header its caller named (``webhook_auth_header_name`` and
``_value``); Deepgram's ``callback`` is its whole response (or its error body), POSTed or
PUT; the job then keeps that request, as JSON, where RunPod's keep the URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from handler.audio.netpost import post_json
from handler.errors import WorkerError
from handler.settings import Settings

log = logging.getLogger(__name__)

TRIES = 3
DELIVERIES_AT_ONCE = 32
"""Deliveries under way at once, each on its thread for its tries (a try waits up to 10 s
for an answer). With 4, eight jobs whose receiver accepts and never answers held every
thread for 30 s and the next job's webhook waited behind them (measured: 28 to 56 s)."""
_POOL = ThreadPoolExecutor(max_workers=DELIVERIES_AT_ONCE, thread_name_prefix="webhook")
_pending = 0
_idle = threading.Condition()


class Ended(Protocol):
    id: str
    webhook: str | None
    webhook_report: dict[str, Any] | None

    def status_object(self) -> dict[str, Any]: ...


def signed_headers(body: bytes, secret: str, now: float | None = None) -> dict[str, str]:
    stamp = str(int(time.time() if now is None else now))
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"X-Whisper-Timestamp": stamp, "X-Whisper-Signature": f"sha256={mac}"}


def target(url: str, shape: str, headers: dict[str, str] | None = None, **kept: Any) -> str:
    """A job's ``webhook`` for a face's own call: ``shape`` (``assemblyai``, ``deepgram``)
    says what is sent to ``url``, with ``headers``; ``kept``: what the shape needs (the
    method, Deepgram's query)."""
    return json.dumps({"url": url, "shape": shape, "headers": headers or {}, **kept})


Call = tuple[str, bytes, dict[str, str], str]
"""(the URL, the body, the caller's headers, the method) of a webhook."""


def _call(rec: Ended) -> Call:
    assert rec.webhook is not None
    status = rec.status_object()
    if not rec.webhook.startswith("{"):
        return rec.webhook, json.dumps(status, ensure_ascii=False).encode(), {}, "POST"
    spec = json.loads(rec.webhook)
    url, headers = str(spec["url"]), dict(spec.get("headers") or {})
    if spec.get("shape") == "deepgram":
        from handler.faces.deepgram.response import callback_body

        return url, callback_body(rec.id, status, spec), headers, str(spec.get("method", "POST"))
    ended = "completed" if status.get("status") == "COMPLETED" else "error"
    body = {"transcript_id": rec.id, "status": ended}  # AssemblyAI's
    return url, json.dumps(body).encode(), headers, "POST"


def deliver(rec: Ended, settings: Settings, stop: threading.Event | None = None) -> None:
    """Post in the background; ``rec.webhook_report`` says how it went. The body is made
    there too (Deepgram's whole response for a long file takes a while to shape)."""
    rec.webhook_report = {"status": "pending", "tries": 0}
    global _pending
    with _idle:
        _pending += 1
    _POOL.submit(_counted, rec, settings, stop or threading.Event())


def wait_idle(timeout: float) -> bool:
    """Until no delivery is under way (a consumer about to exit); False on timeout."""
    with _idle:
        return _idle.wait_for(lambda: _pending == 0, timeout)


def _counted(rec: Ended, settings: Settings, stop: threading.Event) -> None:
    global _pending
    try:
        _send(rec, _call(rec), settings, stop)
    except Exception:
        log.exception("job %s: its webhook could not be made", rec.id)
        rec.webhook_report = {"status": "failed", "tries": 0, "last": "INTERNAL"}
    finally:
        with _idle:
            _pending -= 1
            _idle.notify_all()


def _send(rec: Ended, call: Call, settings: Settings, stop: threading.Event) -> None:
    url, body, own, method = call
    secret = settings.webhook_secret
    last = ""
    for n in range(1, TRIES + 1):
        headers = signed_headers(body, secret.get_secret_value()) if secret else {}
        try:
            status = post_json(url, body, settings, headers={**own, **headers}, method=method)
            last = f"HTTP {status}"
            if 200 <= status < 300:
                rec.webhook_report = {"status": "delivered", "tries": n}
                return
        except WorkerError as exc:
            last = exc.code.value
        rec.webhook_report = {"status": "pending", "tries": n, "last": last}
        if n < TRIES and stop.wait(settings.webhook_retry_s):
            break
    log.warning("job %s: its webhook failed %d times (last: %s)", rec.id, TRIES, last)
    rec.webhook_report = {"status": "failed", "tries": TRIES, "last": last}
