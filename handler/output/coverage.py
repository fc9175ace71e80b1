"""Speech that no segment covers, said in a warning (no speech silently dropped).

Whisper can skip speech: a turn in another language than the one it decodes in, a window
it judged silent. The VAD's speech spans (the ones the transcription itself used) are
compared with the segments' times; stretches of speech outside every segment (each segment
widened by ``PAD_S``, the slack of Whisper's timestamps), grouped when less than
``JOIN_S`` apart, are reported when they hold ``MIN_UNCOVERED_S`` of speech or more.
Measured in bench/README.md (Code-switching): how often it fires on the single-language
accuracy corpus, and on code-switched conversations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from handler.contract import Segment

PAD_S = 0.5
JOIN_S = 2.0
MIN_UNCOVERED_S = 3.0
MAX_LISTED = 5


def uncovered(
    speech: Sequence[tuple[float, float]], segments: Iterable[Segment]
) -> list[tuple[float, float, float]]:
    """(start, end, seconds of speech) of each uncovered stretch worth a warning."""
    covered = sorted((float(s["start"]) - PAD_S, float(s["end"]) + PAD_S) for s in segments)
    pieces: list[tuple[float, float]] = []
    for start, end in sorted(speech):
        at = start
        for c0, c1 in covered:
            if c1 <= at or c0 >= end:
                continue
            if c0 > at:
                pieces.append((at, c0))
            at = max(at, c1)
            if at >= end:
                break
        if at < end:
            pieces.append((at, end))
    groups: list[list[float]] = []
    for s, e in pieces:
        if groups and s - groups[-1][1] < JOIN_S:
            groups[-1][1] = e
            groups[-1][2] += e - s
        else:
            groups.append([s, e, e - s])
    return [(s, e, n) for s, e, n in groups if n >= MIN_UNCOVERED_S]


def warning(
    speech: Sequence[tuple[float, float]], segments: Iterable[Segment], multi: bool
) -> str | None:
    """One sentence naming where speech has no transcript, or None."""
    found = uncovered(speech, segments)
    if not found:
        return None
    total = sum(n for _, _, n in found)
    where = ", ".join(f"{s:.1f}-{e:.1f} s" for s, e, _ in found[:MAX_LISTED])
    if len(found) > MAX_LISTED:
        where += f" and {len(found) - MAX_LISTED} more"
    hint = (
        ""
        if multi
        else (
            '; if the language changes in the recording, "language": "multi" decodes each part '
            "in its own language"
        )
    )
    return f"{total:.1f} s of speech (by the VAD) got no segment: {where}{hint}"
