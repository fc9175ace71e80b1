"""Where to cut a long recording into pieces for other workers (``split``).

Cuts go in silences the VAD finds, each as near as it can be to an equal share of the
recording: the middle of the longest pause within ``SEARCH`` of the share's end (of the
part of it within that reach), else the pause nearest it. A cut is never inside speech,
so no word is split between two pieces and none is transcribed twice; with no pause at all
near a share, the share's end is used.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from faster_whisper.vad import get_speech_timestamps

from handler.contract import SAMPLE_RATE
from handler.inference.options import vad_options
from handler.inference.threads import usable_cpus

SEARCH = 0.15
"""How far (a share of the piece length) from the equal cut a pause is looked for."""
MIN_PIECE_S = 10.0
"""No piece shorter than this: a piece pays a worker's overhead and a 30-s window."""


def count(split: int | str, seconds: float, auto_piece_s: float, most: int) -> int:
    """How many pieces ``split`` asks for on ``seconds`` of audio."""
    n = int(np.ceil(seconds / auto_piece_s)) if split == "auto" else int(split)
    return max(1, min(n, most, int(seconds // MIN_PIECE_S) or 1))


Spans = list[dict[str, int]]


CHUNK_S = 300
"""The VAD's share of a long recording for one core is at least this long."""
WARM_S = 30
"""Each share is read from this much earlier, so the VAD's state is warm where it starts."""


def speech(audio: np.ndarray, kwargs: dict[str, Any] | None = None, cores: int = 0) -> Spans:
    """The VAD's speech spans (the job's options, pauses from 300 ms), in samples.

    Silero's VAD runs on one core (faster-whisper gives its session one thread), 7 s an
    hour of audio here, before any piece of a split job can start: a long recording is
    read in shares on up to ``cores`` cores (0: all usable), each from ``WARM_S`` earlier,
    and the spans joined where they meet or overlap.
    """
    options = vad_options(kwargs or {}, min_silence_duration_ms=300)
    n = len(audio)
    k = max(1, min(cores or usable_cpus(), n // (CHUNK_S * SAMPLE_RATE)))
    if k == 1:
        return list(get_speech_timestamps(audio, options))
    edges = [n * i // k // 512 * 512 for i in range(k)] + [n]

    def share(i: int) -> Spans:
        a, b = edges[i], edges[i + 1]
        start = max(0, a - WARM_S * SAMPLE_RATE) // 512 * 512
        found = get_speech_timestamps(audio[start:b], options)
        return [
            {"start": s["start"] + start, "end": s["end"] + start}
            for s in found
            if s["end"] + start > a
        ]

    with ThreadPoolExecutor(k, thread_name_prefix="vad") as pool:
        found = sorted(
            (s for part in pool.map(share, range(k)) for s in part), key=lambda s: s["start"]
        )
    joined: Spans = []
    for s in found:
        if joined and s["start"] < joined[-1]["end"]:
            joined[-1]["end"] = max(joined[-1]["end"], s["end"])
        else:
            joined.append(dict(s))
    return joined


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
