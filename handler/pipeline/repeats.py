"""Repetition loops after decoding (handler.inference.loops): each stretch that loops is
decoded again without the previous text; if it still loops, or the job's re-decoding
allowance is spent, the repeats are collapsed to one; ``warnings`` says where, either way."""

from __future__ import annotations

import logging
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
    # Last to first: mending a stretch moves no word before it.
    for n, loop in enumerate(reversed(found)):
        span = _span(tr.segments, loop)
        unit = "".join(loops.segment_words(tr.segments)[0][loop.first : loop.first + loop.unit])
        seconds = span[3] - span[2]
        where = f"{span[2]:.1f}-{span[3]:.1f} s ('{unit.strip()[:60]}' x{loop.repeats})"
        if n < MAX_LOOPS and seconds <= allowance:
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
    log.info("job %s: %d repetition loop(s) mended", call.job_id, len(found))


def _span(segments: list[Segment], loop: loops.Loop) -> tuple[int, int, float, float]:
    """The loop's first and last segment and their times."""
    _, owner = loops.segment_words(segments)
    first, last = owner[loop.first], owner[loop.end - 1]
    return first, last, segments[first]["start"], segments[last]["end"]


Pieces = list[tuple[float, float, float]]
"""(start in the re-decoded clip, seconds, start in the recording) of each piece of it."""


def stretch(
    samples: np.ndarray, tr: transcribe.Transcript, start: float, end: float
) -> tuple[np.ndarray, Pieces]:
    """The recording's audio from ``start`` to ``end`` s (a little more each side), as one
    clip, and where its pieces lie in the recording. Samples whose speech was gathered in
    place (``tr.gathered``) hold the VAD's spans back to back: the stretch is then the
    parts of those spans inside it, joined, as the model first heard them."""
    if not tr.gathered or tr.speech is None:
        a = max(0, int((start - PAD_S) * SAMPLE_RATE))
        b = min(len(samples), int((end + PAD_S) * SAMPLE_RATE))
        return samples[a:b].copy(), [(0.0, (b - a) / SAMPLE_RATE, a / SAMPLE_RATE)]
    lo_t, hi_t = int((start - PAD_S) * SAMPLE_RATE), int((end + PAD_S) * SAMPLE_RATE)
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
    first, _, start, end = span
    clip, pieces = stretch(samples, tr, start, end)
    if len(clip) < SAMPLE_RATE // 10:
        return tr.segments[span[0] : span[1] + 1]  # nothing to hear again: still a loop
    kwargs: dict[str, Any] = {k: v for k, v in plan.kwargs.items() if k not in DROPPED}
    kwargs["condition_on_previous_text"] = False
    if tr.gathered:
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
