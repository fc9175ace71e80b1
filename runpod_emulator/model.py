"""Records of the emulated endpoint: one `Job`, one `Worker`, and their JSON views.

Plain data; `state.EndpointState` mutates them under its lock. Records hold timings
and counters only, never job inputs or outputs (they may be large or private).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import IN_QUEUE

NO_OUTPUT: Any = object()
"""Marks "no output" apart from a handler that returned None."""


@dataclass
class Job:
    id: str
    input: Any
    kind: str  # "run" or "runsync": decides the result size limit and retention
    submitted_at: float
    input_bytes: int
    webhook: str | None = None
    execution_timeout_s: float | None = None
    ttl_s: float | None = None
    status: str = IN_QUEUE
    queued_at: float = 0.0
    worker_id: str | None = None
    taken_at: float | None = None
    finished_at: float | None = None
    output: Any = NO_OUTPUT
    error: str | None = None
    progress: Any = NO_OUTPUT
    stream: list[Any] = field(default_factory=list)
    stream_cursor: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    requeues: int = 0
    retries: int = 0
    done_posts: int = 0
    progress_posts: int = 0
    late_posts: int = 0
    result_bytes: int | None = None
    note: str | None = None
    stop_signalled_at: float | None = None
    stop_delivered_at: float | None = None
    expired: bool = False
    webhook_attempts: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """Timings and counters only: inputs and outputs may be large or private."""
        delay = ms_between(self.taken_at, self.submitted_at)
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "worker_id": self.worker_id,
            "submitted_at": self.submitted_at,
            "taken_at": self.taken_at,
            "finished_at": self.finished_at,
            "delay_ms": delay,
            "execution_ms": ms_between(self.finished_at, self.taken_at),
            "attempts": [dict(a) for a in self.attempts],
            "requeues": self.requeues,
            "retries": self.retries,
            "input_bytes": self.input_bytes,
            "result_bytes": self.result_bytes,
            "has_output": self.output is not NO_OUTPUT,
            "error": self.error[:500] if self.error else None,
            "stream_items": len(self.stream),
            "done_posts": self.done_posts,
            "progress_posts": self.progress_posts,
            "late_posts": self.late_posts,
            "note": self.note,
            "stop_signalled_at": self.stop_signalled_at,
            "stop_delivered_at": self.stop_delivered_at,
            "webhook_attempts": [dict(a) for a in self.webhook_attempts],
        }


@dataclass
class Worker:
    id: str
    spawned: bool
    started_at: float | None
    last_seen: float | None = None
    ready_at: float | None = None
    stop_requested_at: float | None = None
    stopped_at: float | None = None
    exit_code: int | None = None
    held: set[str] = field(default_factory=set)
    pending_stops: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    takes: dict[str, int] = field(default_factory=lambda: {"single": 0, "batch": 0})
    stop_polls: list[float] = field(default_factory=list)
    """When each job-stop long-poll arrived: a worker whose event loop is blocked stops
    polling, so the gaps show it (bounded to the last 2000)."""
    pid: int | None = None
    log_path: str | None = None
    stop_pod: bool = False
    unhealthy: dict[str, str] | None = None
    """The fitness check a worker reported failed (its ping's check and reason)."""

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        if self.stop_requested_at is not None:
            return "stopping"
        if self.held:
            return "busy"
        if self.ready_at is None:
            return "starting"
        return "idle"

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spawned": self.spawned,
            "state": self.state,
            "pid": self.pid,
            "log_path": self.log_path,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "stop_requested_at": self.stop_requested_at,
            "stopped_at": self.stopped_at,
            "exit_code": self.exit_code,
            "jobs": list(self.jobs),
            "heartbeats": [dict(h) for h in self.heartbeats],
            "takes": dict(self.takes),
            "stop_polls": list(self.stop_polls),
            "stop_pod": self.stop_pod,
        }


def ms_between(end: float | None, start: float | None) -> int | None:
    if end is None or start is None:
        return None
    return max(0, round((end - start) * 1000))
