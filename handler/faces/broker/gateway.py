"""HTTP mode with ``WHISPER_BROKER_URL``: RunPod's job API over the broker. The gateway
loads no model: ``/run`` stores the job's record in Redis and queues it (Celery), the
consumers (handler.faces.broker.consumer) run it, and ``/status``, ``/stream``, ``/cancel``,
``/health`` and ``/purge-queue`` read and change the records in Redis, so any gateway
replica answers for any job, and a restarted one for every job until its TTL.

An input that can never run (it fails the job schema) is FAILED at once with its error
code and never queued; a broker that cannot be reached is a 503 with nothing queued.

OpenAI's audio routes (``stream=true`` too: the consumer's segments as they land in
Redis) and ``/v1/jobs`` go the same way and wait for the result (``BrokerJobs.result``;
the job is cancelled when the caller leaves); live audio (``/v1/realtime``) needs the
model in the same process and is refused with a clear error here.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from handler.errors import Code, WorkerError
from handler.faces.broker.queue import (
    QUEUE,
    TASK,
    evicting_advice,
    make_celery,
    redis_client,
    why_refused,
)
from handler.faces.broker.store import (
    MODELS,
    REDIS_MEMORY_HEADROOM,
    EndedJob,
    JobStore,
    Snapshot,
)
from handler.settings import Settings

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often ``/runsync`` and ``/stream`` look at a running job's record (seconds)."""
STREAM_HOLD_S = 1.0
STREAM_POLL_S = 0.2
"""How often a gateway's OpenAI stream looks for the consumer's new segments (seconds)."""


MEMORY_ADVICE = (
    "ended jobs' results stay WHISPER_RESULT_TTL_S; raise Redis's maxmemory, lower the TTL "
    "or add consumers"
)


BROKER_GONE = "the job broker (Redis) cannot be reached; retry later"
UNTRUSTED = (
    "the broker cannot be reached: its TLS certificate is not trusted (or not for this "
    "host); name its CA in WHISPER_BROKER_URL: ?ssl_cert_reqs=required&ssl_ca_certs=PATH"
)


EVICTING = (
    "the job broker's Redis may evict jobs (its maxmemory-policy); nothing was queued; retry later"
)


class BrokerDown(Exception):
    """Redis (or the queue in it) cannot be reached, or may not be trusted with a job;
    nothing was queued. ``reason``: what the caller is told, when not BROKER_GONE."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def _refusal(job_input: Any) -> dict[str, Any] | None:
    """The error result of an input that can never succeed, without a model: the job
    schema's verdict (an OpenAI passthrough job is checked by the consumer)."""
    from handler.faces.openai_api import is_passthrough
    from handler.schema import parse_job_input

    if is_passthrough(job_input):
        return None
    try:
        parse_job_input(job_input)
    except WorkerError as exc:
        return exc.to_result()
    return None


