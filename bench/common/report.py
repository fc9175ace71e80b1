"""Latency statistics, the end-of-run table and the production record.

Reads the timers record defined in :mod:`bench.cost.cost`. Latency of a job is LoadGen's:
from the scheduled hand-off (``submitted_at``) to the answer (``finished_at``). Jobs that
met a cold worker are reported apart from warm ones and never averaged with them.
Percentiles are nearest-rank: always an observed value, and the p99 of fewer than 100
samples is their maximum (no interpolation flatters the tail).
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.cost.cost import CostReport, Job, Record, Worker, as_record

DEFAULT_QS: tuple[float, ...] = (50, 95, 99)
RUNTIME_PACKAGES: tuple[str, ...] = ("faster-whisper", "ctranslate2", "av", "runpod")
# Phases the worker reports besides "total"; others it adds are summed too (see check_phase_sum).
JOB_PHASES: tuple[str, ...] = ("fetch", "decode", "queue_model", "transcribe", "format")


def percentile(values: list[float], q: float) -> float:
    """The value at q % of the sorted values, rounded to the nearest index (nan: none)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def percentiles(
    values: Iterable[float], qs: Sequence[float] = DEFAULT_QS
) -> dict[float, float | None]:
    """Nearest-rank percentiles: the smallest value with at least q % of values <= it.

    rank = ceil(q / 100 * n), 1-based; q = 0 gives the minimum. None for each q when
    there are no values.
    """
    xs = sorted(values)
    out: dict[float, float | None] = {}
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} is outside 0..100")
        if not xs:
            out[q] = None
            continue
        rank = max(1, math.ceil(q / 100 * len(xs) - 1e-9))
        out[q] = xs[rank - 1]
    return out


def job_latency(job: Job) -> float:
    """Seconds from the scheduled hand-off to the answer."""
    return job.finished_at - job.submitted_at


def is_cold_job(job: Job, worker: Worker) -> bool:
    """A job met a cold worker when that worker was not ready yet when the job was sent."""
    return worker.ready_at is None or worker.ready_at > job.submitted_at


@dataclass(frozen=True)
class JobSample:
    job_id: str
    worker_id: str
    submitted_at: float
    latency: float
    cold: bool
    ok: bool


def job_samples(record: Record | Mapping[str, Any]) -> list[JobSample]:
    """Every job with its latency and whether it met a cold worker, in submission order."""
    rec = as_record(record)
    out = [
        JobSample(j.id, w.id, j.submitted_at, job_latency(j), is_cold_job(j, w), j.ok)
        for w in rec.workers
        for j in w.jobs
    ]
    return sorted(out, key=lambda s: s.submitted_at)


def latency_stats(
    record: Record | Mapping[str, Any], qs: Sequence[float] = DEFAULT_QS
) -> dict[str, dict[str, Any]]:
    """Percentiles of successful jobs' latency, cold and warm apart, plus the failed count."""
    samples = job_samples(record)
    out: dict[str, dict[str, Any]] = {}
    for name, cold in (("cold", True), ("warm", False)):
        lat = [s.latency for s in samples if s.ok and s.cold == cold]
        out[name] = {"n": len(lat), "percentiles": percentiles(lat, qs)}
    out["failed"] = {"n": sum(1 for s in samples if not s.ok)}
    return out


def rtf(job: Job) -> float | None:
    """Real-time factor: transcribe seconds per audio second (below 1 is faster than real time)."""
    if not job.timings or "transcribe" not in job.timings or job.audio_seconds <= 0:
        return None
    return job.timings["transcribe"] / job.audio_seconds


def overall_rtf(record: Record | Mapping[str, Any]) -> float | None:
    """Total transcribe seconds over total audio seconds of successful jobs with timings."""
    rec = as_record(record)
    jobs = [j for j in rec.jobs if j.ok and rtf(j) is not None]
    audio = sum(j.audio_seconds for j in jobs)
    if audio <= 0:
        return None
    return sum(j.timings["transcribe"] for j in jobs if j.timings) / audio


def check_phase_sum(job: Job | Mapping[str, Any]) -> float:
    """Residual of the phase timings against the worker's measured total (seconds).

    total - (sum of every other timing key). Positive: time no phase accounts for;
    negative: phases overlap or were counted twice. The harness asserts it is small.
    """
    if not isinstance(job, Job):
        job = Job.from_dict(job)
    if not job.timings or "total" not in job.timings:
        raise ValueError(f"job {job.id!r} has no timings with a total")
    parts = sum(v for k, v in job.timings.items() if k != "total")
    return job.timings["total"] - parts


