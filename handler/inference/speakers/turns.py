"""Speaker turns: who spoke from when to when, built from labelled windows, their changes
of speaker moved to the pauses people take turns at; the labels a diarized job returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from handler.contract import SAMPLE_RATE

SNAP_S = 0.15
"""A change of speaker inside speech moves to the quietest 20 ms within this much of it,
when that is a pause (below PAUSE_RATIO of the two turns' median energy): people take
turns at pauses, and a window's embedding places the change only to about +-0.3 s.
Measured: the pyannote sample 0.946 -> 0.964, the built conversations unchanged
(bench/README.md, Diarization)."""


PAUSE_RATIO = 0.1


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: str


@dataclass
class Diarization:
    turns: list[Turn]
    speakers: list[str]
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    snr_db: float | None = None
    """Speech over the recording's noise floor (speech_to_floor_db)."""
    centroids: dict[str, list[float]] = field(default_factory=dict)
    """Each speaker's voice: the unit mean of its windows' embeddings (what
    ``speaker_embeddings`` returns)."""
    warnings: list[str] = field(default_factory=list)
    """What the job's ``warnings`` should say (a count the voices do not support)."""


def to_turns(
    spans: list[tuple[int, int]],
    regions: list[tuple[int, int]],
    labels: np.ndarray,
    names: list[str],
) -> list[Turn]:
    """Each window speaks for the part of its region nearest its centre; neighbouring
    windows split their overlap at the midpoint of their centres."""
    centres = np.array([(s + e) / 2 for s, e in spans])
    turns: list[Turn] = []
    for r_start, r_end in regions:
        inside = np.nonzero((centres >= r_start) & (centres <= r_end))[0]
        if len(inside) == 0:
            continue
        pairs = zip(inside[:-1], inside[1:], strict=True)
        cuts = [r_start] + [int((centres[a] + centres[b]) / 2) for a, b in pairs] + [r_end]
        for k, idx in enumerate(inside):
            turn = Turn(cuts[k] / SAMPLE_RATE, cuts[k + 1] / SAMPLE_RATE, names[labels[idx]])
            if turns and turns[-1].speaker == turn.speaker and turn.start - turns[-1].end < 0.5:
                turns[-1] = Turn(turns[-1].start, turn.end, turn.speaker)
            elif turn.end > turn.start:
                turns.append(turn)
    return turns


def snap_changes(
    turns: list[Turn], samples: np.ndarray, energy: np.ndarray | None = None
) -> list[Turn]:
    """Each change of speaker between two adjacent turns moved to the pause nearest it
    (see SNAP_S); a change with no pause near it stays where the windows put it."""
    if len(turns) < 2:
        return turns
    if energy is None:
        energy = frame_energy(samples)
    n = len(energy)
    out = list(turns)
    for i in range(len(out) - 1):
        a, b = out[i], out[i + 1]
        if a.speaker == b.speaker or abs(a.end - b.start) > 1e-6:
            continue
        f0 = int(max(a.start + 0.1, a.end - SNAP_S) * 100)
        f1 = min(n, int(min(b.end - 0.1, b.start + SNAP_S) * 100))
        if f1 <= f0:
            continue
        quiet = f0 + int(np.argmin(energy[f0:f1]))
        around = np.median(energy[int(a.start * 100) : min(n, int(b.end * 100))])
        if energy[quiet] > PAUSE_RATIO * around:
            continue
        out[i] = Turn(a.start, quiet / 100, a.speaker)
        out[i + 1] = Turn(quiet / 100, b.end, b.speaker)
    return out


def frame_energy(samples: np.ndarray, block_s: float = 60.0) -> np.ndarray:
    """Mean square of every 10 ms, averaged over two (20 ms); computed a minute at a time
    (a float64 copy of a whole 1-hour recording would be 440 MB)."""
    hop = SAMPLE_RATE // 100
    n = len(samples) // hop
    per_block = int(block_s * 100)
    energy = np.empty(n, dtype=np.float64)
    for i in range(0, n, per_block):
        j = min(n, i + per_block)
        block = samples[i * hop : j * hop].reshape(j - i, hop).astype(np.float64)
        energy[i:j] = (block * block).mean(axis=1)
    return np.convolve(energy, np.ones(2) / 2, mode="same")


def speech_to_floor_db(energy: np.ndarray, regions: list[tuple[int, int]]) -> float:
    """How far the speech stands above the recording's noise floor, in dB: the median
    energy of the speech's 20-ms frames over the 10th percentile of all frames'. Studio
    speech with digital silence between turns: ~90 dB; the pyannote telephone call: 35;
    pink noise 15 dB under the speech: 10-12; white noise 25 dB under: 19-22."""
    hop = SAMPLE_RATE // 100
    inside = np.zeros(len(energy), dtype=bool)
    for start, end in regions:
        inside[start // hop : end // hop] = True
    if not inside.any():
        return 0.0
    floor = max(float(np.percentile(energy, 10)), 1e-12)
    return float(10 * np.log10(max(float(np.median(energy[inside])), 1e-12) / floor))


def letter(i: int) -> str:
    """A, B, ..., Z, AA, AB, ...: OpenAI's labels for unnamed speakers."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(65 + r) + name
    return name
