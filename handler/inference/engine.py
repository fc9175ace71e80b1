"""The throughput engine: one scheduler thread per model instance batches windows of many jobs.

A job prepares its windows in its own thread (``fw_batch.prepare``: VAD chunks of at most
30 s, features, language) and hands them to the instance's :class:`Scheduler`. Whenever
the instance is free, the scheduler decodes up to ``batch_size`` waiting windows **from
any jobs** in one batched encode + generate, and routes each window's segments back to
its job, which yields them in order (streaming and progress see them as they come).

Fairness: round-robin over jobs. Each batch takes the next window of each waiting job in
turn (the rotation starts one job further every batch), so a 2-hour file gets at most its
share of each batch and the short jobs behind it are never starved; oldest-first would
let the long file's 240 windows go first.

Windows whose decoding options cannot share one generate() call (beam size, temperature,
word timestamps with another language, ...: ``PreparedJob.key``) go in separate batches.
Cancel drops a job's waiting windows at once; an error in a batch is retried window by
window so that one bad job never fails the others; CUDA out-of-memory fails the jobs of
that batch with GPU_OOM (retryable) and the worker asks for a fresh process.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from handler.errors import Code, WorkerError, is_oom
from handler.guard import Guard, raise_if_cancelled
from handler.inference import fw_batch

log = logging.getLogger(__name__)

_ids = itertools.count(1)


@dataclass(eq=False)
class EngineJob:
    """One job's windows inside the scheduler, and the results coming back."""

    prepared: fw_batch.PreparedJob
    batch_size: int
    cancel: threading.Event | None
    guard: Guard | None = None
    """Cancel and compute budget: checked while the job waits and before each batch."""
    id: int = field(default_factory=lambda: next(_ids))
    next_window: int = 0
    results: dict[int, list[dict[str, Any]] | BaseException] = field(default_factory=dict)
    submitted: float = field(default_factory=time.perf_counter)
    waits: list[float] = field(default_factory=list)
    """Seconds each window waited from submission to the start of its batch."""
    batch_sizes: list[int] = field(default_factory=list)
    """The size of each batch this job's windows rode in."""
    batches_before: int | None = None
    """How many batches the scheduler ran before this job's first: its place in line."""

    @property
    def pending(self) -> int:
        return len(self.prepared.features) - self.next_window

    @property
    def cancelled(self) -> bool:
        if self.guard is not None:
            return self.guard.cancelled() or self.guard.expired()
        return self.cancel is not None and self.cancel.is_set()


