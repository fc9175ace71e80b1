"""The GPU diarizer's packages, checked on a machine without a GPU.

    python -m bench diarizer-gpu-libs [--keep]

What the image's ``DIARIZER_GPU=true`` installs (builder/diarizer-gpu.txt) goes into a
virtualenv of its own under bench/out/diarizer-gpu (deleted after unless ``--keep``), with
``nvidia-cublas-cu12`` 12.8.4.1 and ``nvidia-cuda-runtime-cu12`` 12.8.90 standing in for
what the CUDA base image has as system libraries (libcublas-12-8, cudart 12.8). Then:

- every shared library that onnxruntime's CUDA provider needs (``ldd``, with the nvidia
  packages' lib folders on the path, as ``onnxruntime.preload_dlls`` loads them in the
  image) resolves, except ``libcuda.so.1``, which the host's driver brings;
- the worker's diarizer, asked for the GPU in that environment on this GPU-less
  machine, falls back to the CPU, says so in the log, and embeds as the CPU build does;
- the megabytes installed, against the CPU onnxruntime they replace.

No GPU runs here: whether the provider loads and how fast it is on one is
``bench/gpu_check.sh``'s diarizer line, on a GPU machine with that image.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "builder" / "diarizer-gpu.txt"
STAND_INS = ["nvidia-cublas-cu12==12.8.4.1", "nvidia-cuda-runtime-cu12==12.8.90"]
DRIVER = {"libcuda.so.1"}

PROBE = """
import json, logging, sys, numpy as np
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
import onnxruntime
from handler.inference.speakers import diarizer as diarize
cpu_build = diarize.load(sys.argv[1], threads=1, device="cpu")
gpu_build = diarize.load(sys.argv[1], threads=1, device="cuda")
feats = np.random.default_rng(0).normal(size=(2, 150, 80)).astype(np.float32)
diff = float(np.abs(cpu_build.embed(feats) - gpu_build.embed(feats)).max())
print(json.dumps({"onnxruntime": onnxruntime.__version__,
                  "available": onnxruntime.get_available_providers(),
                  "provider": gpu_build.provider, "max_abs_diff": diff}))
"""


def _du_mib(paths: list[Path]) -> float:
    total = 0
    for p in paths:
        for f in p.rglob("*") if p.is_dir() else [p]:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
    return round(total / 2**20, 1)


def _cpu_onnxruntime_mib() -> float | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return _du_mib([Path(onnxruntime.__file__).parent])


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench diarizer-gpu-libs", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the virtualenv")
    parser.add_argument("--dest", type=Path, default=ROOT / "bench" / "out" / "diarizer-gpu")
    args = parser.parse_args(argv)
    from speech_assets.diarization import diarizer_dir

    model = diarizer_dir()
    venv = args.dest
    shutil.rmtree(venv, ignore_errors=True)
    report: dict[str, object] = {}
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        t = time.perf_counter()
        subprocess.run(
            [py, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS), *STAND_INS], check=True
        )
        report["install_s"] = round(time.perf_counter() - t, 1)
        site = _site(venv)
        nvidia = site / "nvidia"
        lib_dirs = sorted(str(p) for p in nvidia.glob("*/lib"))
        provider_lib = site / "onnxruntime" / "capi" / "libonnxruntime_providers_cuda.so"
        env = {**os.environ, "LD_LIBRARY_PATH": ":".join(lib_dirs)}
        ldd = subprocess.run(["ldd", str(provider_lib)], capture_output=True, text=True, env=env)
        missing = sorted({ln.split()[0] for ln in ldd.stdout.splitlines() if "not found" in ln})
        report["missing_libraries"] = missing
        report["only_the_driver_missing"] = set(missing) <= DRIVER
        ours = [site / "onnxruntime", *(nvidia / n for n in ("cudnn", "cufft", "curand"))]
        report["installed_mib"] = {
            "onnxruntime-gpu": _du_mib([site / "onnxruntime"]),
            "cudnn": _du_mib([nvidia / "cudnn"]),
            "cufft": _du_mib([nvidia / "cufft"]),
            "curand": _du_mib([nvidia / "curand"]),
            "total": _du_mib(ours),
            "onnxruntime_cpu_replaced": _cpu_onnxruntime_mib(),
        }
        probe = subprocess.run(
            [py, "-c", PROBE, str(model)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        lines = probe.stdout.strip().splitlines()
        report["probe"] = (
            json.loads(lines[-1])
            if probe.returncode == 0 and lines
            else {"error": probe.stderr.strip().splitlines()[-1:] or ["no output"]}
        )
        report["fallback_logged"] = "diarizer on the CPU" in probe.stderr
    finally:
        if not args.keep:
            shutil.rmtree(venv, ignore_errors=True)
    print(json.dumps(report, indent=2))
    probe_ok = isinstance(report.get("probe"), dict) and "error" not in report["probe"]  # type: ignore[operator]
    return 0 if report.get("only_the_driver_missing") and probe_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
