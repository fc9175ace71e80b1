"""Write what a harness run measured: the JSON of every timer, the table, plots, production record.

Cost needs the user's rates; without them the billed seconds and their split are still
reported and the money lines are left out (no price is assumed anywhere).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.report import (
    check_phase_sum,
    cold_start_summary,
    failures,
    latency_stats,
    overall_rtf,
    phase_breakdown,
    production_record,
    render_table,
    to_jsonable,
)
from bench.cost.cost import CostReport, Rates, Worker, peak_concurrent_workers, summarize

log = logging.getLogger(__name__)

MONEY_LINES = ("cost (", "active, same window", "break-even load", "rates (")
NO_RATES = (
    "cost lines omitted: no rates given (pass --flex-rate and --active-rate in"
    " price per second, or --rates FILE)"
)


@dataclass
class Written:
    table: str
    paths: dict[str, Path]
    cost: CostReport
    failed: int = 0
    skipped_plots: str | None = None


def serving_peak(record: Mapping[str, Any]) -> int:
    """Most workers serving at once: from start until asked to stop. A worker draining
    after its idle timeout overlaps its successor's cold start, but an always-on
    active worker would not need a second one for that."""
    workers = [
        Worker.from_dict(
            {**w, "jobs": [], "stopped_at": w.get("stop_requested_at") or w["stopped_at"]}
        )
        for w in record["workers"]
    ]
    return max(1, peak_concurrent_workers(workers))


def price(record: Mapping[str, Any], rates: Rates | None) -> CostReport:
    """The cost report; without rates every price is 0 (the money lines are not shown)."""
    return summarize(record, rates or Rates(0.0, 0.0), active_workers=serving_peak(record))


def phase_residuals(record: Mapping[str, Any]) -> list[float]:
    """total - sum(phases) of every successful job that reported timings (seconds)."""
    return [
        check_phase_sum(j)
        for w in record["workers"]
        for j in w["jobs"]
        if j["ok"] and j.get("timings") and "total" in j["timings"]
    ]


def summary(record: Mapping[str, Any], cost: CostReport, rates: Rates | None) -> dict[str, Any]:
    residuals = phase_residuals(record)
    jobs = [j for w in record["workers"] for j in w["jobs"]] + list(record["unassigned_jobs"])
    wers = [j["wer"] for j in jobs if j.get("wer") is not None]
    out: dict[str, Any] = {
        "jobs": len(jobs),
        "completed": sum(1 for j in jobs if j["ok"]),
        "not_completed": sum(1 for j in jobs if not j["ok"]),
        "failed_by_code": dict(failures(record)),
        "latency": latency_stats(record),
        "cold_start": cold_start_summary(record),
        "phases": phase_breakdown(record),
        "rtf": overall_rtf(record),
        "execution_s_per_audio_s": _exec_per_audio(record),
        "mean_wer": sum(wers) / len(wers) if wers else None,
        "phase_residual_s": {
            "max_abs": max((abs(r) for r in residuals), default=None),
            "n": len(residuals),
        },
        "billed": {
            "seconds": cost.billed_s,
            "split_s": to_jsonable(cost.split),
            "shares": cost.shares,
            "workers": len(cost.workers),
        },
    }
    if rates is not None:
        out["cost"] = to_jsonable(cost)
    return out


def _exec_per_audio(record: Mapping[str, Any]) -> float | None:
    """Worker-side execution (taken -> answer posted) per audio second, successful jobs."""
    jobs = [j for w in record["workers"] for j in w["jobs"] if j["ok"]]
    audio = sum(j["audio_seconds"] for j in jobs)
    if audio <= 0:
        return None
    return sum(j["finished_at"] - j["taken_at"] for j in jobs) / audio


def table_text(record: Mapping[str, Any], cost: CostReport, rates: Rates | None) -> str:
    text = render_table(record, cost)
    if rates is None:
        keep = [ln for ln in text.splitlines() if not ln.startswith(MONEY_LINES)]
        text = "\n".join([*keep, NO_RATES])
    return text


def write_outputs(
    record: dict[str, Any],
    out_dir: str | Path,
    name: str,
    *,
    rates: Rates | None,
    model: str,
    settings: Mapping[str, Any] | Any,
    sample: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> Written:
    """Write ``name.json``, ``name.txt`` (the table), three PNGs and
    ``name.production.json`` into ``out_dir``. ``sample`` holds the production record's
    sample: ``{"input", "expected", "actual"}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cost = price(record, rates)
    record["rates"] = None if rates is None else to_jsonable(rates)
    record["summary"] = summary(record, cost, rates)
    table = table_text(record, cost, rates)
    paths = {
        "json": out / f"{name}.json",
        "table": out / f"{name}.txt",
        "production": out / f"{name}.production.json",
    }
    paths["json"].write_text(json.dumps(to_jsonable(record), indent=1))
    paths["table"].write_text(table + "\n")
    sample = sample or {}
    prod = production_record(
        model=model,
        settings=settings,
        sample_input=sample.get("input") or {},
        expected_transcript=sample.get("expected"),
        actual_transcript=sample.get("actual"),
        error_behaviour=record.get("error_probe"),
        record=record,
        cost_report=cost,
    )
    if rates is None:
        prod["billing"]["note"] = NO_RATES
    paths["production"].write_text(json.dumps(prod, indent=1))
    failed = record["summary"]["not_completed"]
    skipped = None
    if plots and record["summary"]["completed"] == 0:
        skipped = "no plots: no job completed, there is nothing to draw"
    elif plots:
        paths.update(draw(record, cost, out, name, rates))
    return Written(table, paths, cost, failed, skipped)


def draw(
    record: Mapping[str, Any],
    cost: CostReport,
    out: Path,
    name: str,
    rates: Rates | None,
    others: Sequence[CostReport] = (),
    labels: Sequence[str] | None = None,
) -> dict[str, Path]:
    """The three plots; cost against load only with rates (and other runs' dots if given,
    ``labels`` naming this run then the others)."""
    from bench.common.plots import plot_billed_split, plot_cost_vs_load, plot_latency

    paths = {
        "latency_png": plot_latency(record, out / f"{name}-latency.png"),
        "billed_png": plot_billed_split(cost, out / f"{name}-billed.png"),
    }
    if rates is not None:
        paths["cost_png"] = plot_cost_vs_load(
            [cost, *others], out / f"{name}-cost.png", labels=labels
        )
    return paths