class Scheduler:
    """Owns one model instance: batches waiting windows of every job, one batch at a time."""

    def __init__(self, model: Any, *, collect_s: float = 0.0, name: str = "engine") -> None:
        self.model = model
        self.collect_s = collect_s
        self._jobs: deque[EngineJob] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0
        self.histogram: dict[int, int] = {}
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # --- the job side -------------------------------------------------------------------

    def submit(self, job: EngineJob) -> None:
        with self._cond:
            if job.pending:
                self._jobs.append(job)
                self._cond.notify_all()

    def load(self) -> int:
        """Windows waiting (to pick the least busy instance)."""
        with self._cond:
            return sum(j.pending for j in self._jobs)

    def result(self, job: EngineJob, index: int) -> list[dict[str, Any]]:
        """Wait for window ``index`` of ``job``; CANCELLED at once when the job is cancelled."""
        with self._cond:
            while index not in job.results:
                if self._closed:  # the worker is exiting: the job may be retried elsewhere
                    raise WorkerError(Code.NOT_READY, "the worker is shutting down; retry")
                if job.cancelled:
                    self._drop(job)
                    raise_if_cancelled(job.cancel)
                    if job.guard is not None:
                        job.guard.check()  # the compute budget
                self._cond.wait(0.1)
            value = job.results.pop(index)
        if isinstance(value, BaseException):
            raise value
        return value

    def drop(self, job: EngineJob) -> None:
        with self._cond:
            self._drop(job)

    def _drop(self, job: EngineJob) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        job.next_window = len(job.prepared.features)

    def close(self, timeout: float = 60.0) -> None:
        """Stop after the batch in progress (whose cancelled windows stop at the next round)."""
        with self._cond:
            self._closed = True
            for job in list(self._jobs):
                self._drop(job)
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # --- the scheduler thread -----------------------------------------------------------

    def _pick(self) -> list[tuple[EngineJob, int]]:
        """Round-robin: one window per job in turn, all with the first job's key."""
        for job in [j for j in self._jobs if j.cancelled]:
            self._drop(job)
        if not self._jobs:
            return []
        lead = self._jobs[0]
        key, cap = lead.prepared.key, lead.batch_size
        batch: list[tuple[EngineJob, int]] = []
        while len(batch) < cap:
            took = False
            for job in list(self._jobs):
                if len(batch) >= cap:
                    break
                if job.prepared.key == key and job.pending:
                    batch.append((job, job.next_window))
                    job.next_window += 1
                    took = True
            if not took:
                break
        for job in [j for j in self._jobs if not j.pending]:
            self._jobs.remove(job)
        self._jobs.rotate(-1)  # the next batch starts with the next job
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            if self.collect_s:
                time.sleep(self.collect_s)  # let a burst arrive (off by default)
            with self._cond:
                if self._closed:
                    return
                batch = self._pick()
            if batch:
                self._run(batch)

    def _run(self, batch: list[tuple[EngineJob, int]]) -> None:
        started = time.perf_counter()
        for job, _ in batch:
            job.waits.append(started - job.submitted)
            job.batch_sizes.append(len(batch))
            if job.batches_before is None:
                job.batches_before = self.batches
        self.batches += 1
        self.histogram[len(batch)] = self.histogram.get(len(batch), 0) + 1
        outcomes: list[list[dict[str, Any]] | BaseException]
        try:
            outcomes = list(self._decode(batch))
        except Exception as exc:
            outcomes = self._isolate(batch, exc)
        with self._cond:
            for (job, index), outcome in zip(batch, outcomes, strict=True):
                job.results[index] = outcome
            self._cond.notify_all()

    def _decode(self, batch: list[tuple[EngineJob, int]]) -> list[list[dict[str, Any]]]:
        items = [fw_batch.BatchItem(job.prepared, index) for job, index in batch]
        # A window of a job cancelled meanwhile is not decoded on past the round it is in.
        return fw_batch.decode_batch(
            self.model, items, alive=lambda n: not (self._closed or batch[n][0].cancelled)
        )

    def _isolate(
        self, batch: list[tuple[EngineJob, int]], exc: Exception
    ) -> list[list[dict[str, Any]] | BaseException]:
        if is_oom(exc):
            log.error("GPU out of memory in a batch of %d windows", len(batch))
            oom = WorkerError(Code.GPU_OOM, "the GPU ran out of memory; the job can be retried")
            return [oom for _ in batch]
        if len(batch) == 1:
            log.error("window decode failed: %s", type(exc).__name__, exc_info=exc)
            return [WorkerError(Code.INTERNAL, "internal error while decoding the audio")]
        # Which window broke it? Decode each alone; the good ones still get their text.
        out: list[list[dict[str, Any]] | BaseException] = []
        for one in batch:
            try:
                out.append(self._decode([one])[0])
            except Exception as single:
                out.extend(self._isolate([one], single))
        return out


_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_engines() -> None:
    """At exit, let each scheduler finish its batch: a daemon thread still inside
    CTranslate2 while the interpreter and the C++ runtime tear down killed the worker with
    SIGABRT (exit -6, after a SIGTERM mid-batch on a loaded CI machine)."""
    for engine in list(_engines):
        engine.close()


class Engine:
    """One scheduler per model instance, created on first use."""

    def __init__(self, collect_s: float = 0.0) -> None:
        self.collect_s = collect_s
        self._schedulers: dict[int, Scheduler] = {}
        self._lock = threading.Lock()
        _engines.add(self)

    def close(self) -> None:
        with self._lock:
            schedulers = list(self._schedulers.values())
        for s in schedulers:
            s.close()

    def scheduler_for(self, instances: list[Any]) -> tuple[Any, Scheduler]:
        """The least busy instance of a model, and its scheduler."""
        with self._lock:
            for inst in instances:
                if id(inst) not in self._schedulers:
                    self._schedulers[id(inst)] = Scheduler(
                        inst, collect_s=self.collect_s, name=f"engine-{len(self._schedulers)}"
                    )
            pairs = [(inst, self._schedulers[id(inst)]) for inst in instances]
        return min(pairs, key=lambda p: p[1].load())

    def histogram(self) -> dict[int, int]:
        total: dict[int, int] = {}
        for s in self._schedulers.values():
            for size, n in s.histogram.items():
                total[size] = total.get(size, 0) + n
        return dict(sorted(total.items()))
