"""The GPU check, prepared for the day a GPU is lent: one run, one JSON, one table.

``bench/gpu_check.sh`` (or ``python -m bench gpu-check``) measures, per model:

- real-time factor of a long real-speech file (speech_assets.clips clips repeated) at batch
  1 (sequential) and 8/16/32 (the engine), float16 on CUDA;
- a burst of short clips held at once: one job at a time against the engine;
- the NVIDIA driver and GPUs as the host reports them, and the sentence the worker would
  refuse them with (below R570);
- cold start split from the worker's own start-up line (imports, load, warm-up, the speech
  self-test, ready); a model whose self-test fails is skipped with the worker's message;
- GPU memory per loaded instance (nvidia-smi before and after the load);
- bench fanout's line: a 20-minute recording unsplit and in 4 pieces on 4 warm
  worker processes sharing the GPU, under the local emulator;
- a marathon on the first model: one 2-hour job of real speech, its words per 10-minute
  stretch (an empty stretch late in the file is the silent failure reported of some
  drivers) and the most times a phrase repeats back to back (a repetition loop).

It runs in-process on whatever models are on the machine (names resolve as the worker's:
``WHISPER_DOWNLOAD_ROOT``, a manifest, RunPod's cache, a folder) and skips a model it
cannot load. The same code runs on the CPU (``--device cpu --models tiny.en``), which is
how it is tested here. Meant to finish in under 8 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from speech_assets.clips import Clip, clips, long_clip, wav_bytes, wer

ROOT = Path(__file__).resolve().parents[2]


def gpu_memory_mib() -> float | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    out = subprocess.run(
        [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    )
    try:
        return float(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def _job(clip: Clip, **options: Any) -> dict[str, Any]:
    audio = base64.b64encode(wav_bytes(clip.samples)).decode()
    return {"audio_base64": audio, "output": ["text"], **options}


def _burst(worker: Any, short: list[Clip], batch: int) -> dict[str, Any]:
    from handler.pipeline.job import run_job

    texts: list[tuple[Clip, str]] = []
    lock = threading.Lock()
    sem = threading.Semaphore(max(1, batch * 2 if batch > 1 else 1))

    def one(c: Clip) -> None:
        with sem:
            out = run_job(_job(c, batch_size=batch), worker)
        with lock:
            texts.append((c, out.get("text", "")))

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(c,)) for c in short]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "clips": len(short),
        "clips_per_s": round(len(short) / wall, 2),
        "wer": round(sum(wer(c.text, t) for c, t in texts) / len(texts), 4),
    }


STRETCH_S = 600.0
"""The marathon's report is per stretch of this many seconds."""


def max_repeats(text: str, longest: int = 4) -> int:
    """The most times any 1- to ``longest``-word phrase repeats back to back in ``text``:
    a repetition loop reads as hundreds; real speech rarely passes 3."""
    w = text.lower().split()
    best = 1
    for n in range(1, longest + 1):
        for start in range(n):
            run, prev = 1, None
            for i in range(start, len(w) - n + 1, n):
                gram = tuple(w[i : i + n])
                run = run + 1 if gram == prev else 1
                prev = gram
                best = max(best, run)
    return best


def marathon(worker: Any, minutes: float) -> dict[str, Any]:
    """One job of ``minutes`` of real speech (the clips repeated 1 s apart): its speed, its
    WER, and per 10-minute stretch the words found against those spoken. A stretch with
    almost none late in the file is the silent failure reported of CTranslate2 on some
    drivers (a long file going empty after 1 h 49 min); ``max_repeats`` is a loop's mark
    left in the text, ``loop_warnings`` the loops the guard mended before."""
    from handler.pipeline.job import run_job

    clip = long_clip(minutes * 60)
    t = time.perf_counter()
    out = run_job({"output": ["text", "segments"]}, worker, samples=clip.samples)
    took = time.perf_counter() - t
    if "error" in out:
        return {"audio_s": round(clip.seconds), "error": out.get("error_code")}
    spoken = len(clip.text.split()) / clip.seconds
    stretches = []
    for k in range(int(np.ceil(clip.seconds / STRETCH_S))):
        a, b = k * STRETCH_S, min((k + 1) * STRETCH_S, clip.seconds)
        found = sum(len(s["text"].split()) for s in out["segments"] if a <= s["start"] < b)
        stretches.append(round(float(found / max(1.0, spoken * (b - a))), 2))
    return {
        "audio_s": round(clip.seconds),
        "rtf": round(took / clip.seconds, 4),
        "wer": round(wer(clip.text, out["text"]), 4),
        "words_found_per_stretch": stretches,
        "empty_stretches": int(sum(x < 0.2 for x in stretches)),
        "max_repeats": max_repeats(out["text"]),
        # loops the worker's guard mended (decoded again or collapsed): where they were
        "loop_warnings": [w for w in out.get("warnings", []) if "repetition loop" in w],
    }


