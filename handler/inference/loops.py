"""Repetition loops: the same words over and over where the speaker said them once.

On long recordings with music, noise or silence between the speech, Whisper sometimes
falls into a loop (a phrase repeated dozens or thousands of times) that the temperature
ladder does not catch: each window's compression ratio looks normal when the loop spans
windows, or the ladder's last try loops as well. A loop is found in the words of the
transcript, across segments: a unit of 1 to ``MAX_UNIT`` words said again and again
back to back. ``handler.pipeline.repeats`` decodes that stretch again without the previous
text and, if it still loops, collapses it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from handler.contract import Segment

MAX_UNIT = 8
"""The longest repeated unit looked for, in words."""
MIN_REPEATS = {1: 6}
"""Back-to-back repeats that make a loop: a one-word unit 6 times (people say "no, no,
no" or "very very"), longer units 4 times."""
DEFAULT_REPEATS = 4


@dataclass(frozen=True)
class Loop:
    first: int
    """Index (in the transcript's words) of the unit's first occurrence."""
    unit: int
    """Words in the unit."""
    repeats: int
    """Occurrences back to back, the first included."""

    @property
    def end(self) -> int:
        return self.first + self.unit * self.repeats


def bare(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def find(words: list[str]) -> list[Loop]:
    """Every loop in ``words`` (compared without case and punctuation), in order."""
    keys = [bare(w) for w in words]
    loops: list[Loop] = []
    i = 0
    while i < len(keys):
        found = None
        for n in range(1, MAX_UNIT + 1):
            if i + 2 * n > len(keys) or not any(keys[i : i + n]):
                continue
            k = 1
            while keys[i + k * n : i + (k + 1) * n] == keys[i : i + n]:
                k += 1
            if k >= MIN_REPEATS.get(n, DEFAULT_REPEATS):
                found = Loop(i, n, k)
                break
        if found is None:
            i += 1
        else:
            loops.append(found)
            i = found.end
    return loops


def pieces(seg: Segment) -> list[str]:
    """A segment's words as they are written in it: its timed words when it has them,
    else its text split at spaces (each with its leading space)."""
    if seg.get("words"):
        return [w["word"] for w in seg["words"] or []]
    return [" " + t for t in seg["text"].split()]


def segment_words(segments: list[Segment]) -> tuple[list[str], list[int]]:
    """The transcript's words and, for each, the index of its segment."""
    words: list[str] = []
    owner: list[int] = []
    for n, seg in enumerate(segments):
        for w in pieces(seg):
            words.append(w)
            owner.append(n)
    return words, owner


def collapse(segments: list[Segment], loop: Loop) -> list[Segment]:
    """``segments`` with the loop's repeats after the first removed: a segment left with
    no words goes; one that lost words keeps the rest (text, timed words, its start; its
    end at its last word kept when timed)."""
    drop = set(range(loop.first + loop.unit, loop.end))
    out: list[Segment] = []
    at = 0
    for seg in segments:
        mine = pieces(seg)
        keep = [j for j in range(len(mine)) if at + j not in drop]
        at += len(mine)
        if len(keep) == len(mine):
            out.append(seg)
            continue
        if not keep:
            continue
        new = dict(seg)
        new["text"] = "".join(mine[j] for j in keep)
        if seg.get("words"):
            timed = seg["words"] or []
            new["words"] = [timed[j] for j in keep]
            new["end"] = max(timed[keep[-1]]["end"], seg["start"])
        out.append(new)  # type: ignore[arg-type]
    return out
