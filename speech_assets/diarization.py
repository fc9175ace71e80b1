"""Real speech with known speakers, and the diarizer's model, for tests and benches.

- The pyannote sample: ``pyannote/audio/sample/sample.wav`` (30 s, two speakers on a
  telephone line, overlapping speech) with ``sample.rttm`` (who spoke when), inside the
  ``pyannote.audio`` 4.0.7 wheel on PyPI (MIT). The wheel is downloaded without its
  dependencies and read as a zip; nothing of pyannote is installed or imported.
- The diarizer's model: builder/diarizer.py's export (torch at build time only) into
  ``models/diarizer`` at the repository's root, built once.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "out" / "assets"
PYANNOTE = "pyannote.audio==4.0.7"
PYANNOTE_WHEEL = "pyannote_audio-4.0.7-py3-none-any.whl"
PYANNOTE_SHA256 = "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6"
SAMPLE = "pyannote/audio/sample/sample"
DIARIZER_DIR = ROOT / "models" / "diarizer"


class AssetMissing(RuntimeError):
    pass


def pyannote_sample(cache: Path = CACHE) -> tuple[Path, str]:
    """(the sample's wav file, its RTTM text), fetched once into ``cache``."""
    wav, rttm = cache / "pyannote-sample.wav", cache / "pyannote-sample.rttm"
    if wav.exists() and rttm.exists():
        return wav, rttm.read_text()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / PYANNOTE_WHEEL
    if not wheel.exists():
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PYANNOTE, "-d",
             str(cache)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0 or not wheel.exists():
            raise AssetMissing(f"pip download {PYANNOTE} failed: {proc.stderr[-300:]}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != PYANNOTE_SHA256:
        raise AssetMissing(f"{wheel.name}: sha256 {digest}, expected {PYANNOTE_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        wav.write_bytes(z.read(SAMPLE + ".wav"))
        rttm.write_text(z.read(SAMPLE + ".rttm").decode())
    return wav, rttm.read_text()


def rttm_turns(text: str) -> list[tuple[float, float, str]]:
    """(start, end, speaker) of each SPEAKER line."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0] == "SPEAKER":
            start, dur = float(parts[3]), float(parts[4])
            out.append((start, start + dur, parts[7]))
    return out


def diarizer_dir(dest: Path = DIARIZER_DIR) -> Path:
    """The exported speaker-embedding model (built with torch on first use)."""
    try:
        from builder import diarizer
    except ImportError as exc:  # pragma: no cover - the repository always has builder/
        raise AssetMissing(str(exc)) from None
    try:
        return diarizer.ensure(dest)
    except ImportError as exc:
        raise AssetMissing(
            f"{exc}: the diarizer's export needs torch and onnx (pip install '.[dev]')"
        ) from None
