"""``redact``: numbers masked in everything a job returns (text, segments, words, subtitles,
streamed segments, live deltas), as Deepgram's ``redact=numbers`` does it: every run of
three or more numerals, each of its digits and number words written as asterisks, the
characters between them kept ("4111 1111 1111 1111" -> "**** **** **** ****", "four one
one" -> "**** *** ***"). A numeral is a digit, or an English number word (``zero`` to
``ninety``, ``hundred``, ``thousand``); a run is numerals with at most two of `` -./,:``
between them.

``pci`` (card numbers, expiry dates, security codes) and ``ssn`` are served by the same
rule, a superset of both: each of them is a run of three numerals or more. A run of digits
(or of two number words or more) that touches the start or the end of a segment is masked
whatever its length: it may go on in the next segment, or (live) in the next decode of the
same turn, and a part of a number sent must never be followed by the rest of it unmasked.
Names, places and other entities need a recognizer this worker does not have: ``pii`` and
``phi`` are refused, never answered unredacted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from handler.contract import Segment

KINDS = ("numbers", "pci", "ssn")
"""What ``redact`` may name (Deepgram's numeric groups); all masked by one rule."""
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand".split()
)
MIN_RUN = 3
"""Numerals in a run that is masked wherever it stands."""
_TOKEN = re.compile(r"\d+|[^\W\d_]+")
_GAP = re.compile(r"[ \-./,:]{0,2}")
_EDGE = re.compile(r"[\s\W_]*")


def _runs(text: str) -> list[tuple[int, int, int, bool]]:
    """(start, end, numerals, has digits) of each run of numerals in ``text``."""
    runs: list[tuple[int, int, int, bool]] = []
    joined_to: int | None = None  # where the run before ends, while a numeral may join it
    for m in _TOKEN.finditer(text):
        token = m.group()
        digits = token.isdigit()
        if not digits and token.lower() not in NUMBER_WORDS:
            joined_to = None
            continue
        count = len(token) if digits else 1
        if joined_to is not None and _GAP.fullmatch(text, joined_to, m.start()):
            start, _, before, had = runs.pop()
            runs.append((start, m.end(), before + count, had or digits))
        else:
            runs.append((m.start(), m.end(), count, digits))
        joined_to = m.end()
    return runs


def spans(text: str, edges: bool = True) -> list[tuple[int, int]]:
    """[start, end) of each run of ``text`` to mask: three numerals or more, or (``edges``)
    a run at the start or the end of the text that has a digit or two number words (a
    lone "one" there is a word more often than a digit: "One of them")."""
    out = []
    for start, end, count, digits in _runs(text):
        at_edge = _EDGE.fullmatch(text, 0, start) or _EDGE.fullmatch(text, end)
        if count >= MIN_RUN or (edges and (digits or count > 1) and at_edge):
            out.append((start, end))
    return out


def mask(text: str, where: Iterable[tuple[int, int]], char: str = "*") -> str:
    """Each letter and digit of the spans as ``char``; the rest as it was."""
    chars = list(text)
    for start, end in where:
        for i in range(start, end):
            if chars[i].isalnum():
                chars[i] = char
    return "".join(chars)


def text(said: str, char: str = "*", edges: bool = False) -> str:
    """``said`` with its runs of numerals masked (not those at its ends alone, unless
    ``edges``: a warning's or a channel's text is whole)."""
    return mask(said, spans(said, edges), char)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def quoted(said: str) -> str:
    """A warning with what it quotes of the transcript masked (its runs of digits, whatever
    their length: a quote may cut a number), its own times and counts left as they are:
    "repetition loop at 125.3-140.0 s ('4111 1' x40)" -> "... ('**** *' x40)"."""
    return _QUOTED.sub(
        lambda m: m.group()[0] + text(m.group()[1:-1], edges=True) + m.group()[0], said
    )


def segment(seg: Segment, char: str = "*") -> Segment:
    """The segment with its text and words masked (a copy, when anything was); a masked
    segment's ``tokens`` are emptied: they spell the numbers."""
    said = seg["text"]
    found = spans(said)
    words = seg.get("words")
    joined = "".join(w["word"] for w in words) if words else ""
    in_words = (found if joined == said else spans(joined)) if words else []
    if not found and not in_words:
        return seg
    out: Segment = {**seg, "text": mask(said, found, char), "tokens": []}
    if words:
        masked, pos, new = mask(joined, in_words, char), 0, list[Any]()
        for w in words:
            new.append({**w, "word": masked[pos : pos + len(w["word"])]})
            pos += len(w["word"])
        out["words"] = new
    return out
