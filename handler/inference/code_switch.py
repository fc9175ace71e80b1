"""A recording in several languages: the language decided per part (``"language": "multi"``).

Whisper decodes a window in one language, and a file's language is detected once: a
conversation of English, French and Russian turns came back with the Russian turns
translated into French and 12 s of speech without any segment. With
``language: "multi"`` (Deepgram's name for the same thing) the speech is cut into regions
at the VAD's pauses (``PAUSE_MS``, shorter than a turn-taking gap), each region's language
is detected on its own (one batched encode of the regions, restricted to the allowed
languages), regions too short to tell take their neighbours' language, and consecutive
regions of one language form a *part*. Each part is then transcribed as a job of its own
in its language (the caller's ``transcribe_part``: sequential or through the engine), and
the parts' segments are put back on the file's time line, each carrying its ``language``.

Costs one more encoder pass per speech region (up to 30 s each); measured in
bench/README.md (Code-switching). The first part's language decides nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from faster_whisper.audio import pad_or_trim
from faster_whisper.vad import get_speech_timestamps

from handler.contract import Segment
from handler.inference.fw_batch import SAMPLE_RATE
from handler.inference.options import vad_options

MULTI = "multi"
"""The job's ``language`` that asks for a language per part."""
PAUSE_MS = 200
"""A pause this long ends a region (turns in a conversation are 0.25-1 s apart)."""
MAX_REGION_S = 30
SURE_S = 2.0
"""A region shorter than this, detected with probability under SURE_PROBABILITY, takes the
language of its longer neighbour: a second of speech is too little to tell a language."""
SURE_PROBABILITY = 0.5
MIN_SPLIT_S = 0.3
"""A speaker turn's edge cuts a region only if both sides keep this much."""
BATCH = 8
"""Regions encoded at once for detection."""
EDGE_S = 0.2
"""Silence kept around a part (of what the file has), so its first word is not clipped."""


@dataclass
class Region:
    start: int
    end: int
    language: str = ""
    probability: float = 0.0

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


@dataclass
class Part:
    """Consecutive regions of one language: [start, end) in samples."""

    start: int
    end: int
    language: str
    probability: float
    speech_s: float


def regions(audio: np.ndarray, kwargs: dict[str, Any]) -> list[Region]:
    """Speech regions: the job's VAD with pauses of PAUSE_MS ending a region."""
    options = vad_options(
        kwargs, min_silence_duration_ms=PAUSE_MS, max_speech_duration_s=MAX_REGION_S
    )
    return [Region(s["start"], s["end"]) for s in get_speech_timestamps(audio, options)]


def split_at(found: list[Region], breaks: list[float]) -> list[Region]:
    """Regions cut at each break that leaves MIN_SPLIT_S of speech on both sides."""
    edge = int(MIN_SPLIT_S * SAMPLE_RATE)
    cuts = sorted(int(b * SAMPLE_RATE) for b in breaks)
    out: list[Region] = []
    for r in found:
        start = r.start
        for c in cuts:
            if start + edge <= c <= r.end - edge:
                out.append(Region(start, c))
                start = c
        out.append(Region(start, r.end))
    return out


def detect(
    instance: Any, audio: np.ndarray, found: list[Region], allowed: list[str] | None
) -> None:
    """Each region's language (among ``allowed`` when given) and its probability, in place."""
    for i in range(0, len(found), BATCH):
        batch = found[i : i + BATCH]
        features = np.stack(
            [
                pad_or_trim(instance.feature_extractor(audio[r.start : r.end])[..., :-1])
                for r in batch
            ]
        )
        encoded = instance.encode(features)
        for region, ranked in zip(batch, instance.model.detect_language(encoded), strict=True):
            pairs = [(token[2:-2], float(p)) for token, p in ranked]
            if allowed:
                pairs = [(lang, p) for lang, p in pairs if lang in allowed] or [(allowed[0], 0.0)]
            region.language, region.probability = pairs[0]


def smooth(found: list[Region]) -> None:
    """Short, unsure regions take the language of their longer neighbour, in place."""
    sure = [r.seconds >= SURE_S or r.probability >= SURE_PROBABILITY for r in found]
    if not any(sure):
        # Nothing long or sure: the language with the most speech for all.
        votes: dict[str, float] = {}
        for r in found:
            votes[r.language] = votes.get(r.language, 0.0) + r.seconds * max(r.probability, 0.01)
        best = max(votes, key=lambda k: votes[k])
        for r in found:
            r.language = best
        return
    for i, r in enumerate(found):
        if sure[i]:
            continue
        before = next((found[j] for j in range(i - 1, -1, -1) if sure[j]), None)
        after = next((found[j] for j in range(i + 1, len(found)) if sure[j]), None)
        near = [n for n in (before, after) if n is not None]
        nearest = min(near, key=lambda n: min(abs(n.end - r.start), abs(r.end - n.start)))
        r.language = nearest.language


def parts(found: list[Region], total: int) -> list[Part]:
    """Consecutive regions of one language joined; a part reaches to the middle of the
    silence on each side (within EDGE_S of its speech), so no speech falls between parts."""
    joined: list[Part] = []
    for r in found:
        if joined and joined[-1].language == r.language:
            last = joined[-1]
            weight = last.speech_s + r.seconds
            last.probability = (last.probability * last.speech_s + r.probability * r.seconds) / (
                weight or 1.0
            )
            last.end, last.speech_s = r.end, weight
        else:
            joined.append(Part(r.start, r.end, r.language, r.probability, r.seconds))
    edge = int(EDGE_S * SAMPLE_RATE)
    for n, p in enumerate(joined):
        low = joined[n - 1].end if n else 0
        high = joined[n + 1].start if n + 1 < len(joined) else total
        p.start = max(low + (p.start - low) // 2, p.start - edge, 0)
        p.end = min(high - (high - p.end) // 2, p.end + edge, total)
    return joined


def plan_parts(
    instance: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    allowed: list[str] | None,
    breaks: list[float] | None = None,
) -> tuple[list[Part], list[Region]]:
    """The recording's parts, each with its language, and the speech regions they hold
    (none: no speech). ``breaks`` (seconds: a diarized job's speaker turns) cut regions
    too, so two voices that answer each other without a pause are two regions."""
    found = split_at(regions(audio, kwargs), breaks or [])
    if not found:
        return [], []
    detect(instance, audio, found, allowed)
    smooth(found)
    return parts(found, len(audio)), found


def main_language(plan: list[Part]) -> tuple[str, float]:
    """The language with the most speech, and its parts' mean probability (by speech)."""
    speech: dict[str, float] = {}
    for part in plan:
        speech[part.language] = speech.get(part.language, 0.0) + part.speech_s
    main = max(speech, key=lambda k: speech[k])
    mains = [p for p in plan if p.language == main]
    return main, sum(p.probability * p.speech_s for p in mains) / max(speech[main], 1e-9)


def shift(seg: Segment, offset: float) -> Segment:
    """A part's segment moved onto the file's time line (its words too)."""
    seg["start"] = round(seg["start"] + offset, 3)
    seg["end"] = round(seg["end"] + offset, 3)
    for word in seg.get("words") or []:
        word["start"] = round(word["start"] + offset, 3)
        word["end"] = round(word["end"] + offset, 3)
    return seg