@dataclass(frozen=True)
class ColdStart:
    """A worker's cold start split along its critical path (seconds).

    Each part is the time its marker came after the previous ones, so work overlapped
    with an earlier part (a model loaded while imports run) shows as 0 and the parts add
    up to ``total`` = ready - started. ``other`` is after the last marker until ready.
    Missing markers contribute 0 and their time falls into the next part.
    """

    worker_id: str
    imports: float
    load: float
    warmup: float
    other: float
    total: float


def cold_start(worker: Worker) -> ColdStart | None:
    """The split of one worker's start-up; None if it never became ready."""
    if worker.ready_at is None:
        return None
    mark = worker.started_at
    parts: list[float] = []
    for t in (
        worker.imports_done_at,
        worker.model_loaded_at,
        worker.warmup_done_at,
        worker.ready_at,
    ):
        if t is None:
            parts.append(0.0)
            continue
        parts.append(max(0.0, t - mark))
        mark = max(mark, t)
    total = max(0.0, worker.ready_at - worker.started_at)
    return ColdStart(worker.id, parts[0], parts[1], parts[2], parts[3], total)


def cold_start_summary(record: Record | Mapping[str, Any]) -> dict[str, Any]:
    """Mean and max of each cold-start part over the workers that became ready."""
    rec = as_record(record)
    starts = [c for c in (cold_start(w) for w in rec.workers) if c is not None]
    keys = ("total", "imports", "load", "warmup", "other")
    out: dict[str, Any] = {"n": len(starts), "never_ready": len(rec.workers) - len(starts)}
    for k in keys:
        vals = [getattr(c, k) for c in starts]
        out[k] = {
            "mean": sum(vals) / len(vals) if vals else None,
            "max": max(vals) if vals else None,
        }
    return out


