"""Where to cut a long recording into pieces for other workers (``split``, issue 33).

Cuts go in silences the VAD finds, each as near as it can be to an equal share of the
recording: the middle of the longest pause within ``SEARCH`` of the share's end (of the
part of it within that reach), else the pause nearest it. A cut is never inside speech,
so no word is split between two pieces and none is transcribed twice; with no pause at all
near a share, the share's end is used.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from faster_whisper.vad import get_speech_timestamps

from handler.inference.options import vad_options

SAMPLE_RATE = 16000
SEARCH = 0.15
"""How far (a share of the piece length) from the equal cut a pause is looked for."""
MIN_PIECE_S = 10.0
"""No piece shorter than this: a piece pays a worker's overhead and a 30-s window."""


def count(split: int | str, seconds: float, auto_piece_s: float, most: int) -> int:
    """How many pieces ``split`` asks for on ``seconds`` of audio."""
    n = int(np.ceil(seconds / auto_piece_s)) if split == "auto" else int(split)
    return max(1, min(n, most, int(seconds // MIN_PIECE_S) or 1))


Spans = list[dict[str, int]]


def speech(audio: np.ndarray, kwargs: dict[str, Any] | None = None) -> Spans:
    """The VAD's speech spans (the job's options, pauses from 300 ms), in samples."""
    options = vad_options(kwargs or {}, min_silence_duration_ms=300)
    return list(get_speech_timestamps(audio, options))


def heard(spans: Spans, a: int, b: int) -> bool:
    """Whether any speech span reaches into ``[a, b)``."""
    return any(s["start"] < b and s["end"] > a for s in spans)


def cut_points(
    audio: np.ndarray, n: int, kwargs: dict[str, Any] | None = None, spans: Spans | None = None
) -> list[int]:
    """n-1 sample positions in silence, increasing, splitting ``audio`` in near-equal shares
    (``spans``: the VAD's, when already found)."""
    if n <= 1:
        return []
    spans = speech(audio, kwargs) if spans is None else spans
    gaps = [(a["end"], b["start"]) for a, b in zip(spans, spans[1:], strict=False)]
    if spans:
        gaps = [(0, spans[0]["start"]), *gaps, (spans[-1]["end"], len(audio))]
    share = len(audio) / n
    cuts: list[int] = []
    for k in range(1, n):
        target = k * share
        low, high = target - SEARCH * share, target + SEARCH * share
        near = [g for g in gaps if g[1] > low and g[0] < high and g[1] > g[0]]
        if near:
            # The part of the pause inside the window: a long pause (a break, a quiet
            # stretch) spanning several shares is cut at each of them, not at its middle
            # once (which merged two pieces into one).
            best = max(near, key=lambda g: min(g[1], high) - max(g[0], low))
            best = (max(best[0], int(low)), min(best[1], int(high)))
        elif gaps:
            best = min(gaps, key=lambda g: abs((g[0] + g[1]) / 2 - target))
        else:
            best = (int(target), int(target))
        cut = (best[0] + best[1]) // 2
        if (not cuts or cut > cuts[-1] + SAMPLE_RATE) and 0 < cut < len(audio) - SAMPLE_RATE:
            cuts.append(cut)
    return cuts
