"""PNG plots of a benchmark run: latency over time, billed time split, cost against load.

matplotlib is an optional dependency (the ``bench`` extra) and is imported only when a
plot is drawn. Figures are built with the object API and rendered by Agg, so nothing
touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common.report import job_samples
from bench.cost.cost import CostReport, Rates, Record, as_record

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {
    "cold": "#4c72b0",
    "working": "#55a868",
    "idle": "#c0c0c0",
    "flex": "#dd8452",
    "active": "#4c72b0",
    "failed": "#999999",
}


def _figure(width: float = 8.0, height: float = 4.5) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def plot_latency(record: Record | Mapping[str, Any], path: str | Path) -> Path:
    """Latency of each job against when it was sent; cold starts shaded and marked."""
    rec = as_record(record)
    t0 = rec.window_start
    fig = _figure()
    ax = fig.add_subplot()
    for i, w in enumerate(rec.workers):
        end = w.ready_at if w.ready_at is not None else w.stopped_at
        ax.axvspan(
            w.started_at - t0,
            end - t0,
            color=COLOURS["cold"],
            alpha=0.12,
            lw=0,
            label="worker cold start" if i == 0 else None,
        )
    samples = job_samples(rec)
    groups = (
        ("warm", [s for s in samples if s.ok and not s.cold], "o", COLOURS["working"]),
        (
            "first request (cold worker)",
            [s for s in samples if s.ok and s.cold],
            "X",
            COLOURS["cold"],
        ),
        ("failed", [s for s in samples if not s.ok], "x", COLOURS["failed"]),
    )
    for label, group, marker, colour in groups:
        if group:
            ax.scatter(
                [s.submitted_at - t0 for s in group],
                [s.latency for s in group],
                marker=marker,
                color=colour,
                s=36 if marker == "X" else 18,
                label=f"{label} ({len(group)})",
                zorder=3,
            )
    ax.set_xlabel("time job was sent (s from start of run)")
    ax.set_ylabel("latency, sent to answer (s)")
    ax.set_title("Latency over time")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    return _save(fig, path)


def plot_billed_split(cost_report: CostReport, path: str | Path) -> Path:
    """One stacked bar per worker: billed seconds spent cold, working and idle."""
    ws = cost_report.workers
    fig = _figure(max(5.0, 1.0 + 0.5 * len(ws)), 4.5)
    ax = fig.add_subplot()
    xs = list(range(len(ws)))
    bottom = [0.0] * len(ws)
    for part in ("cold", "working", "idle"):
        vals = [getattr(w, f"{part}_s") for w in ws]
        share = cost_report.shares.get(part, 0.0)
        ax.bar(xs, vals, bottom=bottom, color=COLOURS[part], label=f"{part} ({share:.0%})")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(
        xs, [f"{w.id}\n{w.kind}" for w in ws], fontsize="small", rotation=45 if len(ws) > 8 else 0
    )
    ax.set_ylabel("billed seconds")
    ax.set_title(f"Billed time per worker: {cost_report.billed_s} s in all")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _money_axis(ax: Any) -> None:
    """Log axes whose ticks read as plain amounts and loads (0.05, 0.2, 1, 5), not 6x10^0;
    the currency is in the axis label."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.yaxis, ax.xaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.4g}"))
        axis.set_minor_formatter(NullFormatter())


def plot_cost_vs_load(
    reports: CostReport | Sequence[CostReport],
    path: str | Path,
    *,
    loads: Sequence[float] | None = None,
    labels: Sequence[str] | None = None,
) -> Path:
    """Cost per audio hour against load (see :func:`cost_figure`), saved as a PNG."""
    return _save(cost_figure(reports, loads=loads, labels=labels), path)


def cost_figure(
    reports: CostReport | Sequence[CostReport],
    *,
    loads: Sequence[float] | None = None,
    labels: Sequence[str] | None = None,
) -> Figure:
    """Cost per audio hour against load, flex against active workers.

    Lines come from the cost model (:func:`bench.cost.cost.break_even`) of the first run that
    has one: flex pays its measured billed seconds per audio second at any load; active
    pays for as many always-on workers as the load needs (ceil(load x working seconds
    per audio second), at least one), so its line falls as 1/load with a step where one
    more worker is needed: that is the sawtooth. Dots are the measured runs at their own
    loads, each labelled (``labels``, default run 1, run 2, ...).
    """
    runs = [reports] if isinstance(reports, CostReport) else list(reports)
    names = list(labels) if labels is not None else [f"run {i + 1}" for i in range(len(runs))]
    model = next((r for r in runs if r.break_even is not None), None)
    fig = _figure()
    ax = fig.add_subplot()
    cur = runs[0].currency if runs else ""
    if model is not None and model.break_even is not None:
        be = model.break_even
        rates = Rates(model.flex_per_s, model.active_per_s, model.currency)
        w = be.utilisation / be.load  # working seconds per audio second
        measured = [r.load for r in runs if r.load > 0]
        hi = max([be.load * 3, *(x * 2 for x in measured)])
        lo = min([be.load / 10, *(x / 2 for x in measured)])
        grid = list(loads) if loads else [lo * (hi / lo) ** (i / 199) for i in range(200)]
        flex = [rates.flex_per_s * be.flex_billed_s_per_audio_s * 3600.0 for _ in grid]
        active = [max(1, math.ceil(x * w - 1e-9)) * rates.active_per_s * 3600.0 / x for x in grid]
        ax.plot(grid, flex, color=COLOURS["flex"], label="flex (measured overhead per job)")
        ax.plot(
            grid,
            active,
            color=COLOURS["active"],
            label="active: falls as 1/load, steps up where one more worker is needed",
        )
        if be.reachable:
            ax.axvline(be.load, color="black", ls=":", lw=1)
            ax.annotate(
                f"break-even {be.load:.2f} audio h/h",
                (be.load, flex[0]),
                textcoords="offset points",
                xytext=(5, 8),
                fontsize="small",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        _money_axis(ax)
    for r, label in zip(runs, names, strict=True):
        if r.load > 0 and (r.cost_per_audio_hour or r.active_cost_per_audio_hour) is not None:
            ax.annotate(
                label,
                (r.load, r.cost_per_audio_hour or r.active_cost_per_audio_hour),
                textcoords="offset points",
                xytext=(6, -12),
                fontsize="x-small",
            )
        if r.cost_per_audio_hour is not None and r.load > 0:
            ax.scatter(
                [r.load],
                [r.cost_per_audio_hour],
                color=COLOURS["flex"],
                edgecolor="black",
                zorder=3,
                s=40,
            )
        if r.active_cost_per_audio_hour is not None and r.load > 0:
            ax.scatter(
                [r.load],
                [r.active_cost_per_audio_hour],
                color=COLOURS["active"],
                edgecolor="black",
                marker="s",
                zorder=3,
                s=36,
            )
    ax.scatter(
        [], [], color="white", edgecolor="black", label="measured runs (dot flex, square active)"
    )
    ax.set_xlabel("load (audio hours per hour)")
    ax.set_ylabel(f"cost per audio hour ({cur} per hour of audio)")
    ax.set_title("Cost per audio hour against load: flex vs active")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    fig.canvas.draw()
    return fig
