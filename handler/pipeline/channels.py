"""A ``multichannel`` job: each channel of the recording transcribed on its own, one after
another in the job's slot, and the segments merged in time order with their ``channel``.

A call recorded in stereo (agent left, customer right) needs no diarizer: the channel says
who spoke, and each voice is decoded without the other talking over it. Each channel runs
the single-channel steps (transcription, loop guard, word alignment) through ``one`` on a
child of the job's ``Call``, whose timings and warnings are folded back into the job's. A
channel that carries the same samples as an earlier one (a mono call saved as stereo) is
not transcribed again: ``channels`` says which one it repeats. With ``diarize`` each
channel is diarized on its own (a conference room on one side of a call): its speakers
are joined to its words, the unnamed ones lettered on from the channels before it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from handler.audio.decode import DecodedAudio
from handler.contract import Segment
from handler.inference import transcribe
from handler.output import formats, speakers
from handler.output.speakers import piece_of
from handler.pipeline.runtime import Call, Plan, Runtime

OneChannel = Callable[[Plan, DecodedAudio, Runtime, Call], transcribe.Transcript]
"""The single-channel steps of a job: its samples transcribed, mended and aligned."""


def run(
    plan: Plan, audio: DecodedAudio, worker: Runtime, call: Call, one: OneChannel
) -> transcribe.Transcript:
    """Every channel of ``audio`` through ``one``; the merged transcript, and each channel's
    text and language in ``call.channels``."""
    assert audio.channels is not None
    count = len(audio.channels)
    repeats = _repeats(audio.channels)
    audio.samples = np.empty(0, np.float32)  # the first channel's: held below, then let go
    done: dict[int, transcribe.Transcript] = {}
    heard: list[Any] = []  # each diarized channel's turns, relabelled
    for i in range(count):
        if (first := repeats[i]) is not None:
            call.warnings.append(
                f"channel {i} carries the same audio as channel {first}: transcribed once"
            )
            continue
        samples, audio.channels[i] = audio.channels[i], np.empty(0, np.float32)
        part = DecodedAudio(samples, audio.duration, audio.declared_duration, audio.format_name)
        child = _child(call, i, count, held=sum(c.nbytes for c in audio.channels))
        del samples
        done[i] = one(plan, part, worker, child)
        if child.diarization is not None:
            _attribute(plan, done[i], child, heard)
        _fold(call, child, i)
        _label(done[i].segments, i)
    call.channels = [
        _summary(i, done[i if (j := repeats[i]) is None else j], j) for i in range(count)
    ]
    if heard:
        call.diarization = _together(heard)
    return merge(list(done.values()))


def _attribute(plan: Plan, tr: transcribe.Transcript, child: Call, heard: list[Any]) -> None:
    """A channel's own speakers joined to its words: its unnamed speakers lettered on from
    the channels before it (A and B on the first, C on the second), known names kept."""
    from handler.inference.speakers.turns import letter

    found = child.diarization
    assert found is not None
    named = {k.name for k in plan.job.known_speakers or []}
    lettered = sum(1 for d in heard for s in d.speakers if s not in named)
    names: dict[str, str] = {}
    for s in dict.fromkeys(found.speakers):
        if s in named:
            names[s] = s
        else:
            names[s], lettered = letter(lettered), lettered + 1
    relabelled = dataclasses.replace(
        found,
        turns=[
            dataclasses.replace(t, speaker=names.get(t.speaker, t.speaker)) for t in found.turns
        ],
        speakers=[names[s] for s in found.speakers],
        centroids={names.get(s, s): v for s, v in found.centroids.items()},
    )
    tr.segments = speakers.attribute(tr.segments, relabelled.turns)
    heard.append(relabelled)


def _together(heard: list[Any]) -> Any:
    """The job's diarization: every channel's turns in time order, speakers by channel."""
    first = heard[0]
    turns = sorted((t for d in heard for t in d.turns), key=lambda t: (t.start, t.end))
    found = list(dict.fromkeys(s for d in heard for s in d.speakers))
    centroids = {s: v for d in reversed(heard) for s, v in d.centroids.items()}
    seconds = sum(d.seconds for d in heard)
    return dataclasses.replace(
        first, turns=turns, speakers=found, centroids=centroids, seconds=seconds, warnings=[]
    )


def _repeats(channels: list[np.ndarray]) -> list[int | None]:
    """For each channel, the first earlier channel with the very same samples, else None."""
    found: list[int | None] = []
    for i, samples in enumerate(channels):
        same = (j for j in range(i) if found[j] is None and np.array_equal(channels[j], samples))
        found.append(next(same, None))
    return found


def _child(call: Call, channel: int, count: int, held: int) -> Call:
    """The job's call for one channel: its own timings and warnings; its segments streamed
    with their channel, its progress a share of the job's; ``held``: the bytes of the
    channels still to go, reserved with it."""
    on_segment = on_progress = None
    if (stream := call.on_segment) is not None:

        def on_segment(seg: Segment) -> None:
            stream({**seg, "channel": channel})

    if (report := call.on_progress) is not None:

        def on_progress(percent: float) -> None:
            report(round((100.0 * channel + percent) / count, 1))

    return dataclasses.replace(
        call,
        on_segment=on_segment,
        on_progress=on_progress,
        timings={},
        warnings=[],
        word_alignment=None,
        audio=None,
        samples=None,
        held_bytes=held,
    )


def _fold(call: Call, child: Call, channel: int) -> None:
    """A channel's timings added to the job's; its warnings said with its channel."""
    for key, seconds in child.timings.items():
        call.timings[key] = call.timings.get(key, 0.0) + seconds
    call.warnings += [f"channel {channel}: {w}" for w in child.warnings]
    if child.word_alignment is not None:
        call.word_alignment = {**(call.word_alignment or {}), **child.word_alignment}


def _label(segments: list[Segment], channel: int) -> None:
    for seg in segments:
        seg["channel"] = channel
        for w in seg.get("words") or []:
            w["channel"] = channel


def _summary(channel: int, tr: transcribe.Transcript, same_as: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "channel": channel,
        "text": formats.to_text(tr.segments),
        "language": tr.language or None,
        "language_probability": round(tr.language_probability, 4),
    }
    if same_as is not None:
        out["same_as"] = same_as
    return out


TURN_REACH_S = 0.1
"""A word of another channel that starts this close before the end of a segment's word
(Whisper's word times are approximate) still starts in the pause after it."""
TURN_PAUSE_S = 0.3
"""The least pause between two words of a segment that another channel's turn can cut:
over crosstalk (the other side starting while this one is still speaking, between two of
its words 0.1 s apart) a cut put the end of a sentence after the other side's turn."""


def _turns(parts: list[transcribe.Transcript]) -> list[Segment]:
    """Every channel's segments, each cut in the pauses (TURN_PAUSE_S at least) where
    another channel starts a word: the sides' turns then interleave in the order they
    were said (one long segment would otherwise hold the whole exchange it spans)."""
    out: list[Segment] = []
    for n, tr in enumerate(parts):
        others = sorted(
            w["start"]
            for m, other in enumerate(parts)
            if m != n
            for s in other.segments
            for w in s.get("words") or []
        )
        for seg in tr.segments:
            runs = _runs(list(seg.get("words") or []), others)
            if len(runs) == 1:
                out.append(seg)
            else:
                out += [piece_of(seg, run, whole=False) for run in runs]
    return out


def _runs(words: list[Any], others: list[float]) -> list[list[Any]]:
    """``words`` cut where one of ``others`` (sorted starts) falls in a pause of at least
    TURN_PAUSE_S between two of them."""
    runs: list[list[Any]] = [words[:1]]
    for before, after in zip(words, words[1:], strict=False):
        at = bisect.bisect_left(others, before["end"] - TURN_REACH_S)
        paused = after["start"] - before["end"] >= TURN_PAUSE_S
        if paused and at < len(others) and others[at] < after["start"]:
            runs.append([])
        runs[-1].append(after)
    return runs


def merge(parts: list[transcribe.Transcript]) -> transcribe.Transcript:
    """One transcript: the segments, cut at the other channels' turns, in time order (ids
    renumbered); the language of the channel that spoke longest."""
    segments = sorted(_turns(parts), key=_when)
    for n, seg in enumerate(segments):
        seg["id"] = n
    main = max(parts, key=lambda tr: sum(s["end"] - s["start"] for s in tr.segments))
    waits = [tr.batch_wait for tr in parts if tr.batch_wait is not None]
    sizes = [size for tr in parts for size in tr.batch_sizes or []]
    spans = [part for tr in parts for part in tr.parts or []]
    return transcribe.Transcript(
        segments,
        main.language,
        main.language_probability,
        sum(tr.seconds for tr in parts),
        batch_wait=sum(waits) if waits else None,
        batch_sizes=sizes if any(tr.batch_sizes is not None for tr in parts) else None,
        parts=sorted(spans) if any(tr.parts is not None for tr in parts) else None,
    )


def _when(seg: Segment) -> tuple[float, int]:
    return seg["start"], seg.get("channel", 0)
