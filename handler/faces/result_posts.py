"""Results that reach the platform: job-done posts retried for longer than the SDK does.

The runpod SDK posts a job's result (and each streamed item) with 3 tries over about 5 s,
then logs "Failed to return job results" and drops it: the client later sees the job
TIMED_OUT and the work is lost. A control-plane hiccup longer than that is not rare on a
busy platform, so the worker wraps the SDK's one transmit function: after the SDK's own
tries fail with a 5xx or a connection error, it tries again with backoff until
``result_retry_s`` has passed. A 4xx (the platform refusing this job's result) is not
retried.

Re-posting is safe: the platform keeps the first result it accepted for a job and answers
later posts for that job without applying them (the emulator does the same and counts
them as ``late_posts``). While a result is being re-posted the job still holds its slot,
so a long outage also stops the worker taking new jobs it could not report either.

This replaces ``runpod.serverless.modules.rp_http._transmit``, a private function: the
pinned SDK range is checked by tests/test_platform.py (drift test), and if the function is
missing the worker keeps the SDK's behaviour and logs that once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 10.0


def persist_result_posts(total_s: float) -> bool:
    """Install the longer retry; returns whether it was installed."""
    if total_s <= 0:
        return False
    try:
        from aiohttp import ClientError, ClientResponseError
        from runpod.serverless.modules import rp_http
    except ImportError:
        return False
    original = getattr(rp_http, "_transmit", None)
    if original is None or getattr(original, "_whisper_persistent", False):
        if original is None:
            log.warning("runpod SDK has no rp_http._transmit: results get the SDK's 3 tries")
        return original is not None

    async def transmit(client_session: Any, url: str, job_data: Any) -> None:
        deadline = time.monotonic() + total_s
        delay = FIRST_DELAY_S
        tries = 0
        while True:
            try:
                await original(client_session, url, job_data)
                if tries:
                    log.info(
                        "result delivered after %d more tr%s", tries, "y" if tries == 1 else "ies"
                    )
                return
            except ClientResponseError as exc:
                if exc.status < 500:
                    raise
                last: Exception = exc
            except (ClientError, asyncio.TimeoutError) as exc:
                last = exc
            if time.monotonic() + delay > deadline:
                log.error("giving up on a result after %.0f s: %s", total_s, type(last).__name__)
                raise last
            tries += 1
            log.warning(
                "result post failed (%s); trying again in %.0f s",
                getattr(last, "status", type(last).__name__),
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)

    transmit._whisper_persistent = True  # type: ignore[attr-defined]
    rp_http._transmit = transmit
    return True
