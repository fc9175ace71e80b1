"""``whisper-worker consume`` (or ``WHISPER_MODE=consume``): take jobs from the broker.

A supervisor (``supervise``, no model) runs one consumer process at a time and starts a
fresh one when it recycles itself or dies; ``SIGTERM`` to the supervisor is passed on, and
the consumer stops taking jobs, finishes those in hand, stores their results and exits.

The consumer (``python -m handler.faces.broker.consumer``) loads the model once, then runs a
Celery worker with a thread pool of ``WHISPER_MAX_CONCURRENCY`` (the same number the HTTP
face admits), so jobs from the queue meet in the same batching engine. Each job:

1. ``start``: skipped when it has ended already (a redelivered copy), put back for later
   when another live consumer holds its lease, failed as WORKER_LOST after ``MAX_TRIES``
   consumers died running it (a job that kills its worker must not kill every worker);
2. runs through the job pipeline, streaming segments and progress into Redis; a cancel
   seen in Redis stops it at the engine's next check;
3. ``end``: its one result stored (with the TTL), then its webhook, then the message is
   acknowledged (Celery's late ack).

After ``WHISPER_REFRESH_AFTER_JOBS`` jobs or past ``WHISPER_MAX_RSS_MB`` the consumer
stops taking jobs, finishes those in hand and exits with ``RECYCLE_EXIT``; the
supervisor starts the next.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

from handler.errors import Code
from handler.faces.broker.queue import (
    QUEUE,
    TASK,
    UNACKED,
    evicting_advice,
    make_celery,
    may_evict_jobs,
    passing,
    redis_client,
    why_refused,
)
from handler.faces.broker.store import LEASE_S, EndedJob, JobStore, split_result
from handler.settings import Settings, SettingsError, load_settings

log = logging.getLogger(__name__)

RECYCLE_EXIT = 75
"""The consumer's exit status when it recycled itself (the supervisor starts another)."""
BROKER_EXIT = 69
"""The consumer's exit status when its Celery worker stopped on an error ("Unrecoverable
error"; Redis's error replies make it reconnect instead, queue.py): the supervisor starts
another, ``BROKER_PAUSE_S`` at least after the last one started; the jobs it had taken run
again (redelivered, or swept as lost; a copy of one that ended is skipped)."""
BROKER_PAUSE_S = 5.0
TELL_EVERY_S = 30.0
"""The same warning about the broker is logged once in this many seconds."""
MAX_TRIES = 3
"""Consumers that may die running one job before it fails as WORKER_LOST."""
WATCH_S = 0.5
"""How often a consumer looks for cancels of the jobs in its hands (seconds)."""
PERSIST_S = 120
"""How long a consumer keeps trying to store a job's start or result while Redis is away;
past it the message stays unacknowledged and the job runs again elsewhere."""
LOST_AFTER_S = 60
"""A job whose message is nowhere this long after it was queued (or its consumer's lease
lapsed) is queued again from the input its record keeps (JobStore.lost)."""
SWEEP_S = 15
"""How often a consumer looks for such jobs (seconds)."""
BEAT_S = 5
"""A consumer's heartbeat in Redis (for ``/health``); it lives three beats."""


