"""The emulated endpoint's queue, jobs and workers: all platform rules, no HTTP, no processes.

One `threading.Condition` guards everything; long-polls wait on it. Callers (the
HTTP layer, the Emulator) translate requests into these methods. Times are
`time.time()` seconds throughout, so records from all parts line up.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from .config import (
    CANCELLED,
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    IN_QUEUE,
    TERMINAL,
    TIMED_OUT,
    EmulatorConfig,
)
from .model import NO_OUTPUT, Job, Worker, ms_between

log = logging.getLogger(__name__)

Event = dict[str, Any]


class EndpointState:
    """Queue, jobs and workers of one endpoint. Thread-safe; long-polls block."""

    def __init__(
        self,
        config: EmulatorConfig,
        emit: Callable[[Event], None] = lambda event: None,
        on_terminal: Callable[[Job, dict[str, Any]], None] = lambda job, status: None,
    ) -> None:
        self.config = config
        self.cond = threading.Condition()
        self.jobs: dict[str, Job] = {}
        self.queue: deque[str] = deque()
        self.workers: dict[str, Worker] = {}
        self.retried_total = 0
        self.done_failures_left = 0
        self.done_failure_status = 503
        self.done_failure_after_commit = False
        self.closed = False
        # Jobs not yet expired: the only ones the periodic rules need to look at.
        self._live: set[str] = set()
        self._emit = emit
        self._on_terminal = on_terminal

    # ------------------------------------------------------------ client side
    def submit(
        self,
        job_input: Any,
        *,
        kind: str = "run",
        webhook: str | None = None,
        policy: dict[str, Any] | None = None,
        input_bytes: int = 0,
    ) -> Job:
        now = time.time()
        policy = policy or {}
        prefix = "sync-" if kind == "runsync" else ""
        job = Job(
            id=f"{prefix}{uuid.uuid4()}",
            input=job_input,
            kind=kind,
            submitted_at=now,
            queued_at=now,
            input_bytes=input_bytes,
            webhook=webhook,
            execution_timeout_s=_policy_seconds(policy, "executionTimeout"),
            ttl_s=_policy_seconds(policy, "ttl"),
        )
        with self.cond:
            self.jobs[job.id] = job
            self._live.add(job.id)
            self.queue.append(job.id)
            self._emit({"type": "job_queued", "t": now, "job_id": job.id})
            self.cond.notify_all()
        return job

    def status(self, job_id: str) -> dict[str, Any] | None:
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None or job.expired:
                return None
            return self._status_obj(job)

    def wait_terminal(self, job_id: str, timeout: float) -> dict[str, Any] | None:
        """The status object once the job has ended, or as it is after `timeout`."""
        deadline = time.time() + timeout
        with self.cond:
            while True:
                job = self.jobs.get(job_id)
                if job is None:
                    return None
                remaining = deadline - time.time()
                if job.status in TERMINAL or remaining <= 0 or self.closed:
                    return self._status_obj(job)
                self.cond.wait(remaining)

    def take_stream(self, job_id: str, hold_s: float) -> dict[str, Any] | None:
        """Stream items not handed out yet; waits briefly for one while the job runs."""
        deadline = time.time() + hold_s
        with self.cond:
            while True:
                job = self.jobs.get(job_id)
                if job is None or job.expired:
                    return None
                fresh = job.stream[job.stream_cursor :]
                remaining = deadline - time.time()
                if fresh or job.status in TERMINAL or remaining <= 0 or self.closed:
                    job.stream_cursor = len(job.stream)
                    return {
                        "id": job.id,
                        "status": job.status,
                        "stream": [{"output": item} for item in fresh],
                    }
                self.cond.wait(remaining)

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        now = time.time()
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None or job.expired:
                return None
            if job.status == IN_QUEUE:
                self._discard_queued(job.id)
                self._finish(job, CANCELLED, now)
            elif job.status == IN_PROGRESS:
                self._signal_stop(job, now)
                self._finish(job, CANCELLED, now)
            return {"id": job.id, "status": job.status}

    def retry(self, job_id: str) -> dict[str, Any] | None:
        """Requeue a FAILED or TIMED_OUT job; None if unknown, {} if not retryable."""
        now = time.time()
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None or job.expired:
                return None
            if job.status not in (FAILED, TIMED_OUT):
                return {}
            job.retries += 1
            self.retried_total += 1
            self._requeue(job, now, front=False)
            return {"id": job.id, "status": job.status}

    def cancel_running(self) -> list[str]:
        """Cancel every job in progress (its worker is told on its next stop poll)."""
        with self.cond:
            running = [j.id for j in self.jobs.values() if j.status == IN_PROGRESS]
        for job_id in running:
            self.cancel(job_id)
        return running

    def purge_queue(self) -> int:
        now = time.time()
        with self.cond:
            ids = list(self.queue)
            for job_id in ids:
                job = self.jobs[job_id]
                job.note = "purged"
                self._discard_queued(job_id)
                self._finish(job, CANCELLED, now, notify_webhook=False)
            return len(ids)

    def health(self) -> dict[str, Any]:
        with self.cond:
            counts = {s: 0 for s in (COMPLETED, FAILED, IN_PROGRESS, IN_QUEUE)}
            for job in self.jobs.values():
                if job.status in counts:
                    counts[job.status] += 1
            states = [w.state for w in self.workers.values()]
            return {
                "jobs": {
                    "completed": counts[COMPLETED],
                    "failed": counts[FAILED],
                    "inProgress": counts[IN_PROGRESS],
                    "inQueue": counts[IN_QUEUE],
                    "retried": self.retried_total,
                },
                "workers": {
                    "idle": states.count("idle"),
                    "initializing": states.count("starting"),
                    "ready": states.count("idle"),
                    "running": states.count("busy"),
                    "throttled": 0,
                    "unhealthy": sum(w.unhealthy is not None for w in self.workers.values()),
                },
            }

    # ------------------------------------------------------------ worker side
    def take(
        self, worker_id: str, max_jobs: int, hold_s: float, *, batch: bool = False
    ) -> list[dict[str, Any]]:
        """Long-poll for up to `max_jobs` jobs; [] after `hold_s` without one."""
        deadline = time.time() + hold_s
        with self.cond:
            worker = self._seen(worker_id)
            worker.takes["batch" if batch else "single"] += 1
            if worker.ready_at is None:
                worker.ready_at = worker.last_seen
                self._emit({"type": "worker_ready", "t": worker.ready_at, "worker_id": worker_id})
            # A worker already told to stop gets a short hold, so a loop that ignores
            # SIGTERM cannot spin; one that is told while waiting is released at once.
            stopping_on_entry = worker.stop_requested_at is not None
            while True:
                if worker.stopped_at is not None or self.closed:
                    return []
                if worker.stop_requested_at is not None and self.config.withhold_from_stopping:
                    if stopping_on_entry:
                        self.cond.wait(min(0.2, max(0.0, deadline - time.time())))
                    return []
                if self.queue:
                    return [self._hand_out(worker) for _ in range(min(max_jobs, len(self.queue)))]
                remaining = deadline - time.time()
                if remaining <= 0:
                    return []
                self.cond.wait(remaining)

    def stop_poll(self, worker_id: str, hold_s: float) -> list[str]:
        deadline = time.time() + hold_s
        with self.cond:
            worker = self._seen(worker_id)
            worker.stop_polls.append(time.time())
            del worker.stop_polls[:-2000]
            while True:
                if worker.pending_stops:
                    ids, worker.pending_stops = worker.pending_stops, []
                    now = time.time()
                    for job_id in ids:
                        self.jobs[job_id].stop_delivered_at = now
                    return ids
                remaining = deadline - time.time()
                if remaining <= 0 or self.closed or worker.stop_requested_at is not None:
                    return []
                self.cond.wait(remaining)

    def job_done(
        self, worker_id: str, job_id: str, body: bytes, is_stream: bool
    ) -> tuple[int, dict[str, Any]]:
        """Apply a job-done post; returns the HTTP status and JSON answer."""
        now = time.time()
        with self.cond:
            self._seen(worker_id)
            # Injected failures meet results only: a progress update posted meanwhile (more
            # of them the slower the job) would otherwise use them up.
            inject = self.done_failures_left > 0 and not _is_progress(body)
            if inject and not self.done_failure_after_commit:
                self.done_failures_left -= 1
                return self.done_failure_status, {"error": "injected failure"}
            status, answer = self._apply_done(worker_id, job_id, body, now)
            if inject and self.done_failure_after_commit:
                # The post was applied, but the worker is told it failed: it will re-post.
                self.done_failures_left -= 1
                return self.done_failure_status, {"error": "injected failure after commit"}
            return status, answer

    def _apply_done(
        self, worker_id: str, job_id: str, body: bytes, now: float
    ) -> tuple[int, dict[str, Any]]:
        # Called with self.cond held (by job_done).
        job, result, refusal = self._job_and_body(job_id, body)
        if refusal is not None:
            return refusal
        if not isinstance(result, dict):
            return 400, {"error": "body is not a JSON object"}
        current = job.status == IN_PROGRESS and job.worker_id == worker_id
        if result.get("status") == IN_PROGRESS:
            # progress_update posts from a thread and can land after the result.
            job.progress_posts += 1
            if current and "output" in result:
                job.progress = result["output"]
                self.cond.notify_all()
            return 200, {}
        job.done_posts += 1
        if not current:
            job.late_posts += 1
            return 200, {}
        if result.get("stopPod"):
            # The platform replaces a worker that asks for it (refresh_worker).
            self.workers[worker_id].stop_pod = True
            self._emit({"type": "worker_stop_pod", "t": now, "worker_id": worker_id})
        job.result_bytes = len(body)
        limit = self._result_limit(job)
        if len(body) > limit:
            job.note = f"result too large: {len(body)} bytes > {limit}"
            if self.config.oversize_result == "fail":
                job.error = job.note
                self._finish(job, FAILED, now)
            else:
                self._finish(job, COMPLETED, now)
            return 400, {"error": job.note}
        error = result.get("error")
        if "output" in result:
            job.output = result["output"]
        if isinstance(error, str) and error:
            job.error = error
            self._finish(job, FAILED, now)
        else:
            if error:  # a dict or list error: the platform shows no output
                job.output = NO_OUTPUT
                job.note = "non-string error"
            self._finish(job, COMPLETED, now)
        return 200, {}

    def job_stream(self, worker_id: str, job_id: str, body: bytes) -> tuple[int, dict[str, Any]]:
        with self.cond:
            self._seen(worker_id)
            job, item, refusal = self._job_and_body(job_id, body)
            if refusal is not None:
                return refusal
            if job.status == IN_PROGRESS and job.worker_id == worker_id and isinstance(item, dict):
                job.stream.append(item.get("output"))
                self.cond.notify_all()
            else:
                job.late_posts += 1
            return 200, {}

    def unhealthy(self, worker_id: str, check: str, reason: str) -> None:
        with self.cond:
            self._seen(worker_id).unhealthy = {"check": check, "reason": reason}
            self.cond.notify_all()

    def ping(self, worker_id: str, job_ids: list[str]) -> None:
        with self.cond:
            worker = self._seen(worker_id)
            worker.heartbeats.append({"t": worker.last_seen, "job_ids": job_ids})

    # ------------------------------------------------------- worker lifecycle
    def add_worker(self, worker_id: str, *, pid: int | None, log_path: str | None) -> Worker:
        now = time.time()
        with self.cond:
            worker = Worker(worker_id, spawned=True, started_at=now, pid=pid, log_path=log_path)
            self.workers[worker_id] = worker
            self._emit({"type": "worker_started", "t": now, "worker_id": worker_id})
            return worker

    def stop_requested(self, worker_id: str) -> None:
        now = time.time()
        with self.cond:
            worker = self.workers[worker_id]
            if worker.stop_requested_at is None and worker.stopped_at is None:
                worker.stop_requested_at = now
                self._emit({"type": "worker_stopping", "t": now, "worker_id": worker_id})
                self.cond.notify_all()  # release its open polls so the drain is quick

    def worker_gone(self, worker_id: str, exit_code: int | None, reason: str) -> None:
        """The worker's process exited (or went silent): its jobs are lost."""
        now = time.time()
        with self.cond:
            worker = self.workers.get(worker_id)
            if worker is None or worker.stopped_at is not None:
                return
            worker.stopped_at = now
            worker.exit_code = exit_code
            for job_id in sorted(worker.held):
                job = self.jobs[job_id]
                self._end_attempt(job, now, "lost")
                if job.requeues < self.config.max_requeues:
                    job.requeues += 1
                    self._requeue(job, now, front=True)
                else:
                    job.note = f"worker lost ({reason})"
                    if self.config.lost_job_status == FAILED:
                        job.error = "worker lost"
                    self._finish(job, self.config.lost_job_status, now)
            worker.held.clear()
            self._emit(
                {
                    "type": "worker_stopped",
                    "t": now,
                    "worker_id": worker_id,
                    "exit_code": exit_code,
                    "reason": reason,
                }
            )
            self.cond.notify_all()

    def tick(self) -> list[str]:
        """Time-based rules; returns ids of external workers that went silent."""
        now = time.time()
        silent = []
        with self.cond:
            for job_id in list(self.queue):
                job = self.jobs[job_id]
                ttl = job.ttl_s if job.ttl_s is not None else self.config.ttl_s
                if now - job.submitted_at > ttl:
                    job.note = "ttl expired"
                    self._discard_queued(job_id)
                    self._finish(job, TIMED_OUT, now)
            for job in [self.jobs[job_id] for job_id in self._live]:
                if job.status == IN_PROGRESS and job.taken_at is not None:
                    limit = job.execution_timeout_s or self.config.execution_timeout_s
                    if now - job.taken_at > limit:
                        job.note = "execution timeout"
                        self._signal_stop(job, now)
                        self._finish(job, TIMED_OUT, now)
                elif job.status in TERMINAL and not job.expired and job.finished_at:
                    keep = (
                        self.config.runsync_result_keep_s
                        if job.kind == "runsync"
                        else self.config.run_result_keep_s
                    )
                    if now - job.finished_at > keep:
                        job.expired = True
                        self._live.discard(job.id)
            for worker in self.workers.values():
                if (
                    not worker.spawned
                    and worker.stopped_at is None
                    and worker.last_seen is not None
                    and now - worker.last_seen > self.config.external_worker_timeout_s
                ):
                    silent.append(worker.id)
        return silent

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # ------------------------------------------------------------- internals
    def _job_and_body(
        self, job_id: str, body: bytes
    ) -> tuple[Any, Any, tuple[int, dict[str, Any]] | None]:
        """The job a worker posts about and its parsed body, or the answer refusing it."""
        job = self.jobs.get(job_id)
        if job is None:
            return None, None, (404, {"error": "job not found"})
        try:
            return job, json.loads(body or b"{}"), None
        except (ValueError, RecursionError):
            return job, None, (400, {"error": "body is not JSON"})

    def _seen(self, worker_id: str) -> Worker:
        now = time.time()
        worker = self.workers.get(worker_id)
        if worker is None:  # a worker the emulator did not start (CLI use)
            worker = Worker(worker_id, spawned=False, started_at=None)
            self.workers[worker_id] = worker
            self._emit({"type": "worker_started", "t": now, "worker_id": worker_id})
        worker.last_seen = now
        return worker

    def _hand_out(self, worker: Worker) -> dict[str, Any]:
        now = time.time()
        job = self.jobs[self.queue.popleft()]
        job.status = IN_PROGRESS
        job.worker_id = worker.id
        job.taken_at = now
        job.progress = NO_OUTPUT
        job.attempts.append(
            {"worker_id": worker.id, "taken_at": now, "ended_at": None, "end": None}
        )
        worker.held.add(job.id)
        worker.jobs.append(job.id)
        self._emit({"type": "job_taken", "t": now, "job_id": job.id, "worker_id": worker.id})
        return {"id": job.id, "input": job.input}

    def _requeue(self, job: Job, now: float, *, front: bool) -> None:
        # The earlier attempts stay in job.attempts; the live view starts afresh.
        job.status = IN_QUEUE
        job.queued_at = now
        job.worker_id = None
        job.taken_at = None
        job.finished_at = None
        job.output = NO_OUTPUT
        job.error = None
        if front:
            self.queue.appendleft(job.id)
        else:
            self.queue.append(job.id)
        self._emit({"type": "job_requeued", "t": now, "job_id": job.id})
        self.cond.notify_all()

    def _discard_queued(self, job_id: str) -> None:
        try:
            self.queue.remove(job_id)
        except ValueError:
            pass

    def _signal_stop(self, job: Job, now: float) -> None:
        worker = self.workers.get(job.worker_id or "")
        if worker is not None and worker.stopped_at is None:
            worker.pending_stops.append(job.id)
            job.stop_signalled_at = now

    def _end_attempt(self, job: Job, now: float, end: str) -> None:
        if job.attempts and job.attempts[-1]["ended_at"] is None:
            job.attempts[-1].update(ended_at=now, end=end)
        worker = self.workers.get(job.worker_id or "")
        if worker is not None:
            worker.held.discard(job.id)

    def _finish(self, job: Job, status: str, now: float, *, notify_webhook: bool = True) -> None:
        if job.status == IN_PROGRESS:
            self._end_attempt(job, now, status)
        job.status = status
        job.finished_at = now
        self._emit(
            {
                "type": "job_finished",
                "t": now,
                "job_id": job.id,
                "status": status,
                "worker_id": job.worker_id,
            }
        )
        if job.webhook and notify_webhook:
            self._on_terminal(job, self._status_obj(job))
        self.cond.notify_all()

    def _result_limit(self, job: Job) -> int:
        if job.kind == "runsync":
            return self.config.runsync_payload_limit
        return self.config.run_payload_limit

    def _status_obj(self, job: Job) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": job.id, "status": job.status}
        if job.taken_at is not None:
            obj["delayTime"] = ms_between(job.taken_at, job.submitted_at)
            obj["workerId"] = job.worker_id
        if job.status in TERMINAL and job.taken_at is not None and job.finished_at is not None:
            obj["executionTime"] = ms_between(job.finished_at, job.taken_at)
        if job.status == IN_PROGRESS and job.progress is not NO_OUTPUT:
            obj["output"] = job.progress
        if job.status in (COMPLETED, FAILED) and job.output is not NO_OUTPUT:
            obj["output"] = job.output
        if job.error is not None:
            obj["error"] = job.error
        return obj


def _policy_seconds(policy: dict[str, Any], key: str) -> float | None:
    value = policy.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value / 1000.0
    return None


def _is_progress(body: bytes) -> bool:
    """A job-done post that is a progress update (``status: IN_PROGRESS``), not a result."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and parsed.get("status") == IN_PROGRESS
