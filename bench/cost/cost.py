"""Cost of a benchmark run: billed seconds, where they went, and flex against active.

Pure arithmetic on the timers record the harness writes (its contract is defined here:
:class:`Record`, :class:`Worker`, :class:`Job`) and the user's per-second rates. No price
is written into this module: every rate comes in through :class:`Rates`.

Billing model (RunPod serverless, per its docs): each worker is billed per second from
the moment it starts until it has fully stopped, rounded up per worker, idle time before
scale-down included. Flex workers scale to zero; active workers bill all the time at
their own (usually lower) rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

WorkerKind = Literal["flex", "active"]

# Timers are floats: a lifetime that is really a whole number of seconds can come out a few
# ulps above it after arithmetic (0.02 + 2 + 0.1 * 3 - 0.32 = 2.0000000000000004) and would
# bill a whole extra second. Within a microsecond of a whole second (far below what the
# clocks resolve between processes) counts as that second.
_ROUNDING_SLACK_S = 1e-6


# --------------------------------------------------------------------------- record contract


@dataclass(frozen=True)
class Job:
    """One job as a worker saw it. Times are epoch seconds (floats).

    ``submitted_at`` is the scheduled hand-off to the platform (LoadGen's query issue
    time), ``taken_at`` when the worker took it, ``finished_at`` when its answer was
    posted. ``timings`` are the worker's own phase durations in seconds
    (fetch, decode, queue_model, transcribe, format, total; more keys allowed).
    """

    id: str
    submitted_at: float
    taken_at: float
    finished_at: float
    audio_seconds: float
    ok: bool
    timings: dict[str, float] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Job:
        timings = d.get("timings")
        return cls(
            id=str(d["id"]),
            submitted_at=float(d["submitted_at"]),
            taken_at=float(d["taken_at"]),
            finished_at=float(d["finished_at"]),
            audio_seconds=float(d.get("audio_seconds") or 0.0),
            ok=bool(d["ok"]),
            timings=None if timings is None else {k: float(v) for k, v in timings.items()},
        )


@dataclass(frozen=True)
class Worker:
    """One worker process from start to stop. Times are epoch seconds (floats).

    The optional markers split the cold start (started -> ready) into its parts; a worker
    that never became ready has ``ready_at`` None and all its billed time is cold.
    """

    id: str
    kind: WorkerKind
    started_at: float
    ready_at: float | None
    stopped_at: float
    jobs: tuple[Job, ...] = ()
    imports_done_at: float | None = None
    model_loaded_at: float | None = None
    warmup_done_at: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Worker:
        kind = d["kind"]
        if kind not in ("flex", "active"):
            raise ValueError(f"worker {d['id']!r}: kind must be 'flex' or 'active', not {kind!r}")

        def opt(key: str) -> float | None:
            v = d.get(key)
            return None if v is None else float(v)

        return cls(
            id=str(d["id"]),
            kind=kind,
            started_at=float(d["started_at"]),
            ready_at=opt("ready_at"),
            stopped_at=float(d["stopped_at"]),
            jobs=tuple(Job.from_dict(j) for j in d.get("jobs", ())),
            imports_done_at=opt("imports_done_at"),
            model_loaded_at=opt("model_loaded_at"),
            warmup_done_at=opt("warmup_done_at"),
        )


@dataclass(frozen=True)
class Record:
    """The timers of one run: every worker and the measurement window."""

    workers: tuple[Worker, ...]
    window_start: float
    window_end: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        return cls(
            workers=tuple(Worker.from_dict(w) for w in d["workers"]),
            window_start=float(d["window"]["start"]),
            window_end=float(d["window"]["end"]),
        )

    @property
    def jobs(self) -> list[Job]:
        return [j for w in self.workers for j in w.jobs]


def as_record(record: Record | Mapping[str, Any]) -> Record:
    """Accept the parsed JSON dict or an already built :class:`Record`."""
    return record if isinstance(record, Record) else Record.from_dict(record)


# --------------------------------------------------------------------------- rates and split


@dataclass(frozen=True)
class Rates:
    """Per-second prices the user pays; nothing here has a default price on purpose."""

    flex_per_s: float
    active_per_s: float
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.flex_per_s < 0 or self.active_per_s < 0:
            raise ValueError("rates must not be negative")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rates:
        """From a small config mapping; unknown keys are an error (a typo is not a price)."""
        unknown = set(d) - {"flex_per_s", "active_per_s", "currency"}
        if unknown:
            raise ValueError(f"unknown rate keys: {sorted(unknown)}")
        return cls(float(d["flex_per_s"]), float(d["active_per_s"]), str(d.get("currency", "USD")))

    def per_s(self, kind: WorkerKind) -> float:
        return self.flex_per_s if kind == "flex" else self.active_per_s


@dataclass(frozen=True)
class Split:
    """A worker's billed seconds split into cold, working and idle; they add to billed."""

    cold: float
    working: float
    idle: float

    @property
    def billed(self) -> float:
        return self.cold + self.working + self.idle

    def shares(self) -> dict[str, float]:
        b = self.billed
        if b <= 0:
            return {"cold": 0.0, "working": 0.0, "idle": 0.0}
        return {"cold": self.cold / b, "working": self.working / b, "idle": self.idle / b}

    def __add__(self, other: Split) -> Split:
        return Split(self.cold + other.cold, self.working + other.working, self.idle + other.idle)