class Consumer:
    """The jobs in one consumer's hands, over the loaded model (``worker``)."""

    def __init__(self, worker: Any, settings: Settings, store: JobStore) -> None:
        self.worker, self.settings, self.store = worker, settings, store
        self.name = f"{socket.gethostname()}-{os.getpid()}"
        self.in_hand: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.recycling = False
        self._told: dict[str, float] = {}
        self.celery: Any = None
        """The Celery app (set by ``consume``), for queueing a lost job again."""

    def run_task(self, task: Any, job_id: str, job_input: Any, webhook: str | None) -> None:
        status, streamed, tries = self.lasting(self.store.start, job_id, self.name)
        if status == "LEASED":
            # Redelivered while its consumer still runs it: look again after a lease.
            raise task.retry(countdown=LEASE_S)
        if status != "GO":
            log.info("job %s: skipped (%s)", job_id, status)
            return
        cancel = threading.Event()
        with self.lock:
            self.in_hand[job_id] = cancel
        try:
            if tries > MAX_TRIES:
                message = f"{MAX_TRIES} consumers were lost while running this job"
                log.error("job %s: %s; it fails rather than runs again", job_id, message)
                result: Any = {
                    "error": message,
                    "error_code": Code.WORKER_LOST.value,
                    "retryable": False,
                }
            else:
                result = self._run(job_id, job_input, cancel, streamed)
            outcome, output, error = split_result(result)
            if self.lasting(self.store.end, job_id, outcome, output, error) and webhook:
                self._webhook(job_id, webhook)
        finally:
            with self.lock:
                self.in_hand.pop(job_id, None)
        if self.worker.refresh_wanted:
            self.recycle()

    def lasting(self, call: Any, *args: Any) -> Any:
        """``call(*args)`` on Redis, again while Redis restarts (up to ``PERSIST_S``): a
        result computed must not be lost to a moment without the broker."""
        import redis

        deadline, pause = time.monotonic() + PERSIST_S, 0.2
        while True:
            try:
                return call(*args)
            except redis.RedisError as exc:
                if not passing(exc) or time.monotonic() > deadline:
                    raise
                log.warning("consumer %s: %s; again", self.name, why_refused(exc))
                time.sleep(pause)
                pause = min(5.0, pause * 2)

    def _best_effort(self, call: Any, *args: Any) -> None:
        """A streamed item or progress: lost, not fatal, while Redis is away or full (the
        result carries every segment); said once in TELL_EVERY_S."""
        import redis

        try:
            call(*args)
        except redis.RedisError as exc:
            if not passing(exc):
                raise
            self.tell(f"{why_refused(exc)}; streamed items lost")

    def tell(self, what: str) -> None:
        """A warning about the broker, each kind once in TELL_EVERY_S (the watch looks twice
        a second, a job streams many segments: one refusal is said once, not hundreds of
        times)."""
        now = time.monotonic()
        if now - self._told.get(what, -TELL_EVERY_S) >= TELL_EVERY_S:
            self._told[what] = now
            log.warning("consumer %s: %s", self.name, what)

    def _run(self, job_id: str, job_input: Any, cancel: threading.Event, skip: int) -> Any:
        from handler.faces.openai_api import run_any_job
        from handler.faces.runpod_handlers import stream_item

        sent = 0

        def on_segment(seg: Any) -> None:
            nonlocal sent
            sent += 1
            if sent > skip:  # an earlier try streamed the first ``skip`` already
                self._best_effort(self.store.stream, job_id, stream_item(seg, words=True))

        def on_progress(percent: float) -> None:
            self._best_effort(self.store.progress, job_id, {"progress": percent})

        try:
            settings = self.worker.settings  # the job came through a gateway's HTTP body
            return run_any_job(
                job_input,
                self.worker,
                body_cap=max(settings.max_inline_bytes, settings.max_upload_bytes),
                job_id=job_id,
                cancel=cancel,
                on_segment=on_segment,
                on_progress=on_progress,
            )
        except Exception:
            log.exception("job %s failed with an unexpected error", job_id)
            return {
                "error": "internal error while processing the job",
                "error_code": Code.INTERNAL.value,
                "retryable": True,
            }

    def _webhook(self, job_id: str, url: str) -> None:
        from handler.faces import webhooks

        snap = self.store.get(job_id)
        if snap is not None:
            webhooks.deliver(EndedJob(snap, url, self.store), self.settings)

    def recycle(self) -> None:
        """Stop taking jobs, finish those in hand, exit (Celery's warm shutdown)."""
        with self.lock:
            if self.recycling:
                return
            self.recycling = True
        log.info("consumer %s: recycling after %d jobs", self.name, self.worker.jobs_done)
        os.kill(os.getpid(), signal.SIGTERM)

    def watch(self) -> None:
        """Until stopped: cancels reach the jobs in hand, leases and the heartbeat renewed."""
        last_renew = last_beat = last_sweep = 0.0
        while not self.stopping.wait(WATCH_S):
            now = time.monotonic()
            renew, beat = now - last_renew >= LEASE_S / 3, now - last_beat >= BEAT_S
            sweep = now - last_sweep >= SWEEP_S
            try:
                self._watch_once(renew, beat)
                if sweep:
                    self.sweep()
            except Exception as exc:  # Redis away (or full) for a moment: the next look retries
                self.tell(why_refused(exc))
                continue
            last_renew = now if renew else last_renew
            last_beat = now if beat else last_beat
            last_sweep = now if sweep else last_sweep

    def sweep(self) -> None:
        """Queue again the jobs whose message a dead consumer took (JobStore.lost)."""
        if self.celery is None:
            return
        for job_id, job_input, webhook in self.store.lost(QUEUE, UNACKED, LOST_AFTER_S):
            if job_input is None:
                continue
            log.warning("job %s: its message was lost with a consumer; queued again", job_id)
            self.celery.send_task(
                TASK, args=[job_id, job_input, webhook], queue=QUEUE, task_id=job_id
            )

    def _watch_once(self, renew: bool, beat: bool) -> None:
        with self.lock:
            jobs = dict(self.in_hand)
        if jobs:
            for (_job_id, cancel), status in zip(
                jobs.items(), self.store.status_of(list(jobs)), strict=True
            ):
                if status in (None, "CANCELLED", "TIMED_OUT"):
                    cancel.set()
            if renew:
                for job_id in jobs:
                    self.store.renew(job_id, self.name)
        if beat:
            self.store.beat(self.name, len(jobs), 3 * BEAT_S)


