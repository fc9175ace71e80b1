"""An autoscaler over the local emulator that behaves like a RunPod flex endpoint.

Active workers run all the time; flex workers start when jobs wait (at once from zero,
then whenever the oldest queued job has waited ``queue_delay_s``) and stop after
``idle_timeout_s`` without a job. Workers are real processes started and stopped through
:class:`runpod_emulator.Emulator`, so their cold starts and drains are real. It also keeps
the per-worker timers the cost contract in :mod:`bench.cost.cost` needs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handler.contract import parse_startup_line
from runpod_emulator import Emulator

log = logging.getLogger(__name__)


# Startup marks of the worker (handler/startup.py) -> keys of the cost contract.
MARKS = {
    "imports_done": "imports_done_at",
    "model_loaded": "model_loaded_at",
    "warmup_done": "warmup_done_at",
    "ready": "startup_ready_at",
    "process_start": "process_start_at",
}


@dataclass
class ScalerConfig:
    """A flex endpoint's scaling settings, with RunPod's defaults."""

    active_workers: int = 0
    """Always running (billed at the active rate), started before anything else."""
    max_workers: int = 3
    """Never more workers alive (starting, running or draining) than this."""
    idle_timeout_s: float = 5.0
    """A flex worker with no job this long is stopped."""
    queue_delay_s: float = 4.0
    """Start one more flex worker when the oldest queued job has waited this long."""
    tick_s: float = 0.1
    """How often the rules are evaluated (the idle timeout is honoured to about this)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every worker this scaler starts."""
    command: list[str] | None = None
    """Worker command; None uses the emulator's (``python -m handler``)."""

    def __post_init__(self) -> None:
        if self.active_workers < 0 or self.max_workers < 1:
            raise ValueError("active_workers must be >= 0 and max_workers >= 1")
        if self.active_workers > self.max_workers:
            raise ValueError("active_workers cannot exceed max_workers")
        if self.idle_timeout_s < 0 or self.queue_delay_s < 0 or self.tick_s <= 0:
            raise ValueError("timeouts must be >= 0 and tick_s > 0")


@dataclass
class _Tracked:
    """What the scaler knows of one of its workers, from the emulator's events."""

    kind: str
    held: int = 0
    last_activity: float | None = None  # ready, or the end of its last job
    stop_reason: str | None = None
    idle_since_at_stop: float | None = None


