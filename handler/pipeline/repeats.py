"""Repetition loops after decoding (handler.inference.loops): each stretch that loops is
first heard one occurrence at a time, each alone: when the speech says the unit each time
(a speaker who really repeats a phrase), the words stay. Otherwise the stretch is decoded
again without the previous text; if it still loops, or the job's allowance is spent, the
repeats are collapsed to one. ``warnings`` says where a loop was mended, either way."""

from __future__ import annotations

import logging
from collections.abc import Callable
from difflib import SequenceMatcher
from typing import Any

import numpy as np

from handler.contract import SAMPLE_RATE, Segment
from handler.inference import code_switch, loops, transcribe
from handler.pipeline.runtime import Call, Plan, Runtime, compute_budget

log = logging.getLogger(__name__)

MAX_LOOPS = 50
"""Loops handled per job; any beyond are collapsed without a second decode."""
PAD_S = 0.1
"""Audio kept on each side of a re-decoded stretch."""
CHECKS = 4
"""Occurrences of a loop heard again, each alone, before anything is mended."""
HEARD_PAD_S = 0.2
"""Audio kept on each side of one occurrence (Whisper's word times are this loose)."""
SAME = 0.6
"""How alike (difflib's ratio over words) one occurrence heard alone and the unit must be."""
# A re-decode starts afresh: no conditioning on earlier text, no prompt or prefix that
# may have started the loop, no clip list meant for the whole recording.
DROPPED = ("initial_prompt", "prefix", "clip_timestamps", "max_initial_timestamp")


def fix(
    plan: Plan, tr: transcribe.Transcript, samples: np.ndarray, worker: Runtime, call: Call
) -> None:
    """Find the loops in ``tr`` and mend them in place."""
    settings = worker.settings
    on = plan.job.loop_guard if plan.job.loop_guard is not None else settings.loop_guard
    if not on or not tr.segments:
        return
    words, _ = loops.segment_words(tr.segments)
    found = loops.find(words)
    if not found:
        return
    allowance = settings.loop_redecode_s
    kept = 0
    # Last to first: mending a stretch moves no word before it.
    for n, loop in enumerate(reversed(found)):
        span = _span(tr.segments, loop)
        # The unit as found: mending the loops after this one leaves the words before them.
        unit = "".join(words[loop.first : loop.first + loop.unit])
        seconds = span[3] - span[2]
        where = f"{span[2]:.1f}-{span[3]:.1f} s ('{unit.strip()[:60]}' x{loop.repeats})"
        if n < MAX_LOOPS:
            # The speaker may really have said it again and again: each occurrence alone.
            said, spent = _said_so(plan, tr, samples, worker, call, loop, allowance, span[0])
            allowance -= spent
            if said:
                kept += 1
                continue
            if seconds <= allowance:
                allowance -= seconds
                again = _decode_again(plan, tr, samples, worker, call, span)
                if not loops.find(loops.segment_words(again)[0]):
                    tr.segments[span[0] : span[1] + 1] = again
                    call.warnings.append(
                        f"repetition loop at {where}: decoded again without the previous text"
                    )
                    continue
        tr.segments[:] = loops.collapse(tr.segments, loop)
        call.warnings.append(f"repetition loop at {where}: collapsed to one")
    for i, seg in enumerate(tr.segments):
        seg["id"] = i + 1
    log.info(
        "job %s: %d repetition loop(s) mended, %d repetition(s) kept as said",
        call.job_id,
        len(found) - kept,
        kept,
    )


def _span(segments: list[Segment], loop: loops.Loop) -> tuple[int, int, float, float]:
    """The loop's first and last segment and their times."""
    _, owner = loops.segment_words(segments)
    first, last = owner[loop.first], owner[loop.end - 1]
    return first, last, segments[first]["start"], segments[last]["end"]


Pieces = list[tuple[float, float, float]]
"""(start in the re-decoded clip, seconds, start in the recording) of each piece of it."""


