"""The flex autoscaler over the emulator, with real runpod SDK worker processes.

The workers are tests/fake_workers/bench_worker.py (the real SDK loop, no model), so a
cold start is the SDK's import plus FAKE_STARTUP_S. Every wait is bounded; each test
stops its autoscaler and emulator by itself.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.cost.autoscaler import Autoscaler, ScalerConfig, startup_marks
from bench.cost.cost import Worker, peak_concurrent_workers
from runpod_emulator import Emulator

pytestmark = pytest.mark.e2e

FAKE = Path(__file__).parent.parent / "fake_workers" / "bench_worker.py"
READY_S = 60.0  # import runpod takes seconds; more on a loaded machine


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    em = Emulator(
        worker_command=[sys.executable, str(FAKE)],
        worker_env={"FAKE_STARTUP_S": "0.3"},
        ping_interval_ms=1000,
        stop_grace_s=15.0,
        log_dir=str(tmp_path),
    )
    with em:
        yield em


class EventLog:
    """Every emulator event, and how many workers were alive at the worst moment."""

    def __init__(self, em: Emulator) -> None:
        self.events: list[dict[str, Any]] = []
        self.alive = 0
        self.peak = 0
        self._lock = threading.Lock()
        em.add_listener(self)

    def __call__(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)
            if event["type"] == "worker_started":
                self.alive += 1
                self.peak = max(self.peak, self.alive)
            elif event["type"] == "worker_stopped":
                self.alive -= 1

    def finished(self) -> Counter[str]:
        with self._lock:
            return Counter(e["job_id"] for e in self.events if e["type"] == "job_finished")


def _contract_worker(row: dict[str, Any]) -> Worker:
    return Worker.from_dict({**row, "jobs": []})


def test_scale_from_zero_then_idle_stop_within_a_second(emulator: Emulator) -> None:
    idle = 2.0
    scaler = Autoscaler(emulator, ScalerConfig(max_workers=2, idle_timeout_s=idle)).start()
    try:
        time.sleep(0.5)
        assert emulator.worker_states() == {}, "a flex endpoint starts with no worker"
        submitted = time.time()
        job = emulator.submit({"sleep": 0.2})
        status = emulator.wait_job(job, READY_S)
        assert status["status"] == "COMPLETED"
        start = scaler.decisions[0]
        assert start["action"] == "start" and start["kind"] == "flex"
        # Scale from zero does not wait for the queue-delay threshold (4 s).
        assert start["t"] - submitted < 1.0
        assert scaler.wait_scaled_down(idle + 20.0)
    finally:
        scaler.stop()
    records = emulator.records()
    (row,) = scaler.worker_records()
    finished = records["jobs"][job]["finished_at"]
    gap = row["stop_requested_at"] - finished
    assert idle <= gap <= idle + 1.0, f"stopped {gap:.2f}s after its last job, timeout {idle}s"
    assert row["stopped_at"] >= row["stop_requested_at"]
    assert row["stop_reason"].startswith("idle")
    assert row["ready_at"] is not None and row["started_at"] < row["ready_at"]
    # The start-up line of the worker gives the cold-start split.
    assert row["started_at"] - 1 < row["imports_done_at"] <= row["model_loaded_at"]
    assert row["model_loaded_at"] <= row["warmup_done_at"] <= row["ready_at"]
    _contract_worker(row)


def test_burst_stays_under_max_workers_and_loses_no_job(emulator: Emulator) -> None:
    log = EventLog(emulator)
    config = ScalerConfig(max_workers=2, idle_timeout_s=1.0, queue_delay_s=0.5)
    scaler = Autoscaler(emulator, config).start()
    try:
        jobs = [emulator.submit({"sleep": 0.4}) for _ in range(10)]
        statuses = [emulator.wait_job(j, READY_S)["status"] for j in jobs]
        assert scaler.wait_scaled_down(20.0)
    finally:
        scaler.stop()
    assert statuses == ["COMPLETED"] * len(jobs)
    finished = log.finished()
    assert all(finished[j] == 1 for j in jobs), "every job ends exactly once"
    assert set(finished) == set(jobs)
    assert log.peak == 2, "the burst should scale to max_workers and no further"
    workers = [_contract_worker(r) for r in scaler.worker_records()]
    assert peak_concurrent_workers(workers) <= 2
    starts = [d for d in scaler.decisions if d["action"] == "start"]
    assert len(starts) == len(workers) >= 2


def test_active_worker_keeps_running(emulator: Emulator) -> None:
    config = ScalerConfig(active_workers=1, max_workers=1, idle_timeout_s=0.5)
    scaler = Autoscaler(emulator, config).start()
    try:
        scaler.wait_ready("active", READY_S)
        (active,) = scaler.alive("active")
        assert emulator.wait_job(emulator.submit({"sleep": 0.1}), 30)["status"] == "COMPLETED"
        time.sleep(2.0)  # four idle timeouts
        assert emulator.worker_state(active) == "idle"
        assert scaler.alive("flex") == []
    finally:
        scaler.stop()
    (row,) = scaler.worker_records()
    assert row["kind"] == "active" and row["stop_reason"] == "shutdown"
    assert row["stopped_at"] is not None


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        ScalerConfig(active_workers=4, max_workers=3)
    with pytest.raises(ValueError):
        ScalerConfig(max_workers=0)


def test_startup_marks_parse_the_worker_line(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text(
        "noise\n2024-01-01 INFO handler.startup: startup "
        '{"process_start": 10.0, "marks": {"imports_done": 11.5, "model_loaded": 12.0,'
        ' "warmup_done": 12.5, "ready": 12.6}}\n'
    )
    assert startup_marks(str(log)) == {
        "process_start_at": 10.0,
        "imports_done_at": 11.5,
        "model_loaded_at": 12.0,
        "warmup_done_at": 12.5,
        "startup_ready_at": 12.6,
    }
    assert startup_marks(str(tmp_path / "missing.log")) == {}
    assert startup_marks(None) == {}
