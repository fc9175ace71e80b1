"""Run a schedule of queries against an endpoint and record every timer.

Local: the emulator, the autoscaler and real worker processes; worker lifetimes and job
hand-offs come from the emulator. Remote: a real RunPod endpoint through
:class:`whisper_client.Client`; job timings come from ``/status`` (``delayTime``,
``executionTime``) and worker lifetimes can only be estimated. Either way the result is
one record in the contract of :mod:`bench.cost.cost`, with per-job worker timings added.

Latency is LoadGen's: from a query's *scheduled* hand-off (``submitted_at``) to the
answer, so a slow sender never flatters the numbers.
"""

from __future__ import annotations

import base64
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol

from bench.common.scenarios import Arrival
from bench.cost.autoscaler import Autoscaler, ScalerConfig
from handler.contract import TERMINAL_JOB_STATES
from runpod_emulator import Emulator
from speech_assets.clips import wer
from whisper_client.client import Client, ClientError

log = logging.getLogger(__name__)

TERMINAL = TERMINAL_JOB_STATES
PROBE_INPUT = {"audio_base64": base64.b64encode(b"this is not audio").decode()}


class Target(Protocol):
    """Where jobs go: ``submit`` returns a job id, ``wait`` its final status object."""

    def submit(self, job_input: dict[str, Any]) -> str: ...

    def wait(self, job_id: str, timeout: float) -> dict[str, Any]: ...

    def describe(self) -> str: ...


class EndpointTarget:
    """Any endpoint speaking RunPod's public API (`/run`, `/status`), one client per thread."""

    def __init__(self, endpoint_id: str, api_key: str | None, base_url: str) -> None:
        self._args = (endpoint_id, api_key, base_url)
        self._local = threading.local()
        self.client().close()  # fail early on a bad id, key or URL

    def client(self) -> Client:
        c = getattr(self._local, "client", None)
        if c is None:
            endpoint_id, api_key, base_url = self._args
            c = self._local.client = Client(
                endpoint_id, api_key, base_url, poll_initial_s=0.25, poll_max_s=2.0
            )
        return c

    def submit(self, job_input: dict[str, Any]) -> str:
        return self.client().run(job_input)

    def wait(self, job_id: str, timeout: float) -> dict[str, Any]:
        return self.client().wait(job_id, timeout=timeout)

    def describe(self) -> str:
        return self.client().url


class LocalTarget(EndpointTarget):
    """The emulator: jobs go in through its HTTP `/run` like a client's; the wait uses its
    in-process status (no polling delay); `/status` is read once for the API's timers."""

    def __init__(self, emulator: Emulator) -> None:
        self.em = emulator
        super().__init__(emulator.config.endpoint_id, emulator.api_key, emulator.base_url)

    def wait(self, job_id: str, timeout: float) -> dict[str, Any]:
        self.em.wait_job(job_id, timeout)
        return self.client().status(job_id)


@dataclass
class Outcome:
    """One query as the sender saw it."""

    index: int
    query: str
    audio_seconds: float
    scheduled_at: float
    sent_at: float | None = None
    job_id: str | None = None
    received_at: float | None = None
    status: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    text: str | None = field(default=None, repr=False)
    reference: str | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.received_at is not None


def _summary_status(status: dict[str, Any]) -> dict[str, Any]:
    """The status object without the transcript (results can be large and private)."""
    out = {k: v for k, v in status.items() if k != "output"}
    output = status.get("output")
    if isinstance(output, dict):
        out["output"] = {
            k: output[k]
            for k in ("duration", "timings", "error_code", "retryable", "language", "model")
            if k in output
        }
    return out


