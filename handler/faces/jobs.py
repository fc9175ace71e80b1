"""Jobs that outlive a request, in the server's own engine: RunPod's job model (IN_QUEUE,
IN_PROGRESS, then COMPLETED, FAILED, CANCELLED or TIMED_OUT) behind RunPod's job API
(handler.faces.runpod_api), with no broker and nothing else to start.

A submitted job waits for one of the server's slots (the same ``WHISPER_MAX_CONCURRENCY``
the OpenAI routes take, so jobs and requests share the engine's batches), runs through
the job pipeline in a thread, streams its segments to ``/stream`` and its progress to
``/status``, and keeps its status and result for ``WHISPER_RESULT_TTL_S`` after it ends.
The store is bounded: at most ``WHISPER_RESULT_MAX_JOBS`` records and
``WHISPER_RESULT_MAX_BYTES`` of inputs and results (the oldest ended jobs go first; past
that a new job is refused with 429). A job's ``webhook`` gets the status object when the
job ends (handler.faces.webhooks).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handler.contract import TERMINAL_JOB_STATES, Segment
from handler.faces import webhooks
from handler.faces.openai_api import run_any_job
from handler.faces.runpod_handlers import stream_item
from handler.pipeline.runtime import Runtime
from handler.settings import Settings

log = logging.getLogger(__name__)

STREAM_HOLD_S = 1.0
"""A ``/stream`` call waits this long for a new item while its job runs."""


@dataclass
class Record:
    id: str
    input: Any
    input_bytes: int
    webhook: str | None = None
    submitted: float = field(default_factory=time.time)
    status: str = "IN_QUEUE"
    started: float | None = None
    finished: float | None = None
    output: Any = None
    error: str | None = None
    progress: Any = None
    stream: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0
    result_bytes: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)
    task: asyncio.Task | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    webhook_report: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_JOB_STATES

    @property
    def bytes(self) -> int:
        return (0 if self.ended else self.input_bytes) + self.result_bytes

    def status_object(self) -> dict[str, Any]:
        """As RunPod's ``/status`` answers: times in ms, the output or the error."""
        obj: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.started is not None:
            obj["delayTime"] = round((self.started - self.submitted) * 1000)
            obj["workerId"] = "local"
        if self.ended and self.started is not None and self.finished is not None:
            obj["executionTime"] = round((self.finished - self.started) * 1000)
        if self.status == "IN_PROGRESS" and self.progress is not None:
            obj["output"] = self.progress
        if self.status in ("COMPLETED", "FAILED") and self.output is not None:
            obj["output"] = self.output
        if self.error is not None:
            obj["error"] = self.error
        if self.webhook_report is not None:
            obj["webhook"] = self.webhook_report
        return obj


async def call_store(store: Any, method: str, *args: Any) -> Any:
    """``store.<method>(*args)`` from the event loop: in a thread when the store is on the
    network (``store.blocking``: the gateway's Redis, the AssemblyAI face's records there),
    else at once (this process's stores)."""
    fn = getattr(store, method)
    if getattr(store, "blocking", False):
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


class StoreFull(Exception):
    """No room for another job (count or bytes) even after the ended ones expired."""


RunJob = Callable[..., Any]