def as_worker(worker: Worker | Mapping[str, Any]) -> Worker:
    return worker if isinstance(worker, Worker) else Worker.from_dict(worker)


def billed_seconds(worker: Worker | Mapping[str, Any]) -> int:
    """Whole seconds billed: ceil(stopped_at - started_at), idle before scale-down included."""
    worker = as_worker(worker)
    lifetime = max(0.0, worker.stopped_at - worker.started_at)
    return max(0, math.ceil(lifetime - _ROUNDING_SLACK_S))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [a, b] intervals: overlapping stretches count once."""
    total = 0.0
    cur_a: float | None = None
    cur_b = 0.0
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if cur_a is None or a > cur_b:
            if cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None:
        total += cur_b - cur_a
    return total


def time_split(worker: Worker | Mapping[str, Any]) -> Split:
    """Split the billed seconds into cold (started -> ready), working and idle.

    Working is the union of the worker's job intervals (taken -> finished), clipped to
    the time after it was ready, so concurrent jobs are not counted twice. Idle is the
    rest of the *billed* time, so it includes the rounding up to a whole second.
    """
    worker = as_worker(worker)
    billed = float(billed_seconds(worker))
    lifetime = max(0.0, worker.stopped_at - worker.started_at)
    if worker.ready_at is None:
        cold = lifetime
    else:
        cold = min(max(0.0, worker.ready_at - worker.started_at), lifetime)
    open_at = worker.started_at + cold
    working = union_length(
        (max(j.taken_at, open_at), min(j.finished_at, worker.stopped_at)) for j in worker.jobs
    )
    return Split(cold=cold, working=working, idle=max(0.0, billed - cold - working))


def peak_concurrent_workers(workers: Sequence[Worker]) -> int:
    """Most workers alive (started, not yet stopped) at the same moment."""
    # A stop and a start at the same instant do not overlap: stops sort first.
    events = sorted(
        [(w.started_at, 1) for w in workers] + [(w.stopped_at, -1) for w in workers],
        key=lambda e: (e[0], e[1]),
    )
    peak = cur = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


# --------------------------------------------------------------------------- break-even


@dataclass(frozen=True)
class BreakEven:
    """Load above which an always-on active worker costs less than flex workers.

    ``load`` is in audio hours per wall-clock hour (audio seconds per second) for ONE
    active worker; N active workers break even at N times it. ``utilisation`` is the
    share of its time that one active worker is working at that load. ``reachable`` is
    False when that would take more than 100 % utilisation: at the measured overhead,
    flex is then cheaper at any load one worker can serve.
    """

    load: float
    utilisation: float
    flex_billed_s_per_audio_s: float
    reachable: bool


def break_even(
    rates: Rates,
    *,
    working_s_per_audio_s: float,
    overhead_s_per_job: float,
    audio_s_per_job: float,
) -> BreakEven:
    """Break-even load of one active worker against flex workers.

    Inputs, measured on a flex run:
      w = working_s_per_audio_s   billed working seconds per audio second
      o = overhead_s_per_job      billed cold + idle seconds per job
      a = audio_s_per_job         mean audio seconds per job

    Flex bills k = w + o / a seconds per audio second, so at a load of L audio seconds
    per second it costs flex_per_s * k * L per second. One active worker costs
    active_per_s per second whatever the load. They are equal at

        L* = active_per_s / (flex_per_s * k)          (audio hours per hour)

    and the active worker is then busy u* = w * L* of the time, which is the same as
    u* = (active_per_s / flex_per_s) * (w / k): the price ratio times the share of flex
    billed time that is working. Active wins above L* as long as u* <= 1.

    The model keeps o fixed at its measured value. In reality o falls as load rises
    (fewer cold starts, shorter idle gaps), so a break-even computed from a light-load
    run is pessimistic for flex; compare runs at two loads.
    """
    if working_s_per_audio_s <= 0 or audio_s_per_job <= 0:
        raise ValueError("working seconds and audio seconds per job must be positive")
    if rates.flex_per_s <= 0:
        raise ValueError("flex rate must be positive to compare against it")
    k = working_s_per_audio_s + max(0.0, overhead_s_per_job) / audio_s_per_job
    load = rates.active_per_s / (rates.flex_per_s * k)
    util = working_s_per_audio_s * load
    return BreakEven(load=load, utilisation=util, flex_billed_s_per_audio_s=k, reachable=util <= 1)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class WorkerCost:
    id: str
    kind: WorkerKind
    billed_s: int
    cold_s: float
    working_s: float
    idle_s: float
    cost: float
    jobs: int


@dataclass(frozen=True)
class CostReport:
    """Everything the table, the plots and the production record need about cost.

    Per-job and per-audio-hour figures divide by *successful* jobs and their audio: what
    failed was still billed, and that cost is carried by what was delivered. They are
    None when no job succeeded.
    """

    currency: str
    flex_per_s: float
    active_per_s: float
    workers: list[WorkerCost]
    jobs: int
    ok_jobs: int
    audio_s: float
    window_s: float
    billed_s: int
    split: Split
    total_cost: float
    cost_per_job: float | None
    cost_per_audio_hour: float | None
    load: float
    """Audio seconds of successful jobs per second of the window (= audio hours per hour)."""
    active_workers: int
    active_cost: float
    active_cost_per_audio_hour: float | None
    break_even: BreakEven | None = None
    shares: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    record: Record | Mapping[str, Any], rates: Rates, *, active_workers: int | None = None
) -> CostReport:
    """Cost of the run as billed, and what N active workers would cost for its window.

    ``active_workers`` is N, the active workers needed to serve this load; by default the
    most workers that were alive at once in the run. Each is billed for the whole
    window, rounded up to a whole second, at the active rate.
    """
    rec = as_record(record)
    per_worker: list[WorkerCost] = []
    total_split = Split(0.0, 0.0, 0.0)
    total_cost = 0.0
    for w in rec.workers:
        s = time_split(w)
        billed = billed_seconds(w)
        cost = billed * rates.per_s(w.kind)
        total_split = total_split + s
        total_cost += cost
        per_worker.append(
            WorkerCost(w.id, w.kind, billed, s.cold, s.working, s.idle, cost, len(w.jobs))
        )

    jobs = rec.jobs
    ok = [j for j in jobs if j.ok]
    audio_s = sum(j.audio_seconds for j in ok)
    audio_h = audio_s / 3600.0
    window_s = max(0.0, rec.window_end - rec.window_start)
    n_active = peak_concurrent_workers(rec.workers) if active_workers is None else active_workers
    window_billed = max(0, math.ceil(window_s - _ROUNDING_SLACK_S))
    active_cost = n_active * window_billed * rates.active_per_s

    be: BreakEven | None = None
    if ok and audio_s > 0 and total_split.working > 0 and rates.flex_per_s > 0:
        be = break_even(
            rates,
            working_s_per_audio_s=total_split.working / audio_s,
            overhead_s_per_job=(total_split.cold + total_split.idle) / len(ok),
            audio_s_per_job=audio_s / len(ok),
        )

    return CostReport(
        currency=rates.currency,
        flex_per_s=rates.flex_per_s,
        active_per_s=rates.active_per_s,
        workers=per_worker,
        jobs=len(jobs),
        ok_jobs=len(ok),
        audio_s=audio_s,
        window_s=window_s,
        billed_s=sum(wc.billed_s for wc in per_worker),
        split=total_split,
        total_cost=total_cost,
        cost_per_job=total_cost / len(ok) if ok else None,
        cost_per_audio_hour=total_cost / audio_h if audio_h > 0 else None,
        load=audio_s / window_s if window_s > 0 else 0.0,
        active_workers=n_active,
        active_cost=active_cost,
        active_cost_per_audio_hour=active_cost / audio_h if audio_h > 0 else None,
        break_even=be,
        shares=total_split.shares(),
    )


def flex_cost_per_audio_hour(rates: Rates, flex_billed_s_per_audio_s: float) -> float:
    """Flex cost of one audio hour when k billed seconds are paid per audio second."""
    return rates.flex_per_s * flex_billed_s_per_audio_s * 3600.0


def active_cost_per_audio_hour(rates: Rates, load: float, active_workers: int = 1) -> float:
    """Active cost of one audio hour at ``load`` audio hours per hour (inf at zero load)."""
    if load <= 0:
        return math.inf
    # N workers bill N * rate * 3600 per hour and deliver ``load`` audio hours in it.
    return active_workers * rates.active_per_s * 3600.0 / load