def phase_breakdown(record: Record | Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """Mean and p50 of each execution phase over successful jobs (seconds).

    Adds the platform's side: ``queue_wait`` (submitted -> taken, RunPod's delayTime
    less any cold start it includes) and ``post`` (worker total -> answer received).
    """
    rec = as_record(record)
    jobs = [j for j in rec.jobs if j.ok]
    series: dict[str, list[float]] = {"queue_wait": [j.taken_at - j.submitted_at for j in jobs]}
    for j in jobs:
        for k, v in (j.timings or {}).items():
            series.setdefault(k, []).append(v)
    series["post"] = [
        (j.finished_at - j.taken_at) - j.timings["total"]
        for j in jobs
        if j.timings and "total" in j.timings
    ]
    return {
        k: {"mean": sum(v) / len(v) if v else None, "p50": percentiles(v, (50,))[50]}
        for k, v in series.items()
    }


# --------------------------------------------------------------------------- the table


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _money(v: float | None) -> str:
    # Costs per job can be fractions of a cent: keep four significant digits.
    return "-" if v is None else f"{v:.4g}"


_CODE = re.compile(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{4,})\b")


def failure_code(job: Mapping[str, Any]) -> str:
    """What a failed job's entry says went wrong: the worker's error code, the client's
    (``ClientError: CONNECTION_ERROR: ...``), or the platform status."""
    if job.get("error_code"):
        return str(job["error_code"])
    m = _CODE.search(str(job.get("client_error") or "").removeprefix("ClientError: "))
    if m:
        return m.group(1)
    return str(job.get("status") or "UNKNOWN")


def failures(record: Mapping[str, Any]) -> Counter[str]:
    """Failed jobs by code, those no worker took (unreachable endpoint, lost) included."""
    jobs = [j for w in record.get("workers", ()) for j in w.get("jobs", ())]
    jobs += list(record.get("unassigned_jobs", ()))
    return Counter(failure_code(j) for j in jobs if not j.get("ok"))


def render_table(record: Record | Mapping[str, Any], cost_report: CostReport) -> str:
    """The short plain-text table printed at the end of a run (fixed width)."""
    rec = as_record(record)
    lat = latency_stats(rec)
    if isinstance(record, Mapping):
        failed = failures(record)
        lat["failed"]["n"] = sum(failed.values())
        lat["failed"]["codes"] = dict(failed)
    cs = cold_start_summary(rec)
    r = cost_report
    lines = [f"{'latency (s)':<24}{'n':>6}{'p50':>9}{'p95':>9}{'p99':>9}"]
    for label, key in (("first requests (cold)", "cold"), ("warm requests", "warm")):
        p = lat[key]["percentiles"]
        lines.append(f"{label:<24}{lat[key]['n']:>6}{_f(p[50]):>9}{_f(p[95]):>9}{_f(p[99]):>9}")
    codes = lat["failed"].get("codes") or {}
    why = ", ".join(f"{c} {n}" for c, n in sorted(codes.items(), key=lambda kv: -kv[1]))
    lines.append(f"{'failed jobs':<24}{lat['failed']['n']:>6}" + (f"   {why}" if why else ""))
    lines.append(
        f"{'real-time factor':<24}{_f(overall_rtf(rec), '{:.3f}'):>6}"
        f"   transcribe s / audio s, {r.audio_s:.1f} audio s"
    )
    lines.append("")
    lines.append(
        f"{'cold start (s)':<24}{'n':>6}{'total':>9}{'imports':>9}{'load':>9}"
        f"{'warm-up':>9}{'other':>9}"
    )
    for stat in ("mean", "max"):
        row = "".join(
            f"{_f(cs[k][stat]):>9}" for k in ("total", "imports", "load", "warmup", "other")
        )
        lines.append(f"{'  ' + stat:<24}{cs['n']:>6}{row}")
    lines.append("")
    sh = r.shares
    lines.append(
        f"{'billed seconds':<24}{r.billed_s:>6}   cold {sh.get('cold', 0):.0%}"
        f" / working {sh.get('working', 0):.0%} / idle {sh.get('idle', 0):.0%}"
        f", {len(r.workers)} workers"
    )
    cur = r.currency
    lines.append(
        f"{'cost (' + cur + ')':<24}{_money(r.total_cost):>6}   per job "
        f"{_money(r.cost_per_job)}, per audio hour {_money(r.cost_per_audio_hour)}"
    )
    lines.append(
        f"{'active, same window':<24}{_money(r.active_cost):>6}   {r.active_workers} "
        f"workers, per audio hour {_money(r.active_cost_per_audio_hour)}"
    )
    be = r.break_even
    if be is not None:
        verdict = "" if be.reachable else " (beyond one worker's capacity: flex wins)"
        lines.append(
            f"{'break-even load':<24}{be.load:>6.2f}   audio h per h per active "
            f"worker ({be.load * r.active_workers:.2f} for {r.active_workers}), "
            f"{be.utilisation:.0%} busy{verdict}"
        )
    lines.append(
        f"{'rates (' + cur + '/s)':<24}   flex {r.flex_per_s:g}, active "
        f"{r.active_per_s:g}; run load {r.load:.3f} audio h per h"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- production record

_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|api_?key|access_?key", re.I)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)
_LONG = 200


def runtime_versions(packages: Sequence[str] = RUNTIME_PACKAGES) -> dict[str, str | None]:
    """Python and the installed versions of the runtime packages (None if missing)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def redact(value: Any, key: str = "") -> Any:
    """A copy safe to keep in a file: no credentials, URL query strings or base64 blobs."""
    if isinstance(value, Mapping):
        return {str(k): redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, key) for v in value]
    if value is not None and _SECRET_KEY.search(key):
        return "<redacted>"
    if isinstance(value, str):
        if _URL.match(value):
            # Presigned URLs carry their credentials in the query string.
            value = value.split("?", 1)[0].split("#", 1)[0]
        if len(value) > _LONG:
            return f"<{len(value)} characters omitted>"
    return value


def production_record(
    *,
    model: str,
    settings: Mapping[str, Any] | Any,
    sample_input: Mapping[str, Any],
    expected_transcript: str | None,
    actual_transcript: str | None,
    error_behaviour: Any,
    record: Record | Mapping[str, Any],
    cost_report: CostReport,
) -> dict[str, Any]:
    """Everything needed to reproduce and judge a deployment, in one JSON-able dict.

    ``settings`` may be a mapping or a pydantic model; ``error_behaviour`` is what the
    harness observed for bad inputs (for example ``{"case": {"error_code": ...}}``).
    Inputs, settings and errors are passed through :func:`redact`.
    """
    rec = as_record(record)
    if hasattr(settings, "model_dump"):
        settings = settings.model_dump(mode="json")
    return to_jsonable(
        {
            "model": model,
            "runtime": runtime_versions(),
            "settings": redact(dict(settings)),
            "sample_input": redact(dict(sample_input)),
            "transcript": {"expected": expected_transcript, "actual": actual_transcript},
            "error_behaviour": redact(error_behaviour),
            "latency": {
                "definition": "finished_at - submitted_at (scheduled hand-off to answer), seconds;"
                " nearest-rank percentiles; cold = taken by a worker not ready at submission",
                "jobs": latency_stats(rec),
                "phases": phase_breakdown(rec),
                "cold_start": cold_start_summary(rec),
                "rtf": overall_rtf(rec),
            },
            "billing": {
                "definition": "per worker: billed = ceil(stopped_at - started_at) s at its kind's"
                " rate; cold = started->ready, working = union of job intervals, idle = the"
                " rest incl. rounding",
                **cost_report.to_dict(),
            },
        }
    )


def to_jsonable(obj: Any) -> Any:
    """Dataclasses and percentile dicts (float keys) as plain JSON types."""
    if hasattr(obj, "__dataclass_fields__"):
        return to_jsonable(asdict(obj))
    if isinstance(obj, Mapping):
        return {(k if isinstance(k, str) else f"p{k:g}"): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj
