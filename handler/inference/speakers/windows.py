"""A recording's speech regions and the windows embedded in them: the costly half of
diarizing, and what a split job's pieces send back for the whole to cluster."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handler.contract import SAMPLE_RATE
from handler.guard import Guard

WINDOW_S = 1.5


STEP_S = 0.5


MIN_WINDOW_S = 0.4


VAD_CHUNK_S = 300.0


@dataclass
class Windows:
    """A recording's speech regions and windows with their voice embeddings (sample
    positions): the costly half of diarizing. A split job's pieces compute theirs and the
    whole clusters them all at once. ``fine_emb`` None: not computed yet."""

    regions: list[tuple[int, int]]
    spans: list[tuple[int, int]]
    emb: np.ndarray
    fine: list[tuple[int, int]]
    fine_emb: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)
    noise: np.ndarray | None = None
    """The recording's noise floor, kept to embed the fine windows later (not sent)."""

    def shifted(self, offset: int) -> Windows:
        def move(xs: list[tuple[int, int]]) -> list[tuple[int, int]]:
            return [(a + offset, b + offset) for a, b in xs]

        return Windows(
            move(self.regions), move(self.spans), self.emb, move(self.fine), self.fine_emb
        )

    @staticmethod
    def joined(parts: list[Windows], dim: int) -> Windows:
        """Pieces in time order (already shifted) as one recording's windows."""
        fine = [p.fine_emb if p.fine_emb is not None else np.zeros((0, dim)) for p in parts]
        return Windows(
            [r for p in parts for r in p.regions],
            [s for p in parts for s in p.spans],
            np.concatenate([p.emb.reshape(-1, dim) for p in parts]).astype(np.float32),
            [f for p in parts for f in p.fine],
            np.concatenate(fine).astype(np.float32),
        )

    def to_json(self) -> dict[str, Any]:
        """Compact: embeddings as float16 (a 4-minute piece of speech: about 0.6 MB)."""

        def pack(x: np.ndarray | None) -> str:
            x = np.zeros((0, 0)) if x is None else x
            return base64.b64encode(x.astype("<f2").tobytes()).decode()

        return {
            "regions": self.regions,
            "spans": self.spans,
            "fine": self.fine,
            "emb": pack(self.emb),
            "fine_emb": pack(self.fine_emb),
        }

    @classmethod
    def from_json(cls, data: Any, dim: int) -> Windows:
        """A piece's windows; ValueError when they do not hold together."""

        def spans(key: str) -> list[tuple[int, int]]:
            out = [(int(a), int(b)) for a, b in data[key]]
            if any(b < a or a < 0 for a, b in out):
                raise ValueError(f"bad {key}")
            return out

        def unpack(key: str, n: int) -> np.ndarray:
            x = np.frombuffer(base64.b64decode(data[key]), dtype="<f2").astype(np.float32)
            if x.size != n * dim:
                raise ValueError(f"{key}: {x.size} numbers for {n} windows")
            return x.reshape(n, dim)

        win, fine = spans("spans"), spans("fine")
        return cls(
            spans("regions"), win, unpack("emb", len(win)), fine, unpack("fine_emb", len(fine))
        )


def speech_regions(samples: np.ndarray, guard: Guard | None = None) -> list[tuple[int, int]]:
    """(start, end) sample offsets of speech, by the Silero VAD faster-whisper ships, run
    VAD_CHUNK_S at a time (its working memory grows with the audio it is given)."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    options = VadOptions(min_silence_duration_ms=300, speech_pad_ms=100, min_speech_duration_ms=200)
    chunk = int(VAD_CHUNK_S * SAMPLE_RATE)
    out: list[tuple[int, int]] = []
    for offset in range(0, len(samples), chunk):
        if guard is not None:
            guard.check()
        found = get_speech_timestamps(samples[offset : offset + chunk], options)
        out += [(offset + int(r["start"]), offset + int(r["end"])) for r in found]
    return out


def windows(
    regions: list[tuple[int, int]], size_s: float = WINDOW_S, step_s: float = STEP_S
) -> list[tuple[int, int]]:
    """Windows of ``size_s`` every ``step_s`` inside each region; the last one ends at the
    region's end; a region shorter than a window is one window (if at least MIN_WINDOW_S)."""
    size, step = int(size_s * SAMPLE_RATE), int(step_s * SAMPLE_RATE)
    out: list[tuple[int, int]] = []
    for start, end in regions:
        if end - start < MIN_WINDOW_S * SAMPLE_RATE:
            continue
        if end - start <= size:
            out.append((start, end))
            continue
        s = start
        while s + size < end:
            out.append((s, s + size))
            s += step
        out.append((max(start, end - size), end))
    return out
