"""Throughput: one worker, a burst of short real clips, one job per instance vs the engine.

``python -m bench throughput``: a real worker (``python -m handler`` under the runpod SDK)
against the local emulator, twice in one run:

- ``sequential``: one job at a time (``WHISPER_MAX_CONCURRENCY=1``, batch 1), the
  worker before the engine: one job owns the model from start to end;
- ``engine``: ``WHISPER_MAX_CONCURRENCY`` jobs held at once (16), ``WHISPER_BATCH_SIZE``
  > 1 (8; both the defaults now): their windows share batched encode + decode calls
  (handler/inference/engine.py).

The clips are real speech with references: the English prompts of the evaluation corpus
between 1 and 10 s (bench.common.eval_corpus). All are submitted at once (the burst), then a few
one at a time (a lone job's latency). ``--mix`` adds long recordings to the burst. Prints
clips/s, audio seconds per second, p50/p95/p99 latency, WER and the batch-size histogram
per mode, and the ratios. Traffic stays on 127.0.0.1; the run is bounded by ``--clips``.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path
from typing import Any

import jiwer

from bench.common.eval_corpus import DEFAULT_DIR, Item, build
from bench.common.machine import describe
from bench.common.machine import line as machine_line
from bench.common.report import percentile
from bench.common.text import normalise
from runpod_emulator import Emulator

ROOT = Path(__file__).resolve().parents[2]


def _seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def short_clips(n: int) -> list[Item]:
    items = [it for it in build(DEFAULT_DIR) if it.language == "en" and it.group == "prompt"]
    items = [it for it in items if 1.0 <= _seconds(it.path) <= 10.0]
    return (items * (n // max(1, len(items)) + 1))[:n]


def run_mode(
    name: str, env: dict[str, str], burst: list[Item], lone: int, job_options: dict[str, Any]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as logs:
        em = Emulator(log_dir=logs).start()
        try:
            wid = em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
            em.wait_worker(wid, {"idle", "busy"}, 300)

            def job_of(it: Item) -> dict[str, Any]:
                audio = base64.b64encode(it.path.read_bytes()).decode()
                return {"audio_base64": audio, "output": ["text"], **job_options}

            em.wait_job(em.submit(job_of(burst[0])), 600)  # warm
            results: list[tuple[Item, float, dict[str, Any]]] = []
            lock = threading.Lock()

            def one(it: Item, job_id: str, t0: float) -> None:
                final = em.wait_job(job_id, 1800)
                with lock:
                    results.append((it, time.perf_counter() - t0, final))

            start = time.perf_counter()
            threads = []
            for it in burst:
                t0 = time.perf_counter()
                th = threading.Thread(target=one, args=(it, em.submit(job_of(it)), t0))
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
            wall = time.perf_counter() - start
            lone_latency = []
            for it in burst[:lone]:
                t0 = time.perf_counter()
                em.wait_job(em.submit(job_of(it)), 600)
                lone_latency.append(time.perf_counter() - t0)
        finally:
            em.stop()
    ok = [(it, dt, f) for it, dt, f in results if f.get("status") == "COMPLETED"]
    refs = [normalise(it.text, "en") for it, _, _ in ok]
    hyps = [normalise(f["output"].get("text", ""), "en") or "<empty>" for _, _, f in ok]
    histogram: dict[int, int] = {}
    for _, _, f in ok:
        for size in f["output"].get("batch_sizes") or [1]:
            histogram[size] = histogram.get(size, 0) + 1
    audio = sum(_seconds(it.path) for it, _, _ in ok)
    lat = [dt for _, dt, _ in ok]
    return {
        "mode": name,
        "env": env,
        "clips": len(burst),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "wall_s": round(wall, 2),
        "clips_per_s": round(len(ok) / wall, 3),
        "audio_s_per_s": round(audio / wall, 2),
        "p50_s": round(percentile(lat, 50), 2),
        "p95_s": round(percentile(lat, 95), 2),
        "p99_s": round(percentile(lat, 99), 2),
        "wer": round(jiwer.wer(refs, hyps), 4) if ok else None,
        "lone_p50_s": round(statistics.median(lone_latency), 2) if lone_latency else None,
        "lone_p95_s": round(percentile(lone_latency, 95), 2) if lone_latency else None,
        "batch_histogram": dict(sorted(histogram.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench throughput", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clips", type=int, default=200, help="short clips in the burst")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16, help="jobs the engine worker holds")
    parser.add_argument("--lone", type=int, default=5, help="lone jobs afterwards (latency)")
    parser.add_argument("--mix", action="store_true", help="add two ~4-minute recordings")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="job option for both modes, e.g. beam_size=1",
    )
    parser.add_argument(
        "--malloc",
        choices=["keep", "system", "both"],
        default="keep",
        help="the worker's allocator policy (WHISPER_MALLOC); both: each mode"
        " under system, then keep (handler/inference/allocator.py)",
    )
    parser.add_argument("--modes", default="sequential,engine", help="which modes to run")
    parser.add_argument(
        "--layout",
        action="append",
        default=[],
        metavar="NAME:KEY=V,KEY=V",
        help="one more engine mode with these settings, e.g. "
        "'2x1:WHISPER_NUM_WORKERS=2,WHISPER_CPU_THREADS=1'",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "throughput.json"))
    args = parser.parse_args(argv)
    burst = short_clips(args.clips)
    if args.mix:
        longs = [it for it in build(DEFAULT_DIR) if it.group == "long"]
        burst = burst[: len(burst) // 3] + longs + burst[len(burst) // 3 :] + longs
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    base = {"WHISPER_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    shapes = {
        "sequential": {"WHISPER_MAX_CONCURRENCY": "1", "WHISPER_BATCH_SIZE": "1"},
        "engine": {
            "WHISPER_MAX_CONCURRENCY": str(args.concurrency),
            "WHISPER_BATCH_SIZE": str(args.batch_size),
        },
    }
    policies = ["system", "keep"] if args.malloc == "both" else [args.malloc]
    wanted = [m.strip() for m in args.modes.split(",") if m.strip() in shapes]
    modes = [
        (
            name if len(policies) == 1 else f"{name}, malloc {policy}",
            {**base, **shapes[name], "WHISPER_MALLOC": policy},
        )
        for policy in policies
        for name in wanted
    ]
    for spec in args.layout:
        label, _, pairs = spec.partition(":")
        extra = dict(p.split("=", 1) for p in pairs.split(",") if p)
        for policy in policies:
            env = {**base, **shapes["engine"], "WHISPER_MALLOC": policy, **extra}
            modes.append((f"engine, {label}", env))
    machine = describe()
    report = [run_mode(name, env, burst, args.lone, options) for name, env in modes]
    load_after = describe()["load_1m"]
    audio_min = sum(_seconds(it.path) for it in burst) / 60
    print(f"{len(burst)} clips ({audio_min:.1f} min of speech), tiny.en on the CPU, one worker")
    print(machine_line(machine, load_after))
    head = ("mode", "clips/s", "audio s/s", "p50 s", "p95 s", "p99 s", "WER", "lone p95 s")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in report:
        cells = (
            r["mode"],
            r["clips_per_s"],
            r["audio_s_per_s"],
            r["p50_s"],
            r["p95_s"],
            r["p99_s"],
            f"{100 * (r['wer'] or 0):.1f} %",
            r["lone_p95_s"],
        )
        print("| " + " | ".join(map(str, cells)) + " |")
    for r in report:
        print(
            f"{r['mode']}: batch sizes (windows per size) {r['batch_histogram']}; "
            f"failed {r['failed']}"
        )
    first = report[0]
    for r in report[1:]:
        if first["clips_per_s"]:
            ratio = r["clips_per_s"] / first["clips_per_s"]
            points = 100 * ((r["wer"] or 0) - (first["wer"] or 0))
            print(f"{r['mode']} / {first['mode']}: {ratio:.2f}x clips/s, WER {points:+.1f} points")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": {**machine, "load_1m_after": load_after}, "modes": report}, indent=2)
    )
    return 1 if any(r["failed"] for r in report) else 0


if __name__ == "__main__":
    sys.exit(main())
