"""Transcribe time per audio second: the queue worker against the in-process path.

``python -m bench threads``: the same long real-speech job (the clips of speech_assets.clips
repeated to ``--seconds``) through ``python -m handler`` (the runpod SDK's local test
mode: the model loaded in the loader thread, run in a job thread of the SDK's loop) and
through ``whisper-worker job`` (loaded and run in the main thread), alternating, ``--runs``
each; optionally with ``stress-ng --cpu N`` beside them (``--load N``). Prints the median
``timings.transcribe / duration`` of each path and their ratio, and exits 1 when the queue
worker is more than ``--tolerance`` (10 %) slower. It was 3-4x slower before the OpenMP
wait policy and thread counts were set by the worker itself (handler/inference/threads.py).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common.machine import describe, line
from speech_assets.clips import long_clip

ROOT = Path(__file__).resolve().parents[2]


def _queue_worker(job_file: Path, env: dict[str, str]) -> dict:
    # The SDK's local test mode reads test_input.json from the working directory.
    proc = subprocess.run(
        [sys.executable, "-m", "handler"],
        cwd=job_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"'timings': (\{[^}]*\})", out)
    d = re.search(r"'duration': ([0-9.]+)", out)
    if proc.returncode != 0 or not m or not d:
        raise RuntimeError(f"python -m handler failed: {out[-800:]}")
    timings = json.loads(m.group(1).replace("'", '"'))
    return {"transcribe": timings["transcribe"], "duration": float(d.group(1))}


def _in_process(job_file: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "handler.cli", "job", str(job_file)],
        cwd=job_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"whisper-worker job failed: {proc.stderr[-800:]}")
    out = json.loads(proc.stdout)
    return {"transcribe": out["timings"]["transcribe"], "duration": out["duration"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench threads", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=73.0, help="audio length (default 73)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each path (default 3)")
    parser.add_argument("--load", type=int, default=0, help="stress-ng --cpu N beside (default 0)")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="worker env (PYTHONPATH=<old checkout>: old code)",
    )
    args = parser.parse_args(argv)
    machine = describe()
    env = {**os.environ, "WHISPER_DEVICE": "cpu", "RUNPOD_LOG_LEVEL": "INFO"}
    env.pop("RUNPOD_WEBHOOK_GET_JOB", None)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    clip = long_clip(args.seconds)
    stress = None
    if args.load:
        exe = shutil.which("stress-ng")
        if not exe:
            print("bench: --load needs stress-ng (apt-get install stress-ng)", file=sys.stderr)
            return 2
        stress = subprocess.Popen(
            [exe, "--cpu", str(args.load), "--timeout", "3600"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            job_file = Path(tmp) / "test_input.json"
            audio = base64.b64encode(clip.wav_bytes()).decode()
            job_file.write_text(json.dumps({"input": {"audio_base64": audio, "output": ["text"]}}))
            queue, inproc = [], []
            for i in range(args.runs):
                q = _queue_worker(job_file, env)
                p = _in_process(job_file, env)
                queue.append(q["transcribe"] / q["duration"])
                inproc.append(p["transcribe"] / p["duration"])
                print(
                    f"run {i + 1}: queue worker {queue[-1]:.4f} s/s, in-process "
                    f"{inproc[-1]:.4f} s/s",
                    flush=True,
                )
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait(10)
    q, p = statistics.median(queue), statistics.median(inproc)
    ratio = q / p
    print(
        f"{clip.seconds:.0f} s of speech, load {args.load}: queue worker {q:.4f} s per audio s,"
        f" in-process {p:.4f}; ratio {ratio:.2f} (limit {1 + args.tolerance:.2f})"
    )
    print(line(machine, describe()["load_1m"]))
    return 0 if ratio <= 1 + args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
