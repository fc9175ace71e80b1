"""A JSON POST to a caller's URL (a job's ``webhook``) through the same guard as audio URLs:
http(s) only, every address the host resolves to checked (no private, loopback or
link-local address unless ``WHISPER_ALLOW_PRIVATE_URLS``), the connection pinned to the
checked address, one deadline for the whole exchange, redirects not followed, the answer
read up to a few kilobytes. The URL's query is never logged (it may carry a token).
"""

from __future__ import annotations

import http.client
import time

from handler.audio.netfetch import (
    USER_AGENT,
    Watchdog,
    connect,
    parse_target,
    resolve,
)
from handler.errors import Code, WorkerError
from handler.settings import Settings

ANSWER_BYTES = 65_536


def check_url(url: str, field: str = "webhook") -> None:
    """Refuse at once what can never be posted to (a scheme, a missing host), naming
    ``field``; addresses are judged when the POST is made (the host may resolve
    differently by then)."""
    parse_target(url, field)


POST_TIMEOUT_S = 10.0
"""How long one POST may take, connection to answer."""


def post_json(
    url: str,
    body: bytes,
    settings: Settings,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = POST_TIMEOUT_S,
    method: str = "POST",
) -> int:
    """POST (or ``method``) ``body`` (JSON); the HTTP status. WorkerError when the URL is
    refused or the host cannot be reached in time."""
    t = parse_target(url, "webhook")
    with Watchdog(time.monotonic() + timeout_s, None) as wd:
        sock = connect(t, resolve(t, settings, wd), settings, wd)
        conn = http.client.HTTPConnection(t.host, t.port)
        conn.sock = sock  # connected to the checked address; no second lookup
        try:
            sock.settimeout(max(0.01, wd.remaining() + 1.0))
            conn.putrequest(method, t.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", t.host_header)
            conn.putheader("User-Agent", USER_AGENT)
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("Connection", "close")
            if t.auth:
                conn.putheader("Authorization", t.auth)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.endheaders(body)
            resp = conn.getresponse()
            resp.read(ANSWER_BYTES)
            return int(resp.status)
        except (OSError, http.client.HTTPException, ValueError):
            wd.check(t.redacted)
            raise WorkerError(
                Code.SOURCE_UNREACHABLE, f"the webhook closed the connection: {t.redacted}"
            ) from None
        finally:
            conn.close()