class BrokerErrorLine(logging.Filter):
    """A Redis error (away, full, read-only, a command refused) that Celery or kombu logs,
    as one line that says ``what`` happened, and said once in ``TELL_EVERY_S``: the
    traceback runs through kombu and redis-py only, redis-py's text quotes the refused
    command, which may carry a job's segments, and Celery's reconnect loop says the same
    thing five times a second while a failover lasts."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self.said: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        import redis

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, redis.RedisError):
            record.msg, record.args = "%s: %s", (self.what, why_refused(exc))
        elif type(exc).__name__ == "RestartFreqExceeded":  # Celery pauses a second; says why
            pass
        elif isinstance(record.args, tuple) and any(
            isinstance(a, redis.RedisError) for a in record.args
        ):  # an error as an argument: "Cannot connect to %s: %s."
            record.args = tuple(
                why_refused(a) if isinstance(a, redis.RedisError) else a for a in record.args
            )
        else:
            return True
        record.exc_info, record.exc_text = None, None
        line, now = record.getMessage(), time.monotonic()
        if now - self.said.get(line, -TELL_EVERY_S) < TELL_EVERY_S:
            return False
        self.said[line] = now
        return True


BROKER_ERROR_LINES = {
    "celery.worker": "Celery stopped",  # its "Unrecoverable error"
    "celery.worker.consumer.consumer": "Celery lost the broker",  # it reconnects
    "kombu.asynchronous.hub": "kombu's timer failed (it tries again)",  # "Error in timer"
}


def celery_app(consumer: Consumer, settings: Settings) -> Any:
    """The Celery app whose one task runs jobs in ``consumer``'s hands."""
    app = make_celery(settings)
    # Containers run as root; Celery's warning is about pickle, which this app refuses
    # (accept_content json only), so it says nothing true here.
    from celery.exceptions import SecurityWarning

    warnings.filterwarnings("ignore", category=SecurityWarning)
    for name, what in BROKER_ERROR_LINES.items():
        logging.getLogger(name).addFilter(BrokerErrorLine(what))

    @app.task(name=TASK, bind=True, acks_late=True, max_retries=None)
    def transcribe(task: Any, job_id: str, job_input: Any, webhook: str | None = None) -> None:
        import redis
        from celery.exceptions import Reject

        try:
            consumer.run_task(task, job_id, job_input, webhook)
        except redis.RedisError as exc:
            if not passing(exc):
                raise
            # Redis stayed away (or full) past PERSIST_S: the message goes back, the job
            # runs again.
            raise Reject("the broker is away", requeue=True) from None

    return app


