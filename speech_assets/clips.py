"""Real speech for tests and benchmarks: the committed JFK and LibriVox clips, and longer
concatenations.

Every clip comes with its reference text, so a benchmark can report WER beside speed.
"""

from __future__ import annotations

import base64
import io
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
RATE = 16000
JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)


@dataclass(frozen=True)
class Clip:
    name: str
    samples: np.ndarray
    text: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE

    def wav_bytes(self) -> bytes:
        return wav_bytes(self.samples)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path.name}: expected 16 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def wav_bytes(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def clips() -> list[Clip]:
    """JFK and the five LibriVox clips (about 36 s of real speech in all)."""
    out = [Clip("jfk", read_wav(DATA / "jfk.wav"), JFK_TEXT)]
    for path in sorted((DATA / "librivox").glob("*.wav")):
        out.append(Clip(path.stem, read_wav(path), path.with_suffix(".txt").read_text().strip()))
    return out


def long_clip(min_seconds: float, gap_seconds: float = 1.0) -> Clip:
    """The real clips repeated, with silence between them, until at least ``min_seconds``."""
    gap = np.zeros(int(gap_seconds * RATE), np.float32)
    parts: list[np.ndarray] = []
    texts: list[str] = []
    total = 0.0
    while total < min_seconds:
        for clip in clips():
            parts += [clip.samples, gap]
            texts.append(clip.text)
            total += clip.seconds + gap_seconds
            if total >= min_seconds:
                break
    return Clip(f"speech-{int(total)}s", np.concatenate(parts[:-1]), " ".join(texts))


def words(text: str) -> list[str]:
    keep = "".join(c.lower() if c.isalnum() or c.isspace() else " " for c in text)
    return keep.split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate by edit distance over lower-cased words without punctuation."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def short_jobs(max_seconds: float = 6.5) -> list[tuple[str, str]]:
    """The real speech clips shorter than ``max_seconds`` (the LibriVox ones, 3 to 6 s) as
    a job's base64 WAV and their text."""
    return [
        (base64.b64encode(wav_bytes(c.samples)).decode(), c.text)
        for c in clips()
        if len(c.samples) < max_seconds * RATE
    ]
