"""Speaker turns joined to the transcript: words labelled, segments split where the speaker
changes, the per-speaker summary, OpenAI's ``diarized_json`` and NIST's RTTM.

Pure functions over plain dicts and ``(start, end, speaker)`` turns: nothing here knows how
the turns were found (handler.inference.speakers), so every rule is testable without a
model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from handler.contract import Segment, Word


class TurnLike(Protocol):
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def speaker(self) -> str: ...


def speaker_at(turns: Sequence[TurnLike], start: float, end: float) -> str | None:
    """The speaker whose turns overlap [start, end] the most; the nearest turn when none
    overlaps (a word in a pause the voice detector cut); None without turns."""
    if not turns:
        return None
    overlap: dict[str, float] = {}
    for t in turns:
        o = min(end, t.end) - max(start, t.start)
        if o > 0:
            overlap[t.speaker] = overlap.get(t.speaker, 0.0) + o
    if overlap:
        return max(overlap.items(), key=lambda kv: kv[1])[0]
    mid = (start + end) / 2
    nearest = min(turns, key=lambda t: min(abs(mid - t.start), abs(mid - t.end)))
    return nearest.speaker


def attribute(segments: Sequence[Segment], turns: Sequence[TurnLike]) -> list[Segment]:
    """Segments with ``speaker``, split at word boundaries where the speaker changes;
    each word gets ``speaker`` too. Segments are renumbered from 0."""
    out: list[Segment] = []
    for seg in segments:
        words = list(seg.get("words") or [])
        if not words:
            piece = dict(seg)
            piece["speaker"] = speaker_at(turns, seg["start"], seg["end"]) or ""
            out.append(piece)  # type: ignore[arg-type]
            continue
        labelled = [
            _labelled(w, s) for w, s in zip(words, _word_speakers(words, turns), strict=True)
        ]
        runs: list[list[Word]] = []
        for w in labelled:
            if runs and runs[-1][-1]["speaker"] == w["speaker"]:
                runs[-1].append(w)
            else:
                runs.append([w])
        for run in runs:
            out.append(piece_of(seg, run, whole=len(runs) == 1))
    for i, seg in enumerate(out):
        seg["id"] = i
    return out


WORD_REACH_S = 0.1
"""A word is looked up over its span widened by this much each side (Whisper's word
times are approximate, and some words come with no duration at all)."""
LONE_WORD_S = 0.6


def _word_speakers(words: Sequence[Word], turns: Sequence[TurnLike]) -> list[str]:
    """A speaker per word; one short word between two words of another speaker takes
    theirs (turn boundaries are ~0.75 s coarse, a one-word reply is rarely that short)."""
    labels = [
        speaker_at(turns, w["start"] - WORD_REACH_S, w["end"] + WORD_REACH_S) or "" for w in words
    ]
    for i in range(1, len(labels) - 1):
        w = words[i]
        if labels[i - 1] == labels[i + 1] != labels[i] and w["end"] - w["start"] < LONE_WORD_S:
            labels[i] = labels[i - 1]
    return labels


def _labelled(word: Word, speaker: str) -> Word:
    w = dict(word)
    w["speaker"] = speaker
    return w  # type: ignore[return-value]


def piece_of(seg: Segment, run: list[Word], *, whole: bool) -> Segment:
    """The part of ``seg`` that ``run`` (a run of its words) says, with the run's speaker
    when its words have one (also a multichannel job's cut at the other side's turns)."""
    piece = dict(seg)
    piece["words"] = run
    if "speaker" in run[0]:
        piece["speaker"] = run[0]["speaker"]
    if not whole:
        # The decoder's tokens and scores belong to the whole segment; a piece keeps its
        # scores (they describe the decoding it came from) and no tokens.
        piece["start"] = run[0]["start"]
        piece["end"] = run[-1]["end"]
        piece["text"] = "".join(str(w["word"]) for w in run)
        piece["tokens"] = []
    return piece  # type: ignore[return-value]


def summary(turns: Sequence[TurnLike]) -> list[dict[str, Any]]:
    """[{speaker, seconds}] in order of first appearance."""
    seconds: dict[str, float] = {}
    for t in turns:
        seconds[t.speaker] = seconds.get(t.speaker, 0.0) + max(0.0, t.end - t.start)
    return [{"speaker": s, "seconds": round(v, 3)} for s, v in seconds.items()]


def diarized_json(segments: Sequence[Segment], *, duration: float, text: str) -> dict[str, Any]:
    """OpenAI's ``TranscriptionDiarized`` (``response_format=diarized_json``)."""
    return {
        "task": "transcribe",
        "duration": round(duration, 3),
        "text": text,
        "segments": [diarized_segment(s) for s in segments if str(s["text"]).strip()],
    }


def diarized_segment(seg: Segment) -> dict[str, Any]:
    out = {
        "type": "transcript.text.segment",
        "id": f"seg_{seg['id']}",
        "start": round(float(seg["start"]), 3),
        "end": round(float(seg["end"]), 3),
        "text": str(seg["text"]).strip(),
        "speaker": str(seg.get("speaker") or ""),
    }
    if "language" in seg:
        out["language"] = str(seg["language"])
    return out


def to_rttm(turns: Sequence[TurnLike], file_id: str = "audio") -> str:
    """NIST RTTM, one SPEAKER line per turn (names' spaces become underscores)."""
    lines = []
    for t in turns:
        name = "_".join(t.speaker.split()) or "unknown"
        lines.append(
            f"SPEAKER {file_id} 1 {t.start:.3f} {max(0.0, t.end - t.start):.3f} "
            f"<NA> <NA> {name} <NA> <NA>"
        )
    return "\n".join(lines) + ("\n" if lines else "")