class Autoscaler:
    """Scales workers of one emulator. ``start()``, run load, ``wait_idle()``, ``stop()``."""

    def __init__(self, emulator: Emulator, config: ScalerConfig | None = None) -> None:
        self.em = emulator
        self.config = config or ScalerConfig()
        self._lock = threading.Lock()
        self._workers: dict[str, _Tracked] = {}
        self._running = threading.Event()
        self._thread: threading.Thread | None = None
        self.decisions: list[dict[str, Any]] = []
        emulator.add_listener(self._on_event)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Autoscaler:
        for _ in range(self.config.active_workers):
            self._spawn("active", "active worker")
        self._running.set()
        self._thread = threading.Thread(target=self._loop, name="autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop scaling, then stop every worker gracefully and wait for them to exit."""
        self._running.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for worker_id in self.alive():
            self._stop_worker(worker_id, "shutdown")
        for worker_id in list(self._workers):
            try:
                self.em.wait_worker(worker_id, "stopped", timeout)
            except TimeoutError:
                log.warning("worker %s did not stop in %.0fs; killing it", worker_id, timeout)
                self.em.kill_worker(worker_id)
                self.em.wait_worker(worker_id, "stopped", 10)

    def __enter__(self) -> Autoscaler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries
    def alive(self, kind: str | None = None) -> list[str]:
        """Our workers not yet stopped (starting, idle, busy or draining)."""
        states = self.em.worker_states()
        with self._lock:
            return [
                w
                for w, t in self._workers.items()
                if states.get(w) != "stopped" and (kind is None or t.kind == kind)
            ]

    def wait_ready(self, kind: str, timeout: float) -> None:
        """Block until every alive worker of this kind has asked for a job."""
        for worker_id in self.alive(kind):
            self.em.wait_worker(worker_id, {"idle", "busy"}, timeout)

    def wait_scaled_down(self, timeout: float) -> bool:
        """Wait until no flex worker is alive (scale to zero); False on timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive("flex"):
                return True
            time.sleep(0.1)
        return not self.alive("flex")

    def worker_records(self) -> list[dict[str, Any]]:
        """One dict per worker in the cost contract's shape (jobs are added by the harness).

        started_at/stopped_at are the emulator's (spawn and process exit: the billed
        lifetime), ready_at its first job request; the start-up marks come from the
        worker's ``startup {...}`` log line when it wrote one.
        """
        recs = self.em.records()["workers"]
        out = []
        with self._lock:
            tracked = dict(self._workers)
        for worker_id, t in tracked.items():
            r = recs[worker_id]
            row: dict[str, Any] = {
                "id": worker_id,
                "kind": t.kind,
                "started_at": r["started_at"],
                "ready_at": r["ready_at"],
                "stop_requested_at": r["stop_requested_at"],
                "stopped_at": r["stopped_at"],
                "exit_code": r["exit_code"],
                "stop_reason": t.stop_reason,
                "idle_since": t.idle_since_at_stop,
                "job_ids": list(r["jobs"]),
            }
            row.update(startup_marks(r.get("log_path")))
            out.append(row)
        return out

    # ------------------------------------------------------------------ internals
    def _on_event(self, event: Mapping[str, Any]) -> None:
        worker_id = event.get("worker_id")
        with self._lock:
            t = self._workers.get(worker_id or "")
            if t is None:
                return
            kind = event["type"]
            if kind == "worker_ready":
                t.last_activity = event["t"]
            elif kind == "job_taken":
                t.held += 1
            elif kind == "job_finished":
                t.held = max(0, t.held - 1)
                t.last_activity = event["t"]

    def _spawn(self, kind: str, reason: str) -> str:
        worker_id = self.em.start_worker(self.config.env, command=self.config.command)
        with self._lock:
            self._workers[worker_id] = _Tracked(kind)
        self.decisions.append(
            {
                "t": time.time(),
                "action": "start",
                "worker_id": worker_id,
                "kind": kind,
                "reason": reason,
            }
        )
        log.info("autoscaler: started %s worker %s (%s)", kind, worker_id, reason)
        return worker_id

    def _stop_worker(self, worker_id: str, reason: str) -> None:
        with self._lock:
            t = self._workers[worker_id]
            if t.stop_reason is not None:
                return
            t.stop_reason = reason
            t.idle_since_at_stop = t.last_activity
        self.decisions.append(
            {"t": time.time(), "action": "stop", "worker_id": worker_id, "reason": reason}
        )
        log.info("autoscaler: stopping worker %s (%s)", worker_id, reason)
        self.em.stop_worker(worker_id, graceful=True)

    def _loop(self) -> None:
        while self._running.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - scaling must go on after a bug
                log.exception("autoscaler tick")
            time.sleep(self.config.tick_s)

    def tick(self) -> None:
        """Evaluate the rules once: stop idle flex workers, then scale up if needed."""
        now = time.time()
        states = self.em.worker_states()
        with self._lock:
            mine = {w: t for w, t in self._workers.items() if states.get(w) != "stopped"}
        for worker_id, t in mine.items():
            # The emulator's state and our event count must both say idle: an event for a
            # job that just ended may still be on its way.
            idle = states.get(worker_id) == "idle" and t.held == 0
            if (
                t.kind == "flex"
                and idle
                and t.stop_reason is None
                and t.last_activity is not None
                and now - t.last_activity >= self.config.idle_timeout_s
            ):
                self._stop_worker(worker_id, f"idle {now - t.last_activity:.1f}s")
        alive = list(mine)
        if len(alive) >= self.config.max_workers:
            return
        queued = self.em.queue_length()
        if queued == 0:
            return
        serving = [w for w in alive if states.get(w) in ("starting", "idle", "busy")]
        if not serving:
            self._spawn("flex", f"{queued} queued, no worker")
            return
        starting = sum(1 for w in serving if states.get(w) == "starting")
        delay = self.em.queue_delay()
        # One more worker per evaluation, and no more starting than jobs waiting for them.
        if delay >= self.config.queue_delay_s and starting < queued:
            self._spawn("flex", f"queue delay {delay:.1f}s, {queued} queued")


def startup_marks(log_path: str | None) -> dict[str, float]:
    """The epoch marks of the worker's ``startup {...}`` log line, as contract keys."""
    if not log_path:
        return {}
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if (data := parse_startup_line(line)) is not None:
                    marks = dict(data.get("marks") or {})
                    if "process_start" in data:
                        marks.setdefault("process_start", data["process_start"])
                    return {MARKS[k]: float(v) for k, v in marks.items() if k in MARKS}
    except (OSError, ValueError) as exc:
        log.warning("cannot read start-up marks from %s: %s", log_path, exc)
    return {}