def consume(settings: Settings) -> int:
    """One consumer process: load, take jobs until told to stop or recycled."""
    from handler.faces import webhooks
    from handler.startup import STARTUP_ERRORS, Loader

    try:
        worker = Loader(settings).wait()
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1
    store = JobStore(redis_client(settings), settings.result_ttl_s)
    consumer = Consumer(worker, settings, store)
    try:
        store.loaded(worker.pool.names)
        policy = may_evict_jobs(store.r.info("memory"))
        if policy is not None:  # the gateways refuse new jobs; say why here too
            log.error("consumer %s: %s", consumer.name, evicting_advice(policy))
    except Exception as exc:  # Redis not up yet: Celery waits for it below
        log.warning("consumer %s: cannot reach Redis (%s)", consumer.name, type(exc).__name__)
    app = consumer.celery = celery_app(consumer, settings)
    watcher = threading.Thread(target=consumer.watch, name="broker-watch", daemon=True)
    watcher.start()
    log.info("consumer %s: taking jobs (%d at a time)", consumer.name, settings.concurrency)
    celery_worker = app.Worker(
        pool="threads",
        concurrency=settings.concurrency,
        hostname=f"whisper@{consumer.name}",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        quiet=True,
        redirect_stdouts=False,
        loglevel=settings.log_level,
    )
    # Said at every reconnect while worker_cancel_long_running_tasks_on_connection_loss is
    # False, which it is on purpose: a running job goes on (its record, not the message,
    # holds its one ending), and a job the model has half done is not thrown away. (After
    # the Worker is made: its logging set-up puts Celery's warnings back to "always".)
    warnings.filterwarnings("ignore", message="(?s).*worker_cancel_long_running_tasks_on_conn")
    try:
        celery_worker.start()
    finally:
        consumer.stopping.set()
        watcher.join(timeout=5)
        webhooks.wait_idle(timeout=webhooks.longest_s(settings))
        try:
            store.gone(consumer.name)
        except Exception:
            pass
    if consumer.recycling:
        return RECYCLE_EXIT
    if celery_worker.exitcode:  # Celery's "Unrecoverable error"
        return BROKER_EXIT
    return 0


CONSUMER = [sys.executable, "-m", "handler.faces.broker.consumer"]
"""The consumer process the supervisor runs."""


def supervise(settings: Settings, command: list[str] | None = None) -> int:
    """Run consumers (``command``) one after another: a fresh one when the last recycled
    itself, lost its broker (``BROKER_EXIT``) or was killed; stop (passing the signal on)
    on SIGTERM or SIGINT; the consumer's own status when it cannot start (bad settings or
    model: a fresh one would fail the same way); 0 when it stopped cleanly."""
    child: subprocess.Popen | None = None
    stop = threading.Event()

    def forward(signum: int, _frame: Any) -> None:
        stop.set()
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while not stop.is_set():
        started = time.monotonic()
        child = subprocess.Popen(command or CONSUMER)
        code = child.wait()
        if stop.is_set() or code == 0:
            return 0
        if code == RECYCLE_EXIT:
            continue
        if code == BROKER_EXIT:
            log.warning("consumer %d stopped on a broker error; starting another", child.pid)
            stop.wait(max(0.0, BROKER_PAUSE_S - (time.monotonic() - started)))
            continue
        if code > 0:
            return code  # settings or the model: starting again would fail the same way
        log.warning("consumer %d ended by signal %d; starting another", child.pid, -code)
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    return 0


def broker_settings(no_broker: int = 1) -> Settings | int:
    """The settings of a consumer, or the exit status after one line on stderr saying what
    is wrong: 1 for bad settings, ``no_broker`` when WHISPER_BROKER_URL is unset."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1
    if settings.broker_url is None:
        print(
            "whisper-worker: consume needs WHISPER_BROKER_URL (redis://HOST:PORT/DB)",
            file=sys.stderr,
        )
        return no_broker
    return settings


def main() -> int:
    settings = broker_settings()
    return settings if isinstance(settings, int) else consume(settings)


if __name__ == "__main__":
    sys.exit(main())
