"""Sizes of a built image, layer by layer, as a registry stores them.

    python -m bench image-sizes whisper-worker:cpu [more images...]

Saves the image with ``podman save --format docker-dir`` into a temporary folder, pairs each
layer with the Dockerfile step that made it (the image config's history), and prints a
markdown table: the layer's size unpacked (its tar) and gzipped at level 6 (what ``docker
push`` uploads and a host pulls). Needs podman (bench/image.sh builds the images).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

PODMAN = ["podman", "--runtime", "runc"]
MIB = 1024 * 1024


@dataclass
class Layer:
    step: str
    size: int
    gzipped: int


def gzip_size(path: Path, level: int = 6) -> int:
    """Bytes of the file gzipped at ``level``, streamed (layers are hundreds of MB)."""
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)
    total = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            total += len(comp.compress(chunk))
    return total + len(comp.flush())


LABELS = [
    # (a piece of the history line, what the layer is): the Dockerfile's steps, in order.
    ("ADD file:", "ubuntu:24.04 (the base)"),
    ("apt-get install", "python3, python3-venv, ca-certificates; the venv; the worker user"),
    ("tomllib", "Python dependencies (+ cuBLAS on the CUDA image)"),
    ("diarizer-gpu.txt", "onnxruntime-gpu + cuDNN, cuFFT, cuRAND, CUDA runtime (DIARIZER_GPU)"),
    ("builder.fetch_model", "the model"),
    ("/models/", "the diarizer's ONNX model (DIARIZATION)"),
    ("./handler/", "the worker's code (copied)"),
    ("--no-deps", "the worker's code (installed, bytecode compiled)"),
    ("COPY file:", "test_input.json (the image's self-test job)"),
]


def short_step(created_by: str) -> str:
    """What the layer is, from the history line that made it."""
    for piece, label in LABELS:
        if piece in created_by:
            return label
    text = " ".join(created_by.split())
    return text if len(text) <= 70 else text[:67] + "..."


def layers(image: str) -> list[Layer]:
    with tempfile.TemporaryDirectory(prefix="image-sizes-", dir="/var/tmp") as tmp:
        out = Path(tmp) / "img"
        subprocess.run(
            [*PODMAN, "save", "--format", "docker-dir", "-o", str(out), image],
            check=True,
            capture_output=True,
        )
        manifest = json.loads((out / "manifest.json").read_text())
        config_digest = manifest["config"]["digest"].split(":", 1)[1]
        config = json.loads((out / config_digest).read_text())
        steps = [h for h in config.get("history", []) if not h.get("empty_layer")]
        blobs = [entry["digest"].split(":", 1)[1] for entry in manifest["layers"]]
        if len(steps) != len(blobs):  # an imported base has no history: name it
            steps = [{"created_by": "(base image)"}] * (len(blobs) - len(steps)) + steps
        result = []
        for step, blob in zip(steps, blobs, strict=True):
            path = out / blob
            result.append(
                Layer(short_step(step.get("created_by", "")), path.stat().st_size, gzip_size(path))
            )
        return result


def table(image: str, rows: list[Layer]) -> str:
    lines = [f"`{image}`", "", "| layer (Dockerfile step) | MiB | gzipped MiB |", "|---|---|---|"]
    for row in rows:
        if row.size < 64 * 1024:
            continue  # ENV/WORKDIR/ARG-only layers of a few KiB
        step = row.step.replace("|", "/")
        lines.append(f"| {step} | {row.size / MIB:.0f} | {row.gzipped / MIB:.0f} |")
    total = sum(r.size for r in rows)
    gz = sum(r.gzipped for r in rows)
    lines.append(f"| **the image** | **{total / MIB:.0f}** | **{gz / MIB:.0f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+")
    args = parser.parse_args(argv)
    for image in args.images:
        print(table(image, layers(image)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
