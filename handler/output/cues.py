"""Subtitle cues built from word timestamps, not from whatever span the decoder emitted.

A decoder segment can be a whole 30-s window (batched decoding) or a 2-line sentence; a
viewer wants cues of at most ``max_line_width`` characters per line, ``max_line_count``
lines and ``max_cue_seconds`` on screen (the openai-whisper CLI's names, with its 42
characters and the common broadcast limits of 2 lines and about 7 s). Cues break first at
sentence ends, then at long pauses, then at commas when a line fills, and only then
between any two words. Pure functions: the same words give the same cues whether the job
ran batched or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SENTENCE_END = (".", "?", "!", "。", "？", "！", "…")
CLAUSE_END = (",", ";", ":", "，", "、")
ABBREVIATIONS = frozenset(
    {
        "mr.",
        "mrs.",
        "ms.",
        "dr.",
        "st.",
        "sr.",
        "jr.",
        "vs.",
        "etc.",
        "e.g.",
        "i.e.",
        "no.",
        "sra.",
        "m.",
        "mme.",
        "dott.",
    }
)
"""Words ending in a full stop that do not end a sentence."""
PAUSE_S = 0.6
_JOINERS = "-'’.,!?;:%)]}"
"""A word that starts with one of these, unspaced, continues the previous word. (Words of
languages written without spaces also come unspaced, and stay words of their own.)"""
"""A silence this long between two words ends the cue."""


@dataclass(frozen=True)
class Layout:
    max_line_width: int = 42
    max_line_count: int = 2
    max_cue_seconds: float = 7.0


def label(item: Any) -> str | None:
    """Whom a cue is said by: a segment's or word's speaker, else its channel (a
    ``multichannel`` job: ``channel 0``), else None."""
    if item.get("speaker") is not None:
        return str(item["speaker"])
    if item.get("channel") is not None:
        return f"channel {item['channel']}"
    return None


def _words(segments: Iterable[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for seg in segments:
        for w in seg.get("words") or []:
            raw = str(w["word"])
            if not raw.strip():
                continue
            speaker = label(w)
            if (
                out
                and out[-1]["speaker"] == speaker
                and not raw[:1].isspace()
                and (raw[0] in _JOINERS or out[-1]["raw"].endswith("-"))
            ):
                # Whisper's own spacing: " word" starts a word; "-sposed" or "'s" continues
                # the previous one, and a cue or line never breaks inside a word.
                prev = out[-1]
                prev["raw"] += raw
                prev["text"] = prev["raw"].strip()
                prev["end"] = float(w["end"])
                continue
            out.append(
                {
                    "text": raw.strip(),
                    "raw": raw,
                    "start": float(w["start"]),
                    "end": float(w["end"]),
                    "speaker": speaker,
                }
            )
    return out


def _lines(words: Sequence[dict[str, Any]], width: int) -> list[str]:
    """Greedy lines of at most ``width`` characters (a longer word gets a line alone);
    a line that fills breaks after its last comma when one is in its second half."""

    def joined(parts: list[str]) -> str:
        return "".join(parts).strip()

    lines: list[list[str]] = [[]]
    for w in words:
        line = lines[-1]
        if line and len(joined([*line, w["raw"]])) > width:
            cut = max(
                (i for i, t in enumerate(line[:-1]) if t.strip().endswith(CLAUSE_END)), default=-1
            )
            if cut >= len(line) // 2:
                lines[-1], carry = line[: cut + 1], line[cut + 1 :]
                lines.append(carry)
                if len(joined([*carry, w["raw"]])) <= width:
                    carry.append(w["raw"])
                    continue
            lines.append([])
        lines[-1].append(w["raw"])
    return [joined(line) for line in lines if line]


Cue = tuple[float, float, str, str | None]
"""(start, end, text with line breaks, speaker or None)."""


def word_cues(segments: Iterable[Any], layout: Layout = Layout()) -> list[Cue]:
    """The cues of the segments' words; a cue never holds two speakers' words."""
    words = _words(segments)
    cues: list[Cue] = []
    current: list[dict[str, Any]] = []

    def fits(candidate: list[dict[str, Any]]) -> bool:
        if candidate[-1]["end"] - candidate[0]["start"] > layout.max_cue_seconds:
            return len(candidate) == 1
        return len(_lines(candidate, layout.max_line_width)) <= layout.max_line_count

    def close() -> None:
        if current:
            text = "\n".join(_lines(current, layout.max_line_width))
            end = max(current[-1]["end"], current[0]["start"])
            cues.append((current[0]["start"], end, text, current[0]["speaker"]))
            current.clear()

    for i, w in enumerate(words):
        if current and current[-1]["speaker"] != w["speaker"]:
            close()
        if current and not fits([*current, w]):
            # Prefer to end the cue at its last clause break when it is not too early.
            cut = max(
                (k for k, c in enumerate(current[:-1]) if c["text"].endswith(CLAUSE_END)),
                default=-1,
            )
            if cut >= len(current) // 2 and fits(current[cut + 1 :] + [w]):
                rest = current[cut + 1 :]
                del current[cut + 1 :]
                close()
                current.extend(rest)
            else:
                close()
        current.append(w)
        nxt = words[i + 1] if i + 1 < len(words) else None
        sentence_end = w["text"].endswith(SENTENCE_END) and w["text"].lower() not in ABBREVIATIONS
        if sentence_end or (nxt and nxt["start"] - w["end"] >= PAUSE_S):
            close()
    close()
    return cues