def check_model(
    name: str, device: str, batches: list[int], long_s: float, burst: int, marathon_min: float = 0
) -> dict:
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker

    before = gpu_memory_mib()
    t = time.perf_counter()
    env = {"WHISPER_DEVICE": device, "WHISPER_MODEL": name, "WHISPER_WARMUP": "true"}
    for key in ("WHISPER_DOWNLOAD_ROOT", "WHISPER_MANIFEST", "WHISPER_RUNPOD_CACHE_DIR"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    worker = start_worker(load_settings(env))
    load_s = time.perf_counter() - t
    after = gpu_memory_mib()
    result: dict[str, Any] = {
        "model": name,
        "device": worker.pool.device,
        "compute": worker.pool.compute,
        "load_and_warmup_s": round(load_s, 2),
        "gpu_mib_per_instance": None if before is None or after is None else round(after - before),
    }
    clip = long_clip(long_s)
    rtf = {}
    for b in batches:
        t = time.perf_counter()
        out = run_job(_job(clip, batch_size=b), worker)
        rtf[str(b)] = {
            "rtf": round((time.perf_counter() - t) / clip.seconds, 4),
            "wer": round(wer(clip.text, out.get("text", "")), 4),
        }
    result["long_audio_s"] = round(clip.seconds, 1)
    result["rtf_by_batch"] = rtf
    short = [c for c in clips()] * (burst // len(clips()) + 1)
    short = short[:burst]
    result["burst_sequential"] = _burst(worker, short, 1)
    result["burst_engine"] = _burst(worker, short, max(batches))
    if marathon_min > 0:
        result["marathon"] = marathon(worker, marathon_min)
    return result


def cold_start(device: str, name: str) -> dict[str, Any]:
    from handler.contract import parse_startup_line

    env = {**os.environ, "WHISPER_DEVICE": device, "WHISPER_MODEL": name}
    env.pop("RUNPOD_WEBHOOK_GET_JOB", None)
    proc = subprocess.run(
        [sys.executable, "-m", "handler"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    for line in proc.stderr.splitlines():
        data = parse_startup_line(line)
        if data:
            keys = ("imports", "model_load", "warmup", "self_test", "runpod_import", "ready")
            return {k: round(float(data[k]), 3) for k in keys}
    return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no line"}


def diarizer_speed(model_dir: Path, seconds: float, device: str) -> dict[str, Any]:
    """The diarizer on a long recording of the committed clips, on ``device`` and on the
    CPU in the same run: seconds per audio minute and the onnxruntime provider each ran
    on (the CPU unless the image was built with DIARIZER_GPU=true, onnxruntime-gpu). The
    exported model reaches a machine without the network by ``run``'s carry of
    ``models/diarizer`` (28 MB)."""
    from handler.inference.speakers import diarizer as diarize
    from handler.inference.speakers.clusters import SpeakerCount

    clip = long_clip(seconds)
    out: dict[str, Any] = {"audio_s": round(clip.seconds, 1)}
    for where in dict.fromkeys([device, "cpu"]):
        d = diarize.load(str(model_dir), device=where)
        result = d.run(clip.samples, SpeakerCount())
        out[where] = {
            "provider": d.provider,
            "seconds": round(result.seconds, 2),
            "s_per_audio_min": round(result.seconds / (clip.seconds / 60), 3),
            "timings": {k: round(v, 2) for k, v in result.timings.items()},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu-check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="turbo,large-v3")
    parser.add_argument("--batches", default="1,8,16,32")
    parser.add_argument("--long-seconds", type=float, default=600.0)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument(
        "--marathon-minutes",
        type=float,
        default=120.0,
        help="one job this long on the first model: words per 10-minute stretch, loops (0: skip)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "gpu_check.json"))
    parser.add_argument(
        "--diarizer",
        type=Path,
        default=ROOT / "models" / "diarizer",
        help="the exported diarizer (timed when the folder exists)",
    )
    parser.add_argument(
        "--fanout-minutes",
        type=float,
        default=20.0,
        help="bench fanout's line: this long a recording unsplit and in 4 "
        "pieces on 4 warm workers sharing the GPU (0: skip)",
    )
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    from handler.inference import selftest

    driver = selftest.read_driver()  # and the floor the worker refuses below, said at once
    report: dict[str, Any] = {
        "device": args.device,
        "driver": {
            "version": driver.version,
            "gpus": list(driver.gpus),
            "refused": selftest.driver_refusal(driver),
        },
        "models": [],
    }
    print(json.dumps({"driver": report["driver"]}), flush=True)
    marathon_min = args.marathon_minutes
    for name in args.models.split(","):
        try:
            entry = check_model(
                name, args.device, batches, args.long_seconds, args.burst, marathon_min
            )
            marathon_min = 0  # the first model that loads runs it
            entry["cold_start"] = cold_start(args.device, name)
        except Exception as exc:  # a model not on this machine (or its self-test failed)
            entry = {"model": name, "skipped": f"{type(exc).__name__}: {str(exc)[:600]}"}
        report["models"].append(entry)
        print(json.dumps(entry), flush=True)
    print("\n| model | RTF by batch | burst clips/s: sequential -> engine | GPU MiB | ready s |")
    print("|---|---|---|---|---|")
    for m in report["models"]:
        if "skipped" in m:
            print(f"| {m['model']} | skipped: {m['skipped']} | | | |")
            continue
        rtf = ", ".join(f"{b}: {v['rtf']}" for b, v in m["rtf_by_batch"].items())
        burst = f"{m['burst_sequential']['clips_per_s']} -> {m['burst_engine']['clips_per_s']}"
        print(
            f"| {m['model']} | {rtf} | {burst} | {m['gpu_mib_per_instance']} | "
            f"{m['cold_start'].get('ready')} |"
        )
    for m in report["models"]:
        if "marathon" in m:
            print(f"marathon ({m['model']}): {json.dumps(m['marathon'])}")
    if (args.diarizer / "manifest.json").exists():
        report["diarizer"] = diarizer_speed(args.diarizer, args.long_seconds, args.device)
        print(f"diarizer: {report['diarizer']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    loaded = [m["model"] for m in report["models"] if "skipped" not in m]
    if args.fanout_minutes > 0 and loaded:
        # Last, after the JSON is written: the one stage that starts worker processes.
        from bench.cost import fanout

        fo = fanout.run(args.fanout_minutes, [1, 4], ["warm"], loaded[0], args.device)
        report["fanout"] = fo
        print(fanout.table([fo]))
        out.write_text(json.dumps(report, indent=2))
    return 0 if all("skipped" not in m for m in report["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
