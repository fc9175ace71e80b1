"""A job's ``webhook``: its status object POSTed when the job ends, as RunPod does.

Tried as the API it speaks tries (:data:`POLICIES`): RunPod's 3 times in all,
``WHISPER_WEBHOOK_RETRY_S`` (10 s) apart, until it answers 2xx; AssemblyAI's 10 times, a
4xx answer ending them (as AssemblyAI's docs say); Deepgram's 10 times, three times that
apart (Deepgram's 30 s);
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
from typing import Any, NamedTuple, Protocol

from handler.audio.netpost import POST_TIMEOUT_S, post_json
from handler.errors import WorkerError
from handler.settings import Settings

log = logging.getLogger(__name__)


class Policy(NamedTuple):
    """How a face's webhook is tried: ``tries`` in all, ``apart`` times
    ``WHISPER_WEBHOOK_RETRY_S`` between them, and whether a 4xx answer ends them."""

    tries: int
    apart: float
    stop_on_4xx: bool


POLICIES = {
    "runpod": Policy(3, 1.0, False),
    "assemblyai": Policy(10, 1.0, True),
    "deepgram": Policy(10, 3.0, False),
}
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


Call = tuple[str, bytes, dict[str, str], str, Policy]
"""(the URL, the body, the caller's headers, the method, how it is tried) of a webhook."""


def longest_s(settings: Settings) -> float:
    """The longest a delivery's tries take: each try's answer and the waits between them."""
    retry = settings.webhook_retry_s
    return max(
        (p.tries - 1) * p.apart * retry + p.tries * POST_TIMEOUT_S for p in POLICIES.values()
    )


def _call(rec: Ended) -> Call:
    assert rec.webhook is not None
    status = rec.status_object()
    if not rec.webhook.startswith("{"):
        body = json.dumps(status, ensure_ascii=False).encode()
        return rec.webhook, body, {}, "POST", POLICIES["runpod"]
    spec = json.loads(rec.webhook)
    url, headers = str(spec["url"]), dict(spec.get("headers") or {})
    if spec.get("shape") == "deepgram":
        from handler.faces.deepgram.response import callback_body

        body = callback_body(rec.id, status, spec)
        return url, body, headers, str(spec.get("method", "POST")), POLICIES["deepgram"]
    ended = "completed" if status.get("status") == "COMPLETED" else "error"
    body = json.dumps({"transcript_id": rec.id, "status": ended}).encode()  # AssemblyAI's
    return url, body, headers, "POST", POLICIES["assemblyai"]


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
    url, body, own, method, policy = call
    secret = settings.webhook_secret
    last, n = "", 0
    while n < policy.tries:
        n += 1
        headers = signed_headers(body, secret.get_secret_value()) if secret else {}
        try:
            status = post_json(url, body, settings, headers={**own, **headers}, method=method)
            last = f"HTTP {status}"
            if 200 <= status < 300:
                rec.webhook_report = {"status": "delivered", "tries": n}
                return
            if policy.stop_on_4xx and 400 <= status < 500:
                break  # the receiver refused it: asking again changes nothing
        except WorkerError as exc:
            last = exc.code.value
        rec.webhook_report = {"status": "pending", "tries": n, "last": last}
        if n < policy.tries and stop.wait(policy.apart * settings.webhook_retry_s):
            break
    log.warning("job %s: its webhook failed %d times (last: %s)", rec.id, n, last)
    rec.webhook_report = {"status": "failed", "tries": n, "last": last}
