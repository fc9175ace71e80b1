"""Peak memory of one job against audio length: sequential decoding vs the engine.

``python -m bench memory --lengths 600,3600,7200``: for each length, real speech (the
speech_assets.clips clips repeated) encoded as FLAC and served from 127.0.0.1, one job per fresh
``whisper-worker job`` process, at ``batch_size`` 1 (sequential: faster-whisper computes
the features of the whole file at once) and 8 (the engine: features per 30-s window).
Reports each process's peak RSS (getrusage of the child) beside the idle worker's and
writes a JSON (and a plot with ``--plot``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import av
import numpy as np

from bench.common.machine import describe, stamp
from speech_assets.clips import RATE, long_clip

ROOT = Path(__file__).resolve().parents[2]


def write_flac(path: Path, samples: np.ndarray) -> None:
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    with av.open(str(path), "w", format="flac") as out:
        stream = out.add_stream("flac", rate=RATE, layout="mono")
        for start in range(0, len(pcm), RATE * 10):
            block = np.ascontiguousarray(pcm[start : start + RATE * 10]).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="mono")
            frame.rate = RATE
            for p in stream.encode(frame):
                out.mux(p)
        for p in stream.encode(None):
            out.mux(p)


def child_peak_mib(
    cmd: list[str], env: dict[str, str], stdin: str, out: list[str] | None = None
) -> tuple[float, float, int]:
    """(peak RSS MiB, seconds, exit code) of one child process (its own rusage, wait4);
    its stdout is appended to ``out`` when given."""
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if out is not None:
            stdout.seek(0)
            out.append(stdout.read())
    return usage.ru_maxrss / 1024, time.perf_counter() - t, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--lengths", default="600,3600", help="seconds, default 600,3600")
    parser.add_argument("--batches", default="8,1", help="batch sizes to compare (default 8,1)")
    parser.add_argument(
        "--model", default="tiny.en", help="tiny.en (packaged) or base (assembled from PyPI)"
    )
    parser.add_argument(
        "--malloc", default="keep", help="allocator policies, e.g. system,keep (WHISPER_MALLOC)"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "memory.json"))
    parser.add_argument("--plot", help="also draw peak RSS against length into this PNG")
    args = parser.parse_args(argv)
    machine = describe()
    lengths = sorted(float(x) for x in args.lengths.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    env = {
        **os.environ,
        "WHISPER_DEVICE": "cpu",
        "WHISPER_ALLOW_PRIVATE_URLS": "true",
        "WHISPER_WARMUP": "false",
        "WHISPER_LOG_LEVEL": "WARNING",
    }
    if args.model == "base":
        from speech_assets.models import base_dir

        env["WHISPER_MODEL"] = str(base_dir(ROOT / "bench" / "out" / "whisper-base"))
    elif args.model != "tiny.en":
        env["WHISPER_MODEL"] = args.model
    rows = []
    with tempfile.TemporaryDirectory() as tmp:

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a: object, **k: object) -> None:
                super().__init__(*a, directory=tmp, **k)  # type: ignore[arg-type]

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            idle, _, _ = child_peak_mib(
                [sys.executable, "-c", "from handler.startup import start_worker; start_worker()"],
                env,
                "",
            )
            for seconds in lengths:
                name = f"speech-{int(seconds)}.flac"
                write_flac(Path(tmp) / name, long_clip(seconds).samples)
                url = f"http://127.0.0.1:{server.server_port}/{name}"
                for b, policy in [(b, m) for b in batches for m in args.malloc.split(",")]:
                    job = json.dumps(
                        {"input": {"audio_url": url, "batch_size": b, "output": ["text"]}}
                    )
                    stdout: list[str] = []
                    peak, dt, rc = child_peak_mib(
                        [sys.executable, "-m", "handler.cli", "job", "-"],
                        {**env, "WHISPER_MALLOC": policy},
                        job,
                        stdout,
                    )
                    row = {
                        "seconds": seconds,
                        "batch_size": b,
                        "malloc": policy,
                        "peak_mib": round(peak),
                        "over_idle_mib": round(peak - idle),
                        "wall_s": round(dt, 1),
                        "rtf": _rtf(stdout[0], seconds),
                        "rc": rc,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            server.shutdown()
    print(f"idle worker: {idle:.0f} MiB")
    print("| audio | batch | malloc | peak MiB | over idle MiB | wall s | RTF |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seconds'] / 60:.0f} min | {r['batch_size']} | {r['malloc']} | "
            f"{r['peak_mib']} | {r['over_idle_mib']} | {r['wall_s']} | {r['rtf']} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = stamp({"model": args.model, "idle_mib": round(idle), "rows": rows}, machine)
    out.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(rows, idle, args.model, Path(args.plot))
        print(f"plot      {args.plot}")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def _rtf(stdout: str, seconds: float) -> float | None:
    """The job's model seconds per audio second, from its printed output."""
    try:
        return round(json.loads(stdout)["timings"]["transcribe"] / seconds, 4)
    except (ValueError, KeyError, TypeError):
        return None


def plot(rows: list[dict], idle: float, model: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for b in sorted({r["batch_size"] for r in rows}):
        mine = [
            r for r in rows if r["batch_size"] == b and r.get("malloc") == rows[-1].get("malloc")
        ]
        label = "sequential (batch 1)" if b == 1 else f"engine (batch {b})"
        ax.plot(
            [r["seconds"] / 3600 for r in mine],
            [r["over_idle_mib"] for r in mine],
            marker="o",
            label=label,
        )
    ax.set_xlabel("audio length (hours of real speech)")
    ax.set_ylabel(f"peak RSS over the idle worker (MiB; idle {idle:.0f})")
    ax.set_title(f"Peak memory of one job against audio length ({model}, CPU)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


if __name__ == "__main__":
    sys.exit(main())
