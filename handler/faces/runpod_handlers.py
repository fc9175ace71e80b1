"""The RunPod handlers: async, inference in threads, optional streaming and progress.

A job arrives in either shape the queue takes (ours, or RunPod's OpenAI passthrough:
``handler.faces.openai_api.run_any_job`` dispatches them).

A sync handler would block the SDK's event loop (no job-take, no stop polls, no
concurrency), so jobs run in a thread pool sized to the worker's concurrency. When the SDK
cancels a job (``job-stop``) the asyncio task is cancelled; we set the job's cancel event
so the thread stops at the next segment, frees its model slot and deletes its files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from handler.contract import Segment
from handler.faces.openai_api import run_any_job
from handler.pipeline.runtime import Runtime

log = logging.getLogger(__name__)

# Streamed items stay far below the platform's per-item limits: one segment's text and times.
STREAM_TEXT_LIMIT = 4000
STREAM_WORDS_LIMIT = 1000


def _progress_sender(job: dict[str, Any]) -> Callable[[float], None] | None:
    if job.get("id") in (None, "local_test"):
        return None
    from runpod.serverless import progress_update

    return lambda percent: progress_update(job, {"progress": percent})


def _finish(worker: Runtime, result: Any) -> Any:
    if worker.refresh_wanted and isinstance(result, dict):
        # The SDK pops this key and asks the platform for a fresh worker after this job.
        result["refresh_worker"] = True
    return result


Submit = Callable[..., "asyncio.Future[Any]"]


def make_handlers(worker: Runtime) -> tuple[Callable, Callable]:
    """(plain async handler, streaming async-generator handler) sharing one thread pool."""
    executor = ThreadPoolExecutor(max_workers=worker.settings.concurrency, thread_name_prefix="job")

    def submit(job: dict[str, Any], cancel: threading.Event, on_segment=None) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(
            executor,
            lambda: run_any_job(
                job.get("input"),
                worker,
                job_id=str(job.get("id", "-")),
                cancel=cancel,
                on_segment=on_segment,
                on_progress=_progress_sender(job),
            ),
        )

    async def handler(job: dict[str, Any]) -> Any:
        cancel = threading.Event()
        future = submit(job, cancel)
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            log.info("job %s cancelled", job.get("id"))
            raise
        return _finish(worker, result)

    async def stream_handler(job: dict[str, Any]) -> AsyncIterator[Any]:
        async for item in _stream(worker, submit, job):
            yield item

    return handler, stream_handler


def stream_item(seg: Segment, words: bool = False) -> dict[str, Any]:
    """One streamed segment: its text and times (and its channel in a ``multichannel`` job),
    far below the platform's item limits. ``words``: its words too, where it has them (a
    broker's stream, read by a gateway's OpenAI stream for their logprobs; not RunPod's,
    whose final result aggregates every item beside the words it already holds)."""
    item: dict[str, Any] = {
        "id": seg["id"],
        "start": round(seg["start"], 3),
        "end": round(seg["end"], 3),
        "text": seg["text"][:STREAM_TEXT_LIMIT],
    }
    if "channel" in seg:
        item["channel"] = int(seg["channel"])
    timed = seg.get("words") if words else None
    if timed:
        item["words"] = list(timed)[:STREAM_WORDS_LIMIT]
    return {"segment": item}


async def _stream(worker: Runtime, submit: Submit, job: dict[str, Any]) -> AsyncIterator[Any]:
    """Segments as they are decoded, then the whole result (or the error, code inside)."""
    cancel = threading.Event()
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()

    def on_segment(seg: Segment) -> None:
        loop.call_soon_threadsafe(items.put_nowait, stream_item(seg))

    future = submit(job, cancel, on_segment)
    future.add_done_callback(lambda _f: loop.call_soon_threadsafe(items.put_nowait, None))
    try:
        while (item := await items.get()) is not None:
            yield item
        result = future.result()
    except (asyncio.CancelledError, GeneratorExit):
        cancel.set()
        raise
    if not (isinstance(result, dict) and "error" in result):
        yield result
    else:
        # The SDK keeps only str(error) of a streamed error: carry the code inside it.
        yield {"error": f"{result['error_code']}: {result['error']}"}
    if worker.refresh_wanted:
        # The SDK reads refresh_worker only from plain results. Ask for the same thing
        # the way the platform's own stop does: SIGTERM drains this job, then exits.
        log.info("asking for a fresh worker: stopping after this job")
        loop.call_soon(os.kill, os.getpid(), signal.SIGTERM)