class BrokerJobs:
    """The job API's store (as handler.faces.jobs.Jobs) over Redis; its calls block on the
    network, so handler.faces.runpod_api runs them in threads."""

    blocking = True

    def __init__(self, settings: Settings, store: JobStore | None = None) -> None:
        self.settings = settings
        self.store = store or JobStore(redis_client(settings), settings.result_ttl_s)
        self.celery = make_celery(settings)
        self._told_memory = self._told_evicting = -60.0
        self.celery.conf.task_publish_retry_policy = {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
        }

    def _guarded(self, call: Any, *args: Any) -> Any:
        import redis
        from kombu.exceptions import OperationalError

        try:
            return call(*args)
        except redis.exceptions.OutOfMemoryError:
            log.warning("Redis is at its maxmemory and refuses writes: %s", MEMORY_ADVICE)
            raise BrokerDown from None
        except (redis.RedisError, OperationalError, OSError) as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                log.warning(UNTRUSTED)
            else:  # e.g. "Redis is a read-only replica (a failover under way?)"
                log.warning("the broker refused or cannot be reached: %s", why_refused(exc))
            raise BrokerDown from None

    def _tell_memory_full(self) -> None:
        """Say why jobs are refused, once a minute at most (a full Redis refuses many)."""
        now = time.monotonic()
        if now - self._told_memory >= 60:
            self._told_memory = now
            log.warning(
                "new jobs refused (429): Redis holds over %d%% of its maxmemory; %s",
                round(REDIS_MEMORY_HEADROOM * 100),
                MEMORY_ADVICE,
            )

    def _tell_evicting(self) -> None:
        """Say, once a minute at most, that Redis's policy refuses every job."""
        now = time.monotonic()
        if now - self._told_evicting >= 60:
            self._told_evicting = now
            policy = self.store.r.info("memory").get("maxmemory_policy", "?")
            log.error("new jobs refused (503): %s", evicting_advice(policy))

    def ping(self) -> bool:
        try:
            return bool(self._guarded(self.store.r.ping))
        except BrokerDown:
            return False

    def submit(self, job_input: Any, input_bytes: int, webhook: str | None) -> Snapshot:
        """Queue a job (StoreFull past WHISPER_RESULT_MAX_JOBS queued jobs or
        WHISPER_RESULT_MAX_BYTES of their inputs: Redis is not filled by one caller)."""
        return self._guarded(self._submit, job_input, input_bytes, webhook)

    def _submit(self, job_input: Any, size: int, webhook: str | None) -> Snapshot:
        from handler.faces.jobs import StoreFull

        job_id = uuid.uuid4().hex
        bounds = (self.settings.result_max_jobs, self.settings.result_max_bytes)
        admitted = self.store.create(job_id, webhook, size, bounds, job_input)
        if admitted == -2:
            self._tell_evicting()
            raise BrokerDown(EVICTING)
        if admitted == -1:
            self._tell_memory_full()
        if admitted != 1:
            raise StoreFull
        refused = _refusal(job_input)
        if refused is not None:
            error = refused.pop("error")
            self.store.end(job_id, "FAILED", refused, error)
            snap = self.store.get(job_id)
            assert snap is not None
            if webhook:
                from handler.faces import webhooks

                webhooks.deliver(EndedJob(snap, webhook, self.store), self.settings)
            return snap
        try:
            self.celery.send_task(
                TASK, args=[job_id, job_input, webhook], queue=QUEUE, task_id=job_id
            )
        except BaseException:
            try:
                self.store.forget(job_id)
            finally:
                raise
        return Snapshot(job_id, {"status": "IN_QUEUE", "submitted": repr(time.time())})

    def get(self, job_id: str) -> Snapshot | None:
        return self._guarded(self.store.get, job_id)

    async def wait(self, snap: Snapshot, timeout_s: float) -> Snapshot:
        deadline = time.monotonic() + timeout_s
        while not snap.ended and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            fresh = await asyncio.to_thread(self.get, snap.id)
            if fresh is None:
                break
            snap = fresh
        return snap

    async def take_stream(self, snap: Snapshot) -> dict[str, Any]:
        deadline = time.monotonic() + STREAM_HOLD_S
        while True:
            items = await asyncio.to_thread(self._guarded, self.store.take_stream, snap.id)
            if items or snap.ended or time.monotonic() >= deadline:
                break
            await asyncio.sleep(POLL_S * 4)
            fresh = await asyncio.to_thread(self.get, snap.id)
            snap = fresh if fresh is not None else snap
        return {"id": snap.id, "status": snap.status, "stream": [{"output": i} for i in items]}

    def models(self) -> list[str]:
        """The models the consumers have loaded (each adds its own at start; [] until one
        has started: a name is then checked by the consumer that runs the job)."""
        return sorted(self._guarded(self.store.r.smembers, MODELS))

    async def result(
        self,
        job_input: Any,
        gone: Callable[[], Awaitable[bool]],
        audio: bytes | None = None,
        on_segment: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """Run ``job_input`` (with an uploaded ``audio``) on a consumer and wait for its
        result, as the HTTP face's own engine answers it (an error result on failure),
        handing ``on_segment`` each segment as the consumer streams it; cancelled when
        ``gone()`` says the caller left. A broker that holds as many jobs as it may, or
        cannot be reached, gives the error result of QUEUE_FULL or NOT_READY (retryable)."""
        from handler.faces.jobs import StoreFull

        if audio is not None:
            job_input = {**job_input, "audio_base64": base64.b64encode(audio).decode()}
        try:
            return await self._result(job_input, gone, on_segment)
        except StoreFull:
            message = "the job broker holds as many waiting jobs as it may; retry later"
            return WorkerError(Code.QUEUE_FULL, message).to_result()
        except BrokerDown as exc:
            return WorkerError(Code.NOT_READY, exc.reason or BROKER_GONE).to_result()

    async def _result(
        self,
        job_input: Any,
        gone: Callable[[], Awaitable[bool]],
        on_segment: Callable[[dict[str, Any]], None] | None,
    ) -> Any:
        size = len(str(job_input.get("audio_base64", ""))) if isinstance(job_input, dict) else 0
        snap = await asyncio.to_thread(self.submit, job_input, size, None)
        while not snap.ended:
            snap = await self.wait(snap, 1.0 if on_segment is None else STREAM_POLL_S)
            if on_segment is not None:
                for item in await asyncio.to_thread(self._guarded, self.store.take_stream, snap.id):
                    on_segment(item["segment"])
            if not snap.ended and await gone():
                await asyncio.to_thread(self.cancel, snap)
                break
        out = snap.status_object()
        if snap.status == "COMPLETED":
            return out.get("output")
        if snap.status == "FAILED":
            return {"error": out.get("error", "the job failed"), **(out.get("output") or {})}
        return WorkerError(Code.CANCELLED, f"the job was {snap.status.lower()}").to_result()

    def cancel(self, snap: Snapshot) -> dict[str, Any]:
        self._guarded(self.store.cancel, snap.id)
        fresh = self.get(snap.id) or snap
        return {"id": fresh.id, "status": fresh.status}

    def delete(self, snap: Snapshot) -> bool:
        return bool(self._guarded(self.store.delete, snap.id))

    def purge(self) -> int:
        return self._guarded(self.store.purge)

    def health(self) -> dict[str, Any]:
        return self._guarded(self.store.health)