class Jobs:
    """The embedded engine's jobs; every method runs on the server's event loop."""

    def __init__(
        self,
        settings: Settings,
        worker: Callable[[], Runtime | None],
        run_in_slot: Callable[[Callable[[threading.Event], Any], threading.Event], Any],
        run: RunJob = run_any_job,
    ) -> None:
        self.settings = settings
        self.worker = worker
        self.run_in_slot = run_in_slot
        self.run = run
        self.records: dict[str, Record] = {}
        self.retried = 0
        self.body_cap = max(settings.max_inline_bytes, settings.max_upload_bytes)
        """What a job's audio_base64 may decode to: its body came over HTTP."""

    # --- the API's calls ------------------------------------------------------------

    def submit(self, job_input: Any, input_bytes: int, webhook: str | None) -> Record:
        self.expire()
        self._make_room(input_bytes)
        rec = Record(uuid.uuid4().hex, job_input, input_bytes, webhook)
        self.records[rec.id] = rec
        rec.task = asyncio.ensure_future(self._execute(rec))
        return rec

    def get(self, job_id: str) -> Record | None:
        self.expire()
        return self.records.get(job_id)

    async def wait(self, rec: Record, timeout_s: float) -> Record:
        """Until ``rec`` ends or ``timeout_s`` passes (``/runsync``); ``rec``."""
        deadline = time.monotonic() + timeout_s
        while not rec.ended and (left := deadline - time.monotonic()) > 0:
            rec.changed.clear()
            try:
                await asyncio.wait_for(rec.changed.wait(), left)
            except asyncio.TimeoutError:
                break
        return rec

    async def take_stream(self, rec: Record) -> dict[str, Any]:
        """Items not handed out yet (each once), waiting briefly for one while it runs."""
        if rec.cursor >= len(rec.stream) and not rec.ended:
            rec.changed.clear()
            try:
                await asyncio.wait_for(rec.changed.wait(), STREAM_HOLD_S)
            except asyncio.TimeoutError:
                pass
        fresh, rec.cursor = rec.stream[rec.cursor :], len(rec.stream)
        return {"id": rec.id, "status": rec.status, "stream": [{"output": i} for i in fresh]}

    def cancel(self, rec: Record) -> dict[str, Any]:
        """A queued job ends at once; a running one is told to stop (its thread leaves the
        model at its next cancel check) and is CANCELLED now, as RunPod answers."""
        if not rec.ended:
            rec.cancel.set()
            if rec.status == "IN_QUEUE" and rec.task is not None:
                rec.task.cancel()
            self._end(rec, "CANCELLED")
        return {"id": rec.id, "status": rec.status}

    def delete(self, rec: Record) -> bool:
        """Forget an ended job's record, its result with it (AssemblyAI's DELETE); False
        while it has not ended."""
        if not rec.ended:
            return False
        self.records.pop(rec.id, None)
        return True

    def purge(self) -> int:
        queued = [r for r in self.records.values() if r.status == "IN_QUEUE"]
        for rec in queued:
            rec.cancel.set()
            if rec.task is not None:
                rec.task.cancel()
            self._end(rec, "CANCELLED", notify=False)
        return len(queued)

    def health(self) -> dict[str, Any]:
        self.expire()
        counts = {s: 0 for s in ("COMPLETED", "FAILED", "IN_PROGRESS", "IN_QUEUE")}
        for rec in self.records.values():
            if rec.status in counts:
                counts[rec.status] += 1
        running = 1 if counts["IN_PROGRESS"] else 0
        return {
            "jobs": {
                "completed": counts["COMPLETED"],
                "failed": counts["FAILED"],
                "inProgress": counts["IN_PROGRESS"],
                "inQueue": counts["IN_QUEUE"],
                "retried": self.retried,
            },
            "workers": {"idle": 1 - running, "running": running},
        }

    async def drain(self, timeout_s: float) -> None:
        """On shutdown: queued jobs fail NOT_READY now (retryable: their callers submit them
        again elsewhere); running ones get ``timeout_s`` to finish, then fail the same way
        and are told to stop. Each ending calls its webhook."""
        for rec in [r for r in self.records.values() if r.status == "IN_QUEUE"]:
            self._stop(rec, "this worker is stopping before the job could start")
        running = [r for r in self.records.values() if not r.ended and r.task is not None]
        if running:
            log.info("draining: %d running job(s), up to %.0f s", len(running), timeout_s)
            await asyncio.wait([r.task for r in running if r.task], timeout=timeout_s)
        for rec in [r for r in running if not r.ended]:
            self._stop(rec, "this worker stopped before the job could finish")

    def _stop(self, rec: Record, why: str) -> None:
        rec.cancel.set()  # a running thread leaves the model at its next check
        if rec.task is not None:
            rec.task.cancel()
        stopping = {"error": f"{why}; submit it again", "error_code": "NOT_READY"}
        self._finished(rec, {**stopping, "retryable": True})

    # --- bounds ---------------------------------------------------------------------

    def expire(self) -> None:
        now = time.time()
        ttl = self.settings.result_ttl_s
        for rec in list(self.records.values()):
            if rec.ended and now - (rec.finished or now) > ttl:
                del self.records[rec.id]

    def _make_room(self, input_bytes: int) -> None:
        """Forget the oldest ended jobs until one more fits; StoreFull when none can."""
        s = self.settings

        def over() -> bool:
            used = sum(r.bytes for r in self.records.values())
            return len(self.records) + 1 > s.result_max_jobs or used + input_bytes > (
                s.result_max_bytes
            )

        if not over():
            return
        for rec in sorted(
            (r for r in self.records.values() if r.ended), key=lambda r: r.finished or 0.0
        ):
            del self.records[rec.id]
            if not over():
                return
        raise StoreFull

    # --- running ------------------------------------------------------------------

    async def _execute(self, rec: Record) -> None:
        loop = asyncio.get_running_loop()
        while (worker := self.worker()) is None:  # the model is still loading
            await asyncio.sleep(0.1)

        def on_segment(seg: Segment) -> None:
            loop.call_soon_threadsafe(self._streamed, rec, stream_item(seg))

        def on_progress(percent: float) -> None:
            loop.call_soon_threadsafe(self._progressed, rec, {"progress": percent})

        def job(cancel: threading.Event) -> Any:
            loop.call_soon_threadsafe(self._started, rec)
            return self.run(rec.input, worker, job_id=rec.id, cancel=cancel,
                            on_segment=on_segment, on_progress=on_progress,
                            body_cap=self.body_cap)  # fmt: skip

        try:
            result = await self.run_in_slot(job, rec.cancel)
        except asyncio.CancelledError:
            if not rec.ended:
                self._end(rec, "CANCELLED")
            raise
        except Exception:
            log.exception("job %s failed with an unexpected error", rec.id)
            result = {"error": "internal error while processing the job", "error_code": "INTERNAL",
                      "retryable": True}  # fmt: skip
        self._finished(rec, result)

    def _started(self, rec: Record) -> None:
        if rec.status == "IN_QUEUE":
            rec.status, rec.started = "IN_PROGRESS", time.time()
            rec.changed.set()

    def _streamed(self, rec: Record, item: dict[str, Any]) -> None:
        rec.stream.append(item)
        rec.changed.set()

    def _progressed(self, rec: Record, progress: Any) -> None:
        rec.progress = progress
        rec.changed.set()

    def _finished(self, rec: Record, result: Any) -> None:
        if rec.ended:  # cancelled meanwhile: the first ending stands
            return
        if rec.started is None:
            rec.started = time.time()
        if isinstance(result, dict) and isinstance(result.get("error"), str):
            rest = {k: v for k, v in result.items() if k != "error"}
            rec.error, rec.output = result["error"], rest
            status = "FAILED"
        else:
            rec.output, status = result, "COMPLETED"
        rec.result_bytes = len(json.dumps(rec.output, ensure_ascii=False).encode())
        self._end(rec, status)

    def _end(self, rec: Record, status: str, *, notify: bool = True) -> None:
        rec.status, rec.finished = status, time.time()
        rec.input = None  # the audio may be megabytes: not kept past the job
        rec.changed.set()
        if rec.webhook and notify:
            webhooks.deliver(rec, self.settings)