def stretch(
    samples: np.ndarray, tr: transcribe.Transcript, start: float, end: float, pad: float = PAD_S
) -> tuple[np.ndarray, Pieces]:
    """The recording's audio from ``start`` to ``end`` s (``pad`` more each side), as one
    clip, and where its pieces lie in the recording. Samples whose speech was gathered in
    place (``tr.gathered``) hold the VAD's spans back to back: the stretch is then the
    parts of those spans inside it, joined, as the model first heard them."""
    if not tr.gathered or tr.speech is None:
        a = max(0, int((start - pad) * SAMPLE_RATE))
        b = min(len(samples), int((end + pad) * SAMPLE_RATE))
        return samples[a:b].copy(), [(0.0, (b - a) / SAMPLE_RATE, a / SAMPLE_RATE)]
    lo_t, hi_t = int((start - pad) * SAMPLE_RATE), int((end + pad) * SAMPLE_RATE)
    parts: list[np.ndarray] = []
    pieces: Pieces = []
    at = clip = 0
    for s_t, e_t in tr.speech:
        s, e = round(s_t * SAMPLE_RATE), round(e_t * SAMPLE_RATE)
        lo, hi = max(s, lo_t), min(e, hi_t)
        if hi > lo:
            parts.append(samples[at + lo - s : at + hi - s].copy())
            pieces.append((clip / SAMPLE_RATE, (hi - lo) / SAMPLE_RATE, lo / SAMPLE_RATE))
            clip += hi - lo
        at += e - s
    if not parts:
        return np.zeros(0, np.float32), []
    return np.concatenate(parts), pieces


def in_recording(t: float, pieces: Pieces) -> float:
    """A time of the re-decoded clip as a time of the recording."""
    for begin, seconds, origin in reversed(pieces):
        if t >= begin:
            return round(origin + min(t - begin, seconds), 3)
    return round(pieces[0][2], 3)


def _decode_again(
    plan: Plan,
    tr: transcribe.Transcript,
    samples: np.ndarray,
    worker: Runtime,
    call: Call,
    span: tuple[int, int, float, float],
) -> list[Segment]:
    """The loop's segments decoded again afresh."""
    first, _, start, end = span
    again = _decode(plan, tr, samples, worker, call, (start - PAD_S, end + PAD_S), first, False)
    return again if again is not None else tr.segments[span[0] : span[1] + 1]


def _said_so(
    plan: Plan,
    tr: transcribe.Transcript,
    samples: np.ndarray,
    worker: Runtime,
    call: Call,
    loop: loops.Loop,
    allowance: float,
    first: int,
) -> tuple[bool, float]:
    """Whether the speech says the loop's unit in (up to ``CHECKS``) of its occurrences,
    each decoded alone with the VAD on, and the seconds this heard (``first``: the loop's
    first segment, for its language). One occurrence of three or more may be misheard
    (a short clip cut from running speech); the hearing stops at a second. A loop made up
    over music, noise, silence or other words is not heard there; a phrase the speaker
    really repeats is. More seconds than ``allowance``, or ``CHECKS`` 0: not heard at all
    (False)."""
    windows = occurrences(tr.segments, loop, lambda t, r: quiet(samples, tr, t, r))
    if not windows or sum(b - a for a, b in windows) > allowance:
        return False, 0.0
    words = loops.segment_words(tr.segments)[0]
    unit = [k for k in map(loops.bare, words[loop.first : loop.first + loop.unit]) if k]
    heard, misses = 0.0, 0
    for window in windows:
        alone = _decode(plan, tr, samples, worker, call, window, first, True)
        heard += window[1] - window[0]
        got = [k for k in map(loops.bare, loops.segment_words(alone or [])[0]) if k]
        misses += not said_in(unit, got)
        if misses > (1 if len(windows) >= 3 else 0):
            return False, heard
    return True, heard


def word_times(segments: list[Segment]) -> list[tuple[float, float]]:
    """Each word's (start, end) in ``loops.segment_words`` order: its own times when the
    segment is timed, else its share of the segment's time by characters."""
    out: list[tuple[float, float]] = []
    for seg in segments:
        if seg.get("words"):
            out += [(w["start"], w["end"]) for w in seg["words"] or []]
            continue
        pieces = loops.pieces(seg)
        total = sum(len(p) for p in pieces) or 1
        step = (seg["end"] - seg["start"]) / total
        at = seg["start"]
        for p in pieces:
            out.append((at, at + len(p) * step))
            at += len(p) * step
    return out


