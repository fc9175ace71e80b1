"""Milliseconds per 30-s window, and the kernel's share of the CPU, under each allocator policy.

``python -m bench alloc``: for each model (tiny.en, and base when its parts are installed)
and each policy of handler/inference/allocator.py (``system``: glibc as it comes; ``keep``: the
worker's default), a fresh process imports the worker package (which applies the policy),
loads the model with faster-whisper as the worker does (int8, the worker's thread count) and
times CTranslate2's encoder and beam-5 decoder on real speech windows (tests/data: JFK and
the LibriVox readings), at batch 1 and batch 8, ``--rounds`` times after one warm-up round.
Prints the per-window table (median of the rounds) with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common.machine import describe, line
from speech_assets.models import ModelMissing, model_dir

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, time
import handler  # applies the allocator policy, as every entry point does
from handler.inference import allocator
from handler.inference.threads import default_cpu_threads
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio, pad_or_trim

model_path, files, rounds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
compute = sys.argv[4]
m = WhisperModel(model_path, device="cpu", compute_type=compute, cpu_threads=default_cpu_threads(1))
feats = [pad_or_trim(m.feature_extractor(decode_audio(f))[..., :3000]) for f in files]
prompt = [50258, 50259, 50359, 50363] if m.model.is_multilingual else [50257, 50362]
out = {"policy": allocator.policy(), "compute_type": m.model.compute_type}

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime

for bs in (1, 8):
    x = np.stack([feats[i % len(feats)] for i in range(bs)])
    enc_ms, gen_ms, sys_share = [], [], []
    for r in range(rounds + 1):
        u0, s0 = cpu(); t = time.perf_counter()
        enc = m.encode(x)
        e = time.perf_counter() - t; u1, s1 = cpu()
        t = time.perf_counter()
        m.model.generate(enc, [prompt] * bs, beam_size=5, max_length=224)
        g = time.perf_counter() - t
        if r:  # the first round is the warm-up
            enc_ms.append(1000 * e / bs); gen_ms.append(1000 * g / bs)
            sys_share.append((s1 - s0) / max(1e-9, (u1 - u0) + (s1 - s0)))
    out[f"batch{bs}"] = {"encode_ms": enc_ms, "generate_ms": gen_ms, "kernel_share": sys_share}
print(json.dumps(out))
"""


def run(model: str, path: Path, policy: str, rounds: int, compute: str = "int8") -> dict:
    files = [str(ROOT / "tests" / "data" / "jfk.wav")] + sorted(
        str(p) for p in (ROOT / "tests" / "data" / "librivox").glob("*.wav")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    env["WHISPER_MALLOC"] = policy
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), json.dumps(files), str(rounds), compute],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-1500:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench alloc", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default="system,keep", help="allocator policies to run")
    parser.add_argument(
        "--compute-types",
        default="int8",
        help="CTranslate2 compute types, e.g. int8,int8_float32,int8_bfloat16,"
        "bfloat16 (one a CPU cannot run is reported, not fatal)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "alloc.json"))
    args = parser.parse_args(argv)
    machine = describe()
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            try:
                path = model_dir(name, Path(tmp) / name)
            except ModelMissing as exc:
                print(f"{name}: skipped ({exc})")
                continue
            for policy, compute in [
                (p, c) for p in args.policies.split(",") for c in args.compute_types.split(",")
            ]:
                try:
                    r = run(name, path, policy, args.rounds, compute)
                except RuntimeError as exc:
                    print(f"{name} {compute}: not run ({str(exc).strip().splitlines()[-1]})")
                    continue
                results.append({"model": name, **r})
                cells = [name, r["policy"], f"{compute} ({r['compute_type']})"]
                for bs in (1, 8):
                    d = r[f"batch{bs}"]
                    cells += [
                        f"{statistics.median(d['encode_ms']):.0f}",
                        f"{statistics.median(d['generate_ms']):.0f}",
                        f"{100 * statistics.median(d['kernel_share']):.0f} %",
                    ]
                rows.append(cells)
    print(line(machine, describe()["load_1m"]))
    head = [
        "model",
        "policy",
        "compute type (used)",
        "encode b1",
        "generate b1",
        "kernel b1",
        "encode b8 (per window)",
        "generate b8 (per window)",
        "kernel b8",
    ]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
