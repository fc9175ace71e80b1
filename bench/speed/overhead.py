"""Per-job overhead of the platform loop, and throughput of 1 vs 2 (or more) concurrent jobs.

Runs the same real job (JFK, tiny.en) three ways in one go, so the numbers compare as
ratios on a noisy machine: in-process (``run_job``), through the real SDK worker loop
against the local emulator with ``WHISPER_MAX_CONCURRENCY=1``, and with 2
(``--concurrency 1 2 3`` tries others).

    python -m bench overhead [--jobs 12] [--out bench/out/overhead.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from runpod_emulator import Emulator
from speech_assets.clips import DATA

ROOT = Path(__file__).resolve().parents[2]


def _bar(total: int, what: str):
    """A tqdm bar on stderr when it is a terminal; a no-op object when piped."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=what,
        unit="job",
        file=sys.stderr,
        leave=False,
        disable=not sys.stderr.isatty(),
    )


def in_process(job: dict, n: int) -> dict:
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker

    settings = load_settings({"WHISPER_DEVICE": "cpu"})
    worker = start_worker(settings)
    run_job(job, worker)  # warm
    times = []
    start = time.perf_counter()
    with _bar(n, "in-process") as bar:
        for _ in range(n):
            t = time.perf_counter()
            assert "error" not in run_job(job, worker)
            times.append(time.perf_counter() - t)
            bar.update()
    wall = time.perf_counter() - start
    return {"median_job_s": statistics.median(times), "wall_s": wall, "jobs_per_s": n / wall}


def through_loop(job: dict, n: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory() as logs:
        em = Emulator(log_dir=logs, ping_interval_ms=1000).start()
        try:
            env = {
                "WHISPER_DEVICE": "cpu",
                "WHISPER_MAX_CONCURRENCY": str(concurrency),
                "HF_HUB_OFFLINE": "1",
            }
            wid = em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
            em.wait_worker(wid, {"idle", "busy"}, 120)
            em.wait_job(em.submit(job), 60)  # warm
            singles = max(3, n // 3)
            with _bar(singles + n, f"loop, concurrency {concurrency}") as bar:
                # one at a time: submit -> COMPLETED round trip
                single = []
                for _ in range(singles):
                    t = time.perf_counter()
                    status = em.wait_job(em.submit(job), 60)
                    single.append(time.perf_counter() - t)
                    assert status["status"] == "COMPLETED"
                    bar.update()
                # all at once: throughput
                start = time.perf_counter()
                ids = [em.submit(job) for _ in range(n)]
                finals = []
                for i in ids:
                    finals.append(em.wait_job(i, 300))
                    bar.update()
                wall = time.perf_counter() - start
            assert all(f["status"] == "COMPLETED" for f in finals)
            execution = [f["executionTime"] / 1000 for f in finals]
            worker_total = [f["output"]["timings"]["total"] for f in finals]
        finally:
            em.stop()
    return {
        "concurrency": concurrency,
        "median_round_trip_s": statistics.median(single),
        "median_execution_s": statistics.median(execution),
        "median_worker_total_s": statistics.median(worker_total),
        "wall_s": wall,
        "jobs_per_s": n / wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "overhead.json"))
    args = parser.parse_args(argv)
    job = {
        "audio_base64": base64.b64encode((DATA / "jfk.mp3").read_bytes()).decode(),
        "output": ["text"],
    }
    print(
        f"{args.jobs} jobs (JFK, tiny.en) in-process, then through the loop at concurrency"
        f" {', '.join(map(str, args.concurrency))}",
        file=sys.stderr,
    )
    report: dict = {"in_process": in_process(job, args.jobs), "loop": []}
    ip = report["in_process"]
    print(
        f"in-process: {ip['median_job_s']:.3f} s per job, {ip['jobs_per_s']:.2f} jobs/s", flush=True
    )
    for c in args.concurrency:
        r = through_loop(job, args.jobs, c)
        report["loop"].append(r)
        print(
            f"loop, concurrency {r['concurrency']}: round trip {r['median_round_trip_s']:.3f} s "
            f"(executionTime {r['median_execution_s']:.3f} s, worker total "
            f"{r['median_worker_total_s']:.3f} s), {r['jobs_per_s']:.2f} jobs/s "
            f"for {args.jobs} jobs at once",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