def issue(
    arrivals: list[Arrival],
    target: Target,
    *,
    t0: float,
    job_timeout_s: float,
) -> tuple[list[Outcome], Callable[[float], None]]:
    """Start a thread that hands each query over at ``t0 + offset``; each query then
    waits for its answer in its own thread. Returns the outcomes (filled in as they
    arrive) and a function that joins every thread within a timeout."""
    outcomes = [
        Outcome(
            i, a.query.name, a.query.audio_seconds, t0 + a.offset_s, reference=a.query.reference
        )
        for i, a in enumerate(arrivals)
    ]
    threads: list[threading.Thread] = []

    def one(outcome: Outcome, job_input: dict[str, Any]) -> None:
        outcome.sent_at = time.time()
        try:
            outcome.job_id = target.submit(job_input)
            status = target.wait(outcome.job_id, job_timeout_s)
        except (ClientError, TimeoutError, OSError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
            status = {"status": "CLIENT_ERROR"}
        output = status.get("output")
        if isinstance(output, dict) and isinstance(output.get("text"), str):
            outcome.text = output["text"]
        outcome.status = _summary_status(status)
        outcome.received_at = time.time()

    def schedule() -> None:
        for outcome, arrival in zip(outcomes, arrivals, strict=True):
            job_input = arrival.query.job_input()
            pause = outcome.scheduled_at - time.time()
            if pause > 0:
                time.sleep(pause)
            t = threading.Thread(
                target=one, args=(outcome, job_input), daemon=True, name=f"query-{outcome.index}"
            )
            threads.append(t)
            t.start()

    sender = threading.Thread(target=schedule, name="scheduler", daemon=True)
    sender.start()

    def join(timeout: float) -> None:
        # The scheduler first: it is the one that appends the query threads.
        deadline = time.time() + timeout
        sender.join(max(0.0, deadline - time.time()))
        for t in list(threads):
            t.join(max(0.0, deadline - time.time()))

    return outcomes, join


# --------------------------------------------------------------------------- progress


class Progress:
    """A one-line progress bar on stderr (a line every few seconds when not a terminal)."""

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self._last = 0.0

    def update(self, done: int, extra: str = "", force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.time()
        if not force and not self.tty and now - self._last < 5.0:
            return
        self._last = now
        width = 30
        filled = int(width * done / self.total) if self.total else width
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} answered  {extra}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def wait_all(
    outcomes: list[Outcome],
    join: Callable[[float], None],
    progress: Progress,
    status_line: Callable[[], str],
    timeout: float,
) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = sum(o.done for o in outcomes)
        progress.update(done, status_line())
        if done == len(outcomes):
            break
        time.sleep(0.2)
    progress.update(sum(o.done for o in outcomes), status_line(), force=True)
    progress.close()
    join(max(0.0, deadline - time.time()))


# --------------------------------------------------------------------------- records


def job_entry(o: Outcome, taken_at: float | None, finished_at: float | None) -> dict[str, Any]:
    """One job in the cost contract's shape, plus everything else that was measured."""
    st = o.status
    output: dict[str, Any] = st["output"] if isinstance(st.get("output"), dict) else {}
    ok = st.get("status") == "COMPLETED" and "error" not in st and o.error is None
    audio_s = output.get("duration", o.audio_seconds)
    entry: dict[str, Any] = {
        "id": o.job_id,
        "query": o.query,
        "submitted_at": o.scheduled_at,
        "sent_at": o.sent_at,
        "taken_at": taken_at,
        "finished_at": finished_at,
        "received_at": o.received_at,
        "audio_seconds": float(audio_s or 0.0),
        "ok": ok,
        "status": st.get("status"),
        "timings": output.get("timings"),
        "delayTime": st.get("delayTime"),
        "executionTime": st.get("executionTime"),
        "worker_id": st.get("workerId"),
        "error_code": output.get("error_code"),
        "client_error": o.error,
        "wer": round(wer(o.reference, o.text), 4)
        if ok and o.reference and o.text is not None
        else None,
    }
    return entry


def local_job_times(em: Emulator) -> dict[str, tuple[float | None, float | None]]:
    """taken_at and finished_at of every job, as the emulator saw them."""
    return {j["id"]: (j["taken_at"], j["finished_at"]) for j in em.records()["jobs"].values()}


def remote_job_times(o: Outcome) -> tuple[float | None, float | None]:
    """From /status: taken = sent + delayTime, finished = taken + executionTime."""
    st = o.status
    if o.sent_at is None or st.get("delayTime") is None:
        return None, None
    taken = o.sent_at + st["delayTime"] / 1000.0
    exe = st.get("executionTime")
    return taken, None if exe is None else taken + exe / 1000.0


def attach_jobs(workers: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put each job under its worker; returns the jobs no known worker took."""
    by_id = {w["id"]: w for w in workers}
    for w in workers:
        w["jobs"] = []
    stray = []
    for j in jobs:
        owner = by_id.get(j.get("worker_id") or "")
        if owner is not None and j["taken_at"] is not None and j["finished_at"] is not None:
            owner["jobs"].append(j)
        else:
            stray.append(j)
    return stray


def estimated_workers(jobs: list[dict[str, Any]], idle_timeout_s: float) -> list[dict[str, Any]]:
    """Remote: workers as far as /status shows them, one per workerId.

    The public API does not show when a worker started or stopped, so each is counted
    from its first job to ``idle_timeout_s`` after its last: cold starts are missing
    (they are inside the first job's delayTime) and the billed time is a lower bound.
    """
    spans: dict[str, list[float]] = {}
    for j in jobs:
        if j.get("worker_id") and j["taken_at"] is not None and j["finished_at"] is not None:
            s = spans.setdefault(j["worker_id"], [j["taken_at"], j["finished_at"]])
            s[0], s[1] = min(s[0], j["taken_at"]), max(s[1], j["finished_at"])
    return [
        {
            "id": w,
            "kind": "flex",
            "started_at": a,
            "ready_at": a,
            "stopped_at": b + idle_timeout_s,
            "estimated": True,
        }
        for w, (a, b) in sorted(spans.items())
    ]


# --------------------------------------------------------------------------- runs


@dataclass
class RunResult:
    record: dict[str, Any]
    outcomes: list[Outcome]


def _window(jobs: list[dict[str, Any]], t0: float) -> dict[str, float]:
    ends = [
        j["finished_at"] or j["received_at"] for j in jobs if (j["finished_at"] or j["received_at"])
    ]
    return {"start": t0, "end": max(ends, default=t0)}


def probe(target: Target, timeout: float) -> dict[str, Any]:
    """Send one input that is not audio and record how the endpoint answers it."""
    sent = time.time()
    try:
        status = target.wait(target.submit(dict(PROBE_INPUT)), timeout)
    except (ClientError, TimeoutError, OSError) as exc:
        return {"input": "17 bytes of text as audio_base64", "client_error": str(exc)}
    output: dict[str, Any] = status["output"] if isinstance(status.get("output"), dict) else {}
    return {
        "input": "17 bytes of text as audio_base64",
        "status": status.get("status"),
        "error": status.get("error"),
        "error_code": output.get("error_code"),
        "retryable": output.get("retryable"),
        "latency_s": round(time.time() - sent, 3),
    }


def run_local(
    arrivals: list[Arrival],
    *,
    scaler: ScalerConfig,
    emulator: Emulator,
    job_timeout_s: float = 600.0,
    ready_timeout_s: float = 300.0,
    probe_errors: bool = True,
    progress: Progress | None = None,
) -> RunResult:
    """Run the schedule on a started emulator with an autoscaler; the caller stops it."""
    progress = progress or Progress(len(arrivals), enabled=False)
    auto = Autoscaler(emulator, scaler).start()
    try:
        if scaler.active_workers:
            auto.wait_ready("active", ready_timeout_s)
        target = LocalTarget(emulator)
        t0 = time.time() + 0.2
        outcomes, join = issue(arrivals, target, t0=t0, job_timeout_s=job_timeout_s)

        def line() -> str:
            states = [emulator.worker_state(w) for w in auto.alive()]
            return (
                f"queued {emulator.queue_length()}  running {emulator.jobs_in_progress()}"
                f"  workers {len(states)} ({states.count('starting')} starting)"
            )

        horizon = (arrivals[-1].offset_s if arrivals else 0) + job_timeout_s
        wait_all(outcomes, join, progress, line, horizon)
        probe_result = probe(target, 120.0) if probe_errors else None
        scaled = auto.wait_scaled_down(scaler.idle_timeout_s + 60.0)
    finally:
        auto.stop()
    times = local_job_times(emulator)
    jobs = [job_entry(o, *times.get(o.job_id or "", (None, None))) for o in outcomes]
    workers = auto.worker_records()
    stray = attach_jobs(workers, jobs)
    record = {
        "version": 1,
        "mode": "local",
        "target": target.describe(),
        "scaler": {k: v for k, v in asdict(scaler).items() if k not in ("env",)},
        "worker_env": {k: v for k, v in scaler.env.items() if k.startswith("WHISPER_")},
        "window": _window(jobs, t0),
        "workers": workers,
        "unassigned_jobs": stray,
        "scaled_to_zero": scaled,
        "decisions": auto.decisions,
        "error_probe": probe_result,
    }
    return RunResult(record, outcomes)


def run_remote(
    arrivals: list[Arrival],
    target: EndpointTarget,
    *,
    idle_timeout_s: float = 5.0,
    job_timeout_s: float = 600.0,
    probe_errors: bool = True,
    progress: Progress | None = None,
) -> RunResult:
    """Run the schedule against a deployed endpoint (or anything speaking its API)."""
    progress = progress or Progress(len(arrivals), enabled=False)
    t0 = time.time() + 0.2
    outcomes, join = issue(arrivals, target, t0=t0, job_timeout_s=job_timeout_s)

    def line() -> str:
        states = [o.status.get("status") for o in outcomes if o.done]
        return f"failed {sum(s != 'COMPLETED' for s in states)}"

    horizon = (arrivals[-1].offset_s if arrivals else 0) + job_timeout_s
    wait_all(outcomes, join, progress, line, horizon)
    probe_result = probe(target, 300.0) if probe_errors else None
    jobs = [job_entry(o, *remote_job_times(o)) for o in outcomes]
    workers = estimated_workers(jobs, idle_timeout_s)
    stray = attach_jobs(workers, jobs)
    record = {
        "version": 1,
        "mode": "remote",
        "target": target.describe(),
        "billing_note": "estimated from /status: each worker from its first job to the idle"
        f" timeout ({idle_timeout_s:g} s) after its last; cold starts are not visible",
        "window": _window(jobs, t0),
        "workers": workers,
        "unassigned_jobs": stray,
        "error_probe": probe_result,
    }
    return RunResult(record, outcomes)
