"""The Celery application both sides share: the gateway sends ``whisper.transcribe`` by
name (it imports no model code) and the consumers run it.

At-least-once delivery with Celery's late ack on Redis: a message is acknowledged only
after the job's one result is stored (handler.faces.broker.store); a consumer that dies holding
one leaves it unacknowledged, and Redis hands it out again once ``visibility_timeout``
has passed (kombu sweeps for such messages every ``RESTORE_SWEEP_S``). A job whose consumer
still lives (its lease is fresh) is not run twice: the late copy is put back with a delay.
"""

from __future__ import annotations

from typing import Any

from handler.pipeline.runtime import compute_budget
from handler.settings import Settings

TASK = "whisper.transcribe"
QUEUE = "whisper"
"""The Redis list KEDA's scaler watches (``listName``)."""
UNACKED = "unacked"
"""kombu's Redis hash of delivered, unacknowledged messages (its default key)."""
RESTORE_SWEEP_S = 10
"""How often a consumer looks for messages whose consumer died (seconds)."""


def visibility_timeout_s(settings: Settings) -> float:
    """How long a delivered, unacknowledged message waits before Redis hands it out again:
    ``WHISPER_BROKER_VISIBILITY_S``, else the time an ordinary job may take (download,
    decode, the model's floor budget) and a minute. Longer jobs are safe too: their
    consumer's lease keeps a second consumer from running them."""
    if settings.broker_visibility_s is not None:
        return settings.broker_visibility_s
    floor = compute_budget(settings, 0.0) or 0.0
    return settings.download_timeout_s + settings.decode_timeout_s + floor + 60.0


def make_celery(settings: Settings) -> Any:
    from celery import Celery

    assert settings.broker_url is not None
    url = settings.broker_url.get_secret_value()
    app = Celery("whisper_worker", broker=url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A Redis error reply (ResponseError: a full Redis's OOM, a demoted primary's
        # READONLY, UNBLOCKED when a failover ends a BRPOP) makes the consumer reconnect, as
        # a lost connection does, instead of stopping the worker ("Unrecoverable error").
        broker_channel_error_retry=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_enable_remote_control=False,
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s(settings),
            "unacked_restore_interval": RESTORE_SWEEP_S,
            "unacked_restore_throttle": 1,
            "socket_timeout": 10,
            "socket_connect_timeout": 3,
            "health_check_interval": 15,
        },
    )
    return app


def redis_client(settings: Settings) -> Any:
    """A client for the job records on the broker's Redis (decoded strings)."""
    import redis

    assert settings.broker_url is not None
    return redis.Redis.from_url(
        settings.broker_url.get_secret_value(),
        decode_responses=True,
        socket_timeout=10,
        socket_connect_timeout=3,
        health_check_interval=15,
    )


def evicting_advice(policy: str) -> str:
    """What an operator is told of a Redis that may evict any key at its maxmemory."""
    return (
        f"Redis's maxmemory-policy is {policy}: at its maxmemory it may evict any key, queued "
        "jobs and Celery's queue among them; set maxmemory-policy to noeviction (or "
        "volatile-lru: only ended jobs' results carry a TTL) on the broker's Redis"
    )


def may_evict_jobs(memory_info: dict[str, Any]) -> str | None:
    """The policy of a Redis (its ``INFO memory``) that may evict a job's keys, else None:
    an allkeys-* policy under a maxmemory. A volatile-* one evicts only keys with a TTL,
    and only ended jobs' results have one."""
    policy = str(memory_info.get("maxmemory_policy", "noeviction"))
    if int(memory_info.get("maxmemory", 0) or 0) > 0 and policy.startswith("allkeys"):
        return policy
    return None


OOM = "OOM command not allowed"
READ_ONLY = ("READONLY", "read only replica", "MASTERDOWN")


def passing(exc: Exception) -> bool:
    """A Redis error that passes: Redis away (a restart), at its maxmemory refusing writes
    (redis-py's OutOfMemoryError), or a primary demoted by a failover (ReadOnlyError until
    the client reaches the new one). A Lua script's or a transaction's refused write comes
    as a ResponseError carrying Redis's message."""
    import redis

    if isinstance(
        exc,
        (redis.ConnectionError, redis.TimeoutError, redis.OutOfMemoryError, redis.ReadOnlyError),
    ):
        return True
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and (
        OOM in text or any(mark in text for mark in READ_ONLY)
    )


def why_refused(exc: Exception) -> str:
    """What the log says of a Redis error (never its text: it may carry a job's data)."""
    import redis

    text = str(exc)
    if isinstance(exc, redis.OutOfMemoryError) or OOM in text:
        return "Redis is at its maxmemory and refuses writes"
    if isinstance(exc, redis.ReadOnlyError) or any(mark in text for mark in READ_ONLY):
        return "Redis is a read-only replica (a failover under way?) and refuses writes"
    if isinstance(exc, redis.RedisError) and not isinstance(
        exc, (redis.ConnectionError, redis.TimeoutError)
    ):
        return f"Redis refused a command ({type(exc).__name__})"
    return f"cannot reach Redis ({type(exc).__name__})"