def occurrences(
    segments: list[Segment], loop: loops.Loop, snap: Callable[[float, float], float]
) -> list[tuple[float, float]]:
    """Where to hear (up to ``CHECKS`` of) the loop's occurrences, first and last among
    them: the loop's time (``word_times``) cut into one slot per occurrence, each window a
    slot and half a slot each side, so that loose word times and a speaker's uneven pace
    still leave a whole occurrence inside; each edge moved by ``snap(time, radius)`` to
    where no word is cut (``quiet``)."""
    times = word_times(segments)
    start, end = times[loop.first][0], times[loop.end - 1][1]
    slot = max(end - start, 0.0) / loop.repeats
    count = min(CHECKS, loop.repeats)
    picks = sorted({round(i * (loop.repeats - 1) / max(count - 1, 1)) for i in range(count)})
    edges = [(max(0.0, start + (k - 0.5) * slot), start + (k + 1.5) * slot) for k in picks]
    return [(snap(a, slot / 4), snap(b, slot / 4)) for a, b in edges]


def quiet(samples: np.ndarray, tr: transcribe.Transcript, t: float, radius: float) -> float:
    """The quietest moment of the recording (20-ms frames) within ``radius`` s of ``t``."""
    clip, pieces = stretch(samples, tr, t - radius, t + radius, pad=0.0)
    frame = SAMPLE_RATE // 50
    if len(clip) < frame:
        return t
    frames = clip[: len(clip) // frame * frame].reshape(-1, frame)
    loudest = np.square(frames, dtype=np.float64).mean(axis=1)
    return max(0.0, in_recording((int(np.argmin(loudest)) + 0.5) / 50, pieces))


def said_in(unit: list[str], heard: list[str]) -> bool:
    """Whether ``heard`` holds ``unit`` (bare words), near enough (``SAME``) somewhere."""
    n = len(unit)
    return any(
        SequenceMatcher(None, unit, heard[i : i + n], autojunk=False).ratio() >= SAME
        for i in range(max(1, len(heard) - n + 1))
    )


def _decode(
    plan: Plan,
    tr: transcribe.Transcript,
    samples: np.ndarray,
    worker: Runtime,
    call: Call,
    window: tuple[float, float],
    first: int,
    alone: bool,
) -> list[Segment] | None:
    """The recording from ``window[0]`` to ``window[1]`` s decoded afresh (in the
    language of segment ``first``), on the recording's time line; None when there is
    nothing to hear. ``alone``: one occurrence, untimed, whose speech the VAD must find
    again; else a loop's stretch, as the model first heard it."""
    clip, pieces = stretch(samples, tr, window[0], window[1], pad=0.0)
    if len(clip) < SAMPLE_RATE // 10:
        return None
    kwargs: dict[str, Any] = {k: v for k, v in plan.kwargs.items() if k not in DROPPED}
    kwargs["condition_on_previous_text"] = False
    if alone:
        kwargs["word_timestamps"] = False
        kwargs["vad_filter"] = True
    elif tr.gathered:
        kwargs["vad_filter"] = False  # the clip is the VAD's speech already
        kwargs.pop("vad_parameters", None)
    lang = tr.segments[first].get("language") or tr.language
    if lang and lang != code_switch.MULTI:
        kwargs["language"] = lang
    budget = compute_budget(worker.settings, len(clip) / SAMPLE_RATE)
    with worker.pool.acquire(plan.model, call.cancel) as (instance, _):
        again = transcribe.run(instance, clip, kwargs, cancel=call.cancel, budget_s=budget)
    for seg in again.segments:
        seg["start"] = in_recording(seg["start"], pieces)
        seg["end"] = in_recording(seg["end"], pieces)
        for w in seg.get("words") or []:
            w["start"] = in_recording(w["start"], pieces)
            w["end"] = in_recording(w["end"], pieces)
        if "language" in tr.segments[first]:
            seg["language"] = tr.segments[first]["language"]
    return again.segments
