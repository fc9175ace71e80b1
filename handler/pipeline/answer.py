"""A job's answer: the transcript shaped into the formats asked for, the official worker's
legacy keys, the timings of each phase, offloaded to S3 when too large for the platform."""

from __future__ import annotations

import logging
import time
from typing import Any

from handler.contract import Segment
from handler.inference import transcribe
from handler.output import formats, profanity, redact, speakers
from handler.output.cues import Layout
from handler.output.offload import deliver
from handler.pipeline import words
from handler.pipeline.runtime import Call, Plan, Runtime
from handler.schema import JobInput

log = logging.getLogger("handler.pipeline.job")


def answer(
    plan: Plan, tr: transcribe.Transcript, duration: float, worker: Runtime, call: Call
) -> dict[str, Any]:
    """The output object, timed, offloaded to S3 when too large for the platform."""
    t = time.perf_counter()
    output = _shape(plan.job, tr, duration, plan.model.spec.name, worker.pool.device, call)
    call.timings["format"] = time.perf_counter() - t
    call.timings["total"] = time.perf_counter() - call.start
    output["timings"] = {k: round(v, 4) for k, v in call.timings.items()}
    if tr.batch_sizes is not None:
        output["batch_sizes"] = tr.batch_sizes
    return deliver(output, worker.settings, call.job_id)


def masked_stream(
    plan: Plan, stream: transcribe.SegmentCallback | None
) -> transcribe.SegmentCallback | None:
    """``profanity_filter``: each streamed segment masked, in the language the job named
    (its part's with ``"language": "multi"``; English alone when it detects one: the
    language is known to the answer, not yet to the stream). ``redact``: its numbers too."""
    if stream is None:
        return None
    asked = "en" if plan.job.effective_task == "translate" else plan.kwargs.get("language")
    keep_first = profanity.keeps_first(plan.job.profanity_filter)
    profane, numbers = bool(plan.job.profanity_filter), bool(plan.job.redact)

    def each(seg: Segment) -> None:
        lang = asked if asked == "en" else seg.get("language") or asked
        seg = profanity.segment(seg, lang, keep_first) if profane else seg
        stream(redact.segment(seg) if numbers else seg)

    return each


def redact_numbers(tr: transcribe.Transcript, call: Call) -> None:
    """``redact``: the numbers of the whole transcript masked (after stitching and word
    alignment, as profanity is), of each channel's text and of what a warning quotes."""
    tr.segments = [redact.segment(s) for s in tr.segments]
    if call.channels is not None:  # each channel's text: its segments', masked as they are
        call.channels = [
            {**c, "text": formats.to_text([s for s in tr.segments if s.get("channel") == n])}
            for n, c in ((c.get("same_as", c["channel"]), c) for c in call.channels)
        ]
    call.warnings[:] = [redact.quoted(w) for w in call.warnings]


def mask_profanity(plan: Plan, tr: transcribe.Transcript, call: Call) -> None:
    """``profanity_filter``: the transcript masked once it is whole (after stitching and
    word alignment: an aligner cannot place a masked word), each segment in its language:
    its part's, its channel's or the transcript's (English for a translation)."""
    translated = plan.job.effective_task == "translate"
    by_channel = {c["channel"]: c.get("language") for c in call.channels or []}

    def language(seg: Segment) -> str | None:
        if translated:
            return "en"
        return seg.get("language") or by_channel.get(seg.get("channel", -1)) or tr.language

    keep = profanity.keeps_first(plan.job.profanity_filter)
    langs = [language(s) for s in tr.segments]
    tr.segments = [
        profanity.segment(s, lang, keep) for s, lang in zip(tr.segments, langs, strict=True)
    ]
    if call.channels is not None:
        call.channels = profanity.channels(call.channels, translated, keep)
    # A warning may quote the transcript (a mended loop's phrase): masked as it is.
    said = profanity.masker("en" if translated else tr.language)
    call.warnings[:] = [said.text(w, keep) for w in call.warnings]
    if note := profanity.unlisted(langs):
        call.warnings.append(note)


def log_done(call: Call, duration: float, plan: Plan) -> None:
    timings, model, batch_size = call.timings, plan.model, plan.batch_size
    log.info(
        "job %s done: %.1fs audio in %.2fs (transcribe %.2fs, RTF %.3f, model %s, batch %d)",
        call.job_id,
        duration,
        timings["total"],
        timings["transcribe"],
        timings["transcribe"] / duration if duration else 0.0,
        model.spec.name,
        batch_size,
    )


def _shape(
    job: JobInput,
    tr: transcribe.Transcript,
    duration: float,
    model_name: str,
    device: str,
    call: Call,
) -> dict[str, Any]:
    task, warnings, segments = job.effective_task, call.warnings, tr.segments
    turns = call.diarization.turns if call.diarization is not None else []
    if job.diarize and not job.multichannel:  # a channel's speakers are joined per channel
        segments = speakers.attribute(segments, turns)
    rendered = formats.render(
        list(job.output),
        segments,
        language=tr.language,
        duration=duration,
        task=task,
        layout=job.layout,
        turns=turns,
    )
    out: dict[str, Any] = {
        "text": formats.to_text(segments),
        "language": tr.language or None,
        "language_probability": round(tr.language_probability, 4),
        "duration": round(duration, 3),
        **rendered,
        "model": model_name,
        "device": device,
    }
    if job.diarize:
        out["speakers"] = speakers.summary(turns)
        if job.speaker_embeddings and call.diarization is not None:
            out["speaker_embeddings"] = call.diarization.centroids
        if job.speaker_windows and call.speaker_windows is not None:
            out["speaker_windows"] = call.speaker_windows.to_json()
    if (timed := words.summary(call)) is not None:
        out["word_alignment"] = timed
        if isinstance(out.get("verbose_json"), dict):
            out["verbose_json"]["word_alignment"] = timed
        if tr.parts is not None:
            out["word_alignment_languages"] = dict(call.word_alignment or {})
    if call.channels is not None:
        out["channels"] = call.channels
        if isinstance(out.get("verbose_json"), dict):
            out["verbose_json"]["channels"] = call.channels
    if call.pieces is not None:
        out["pieces"] = call.pieces
    if warnings:
        out["warnings"] = warnings
    if job.legacy:
        out.update(_legacy_keys(job, segments, tr.language))
    return out


def _legacy_format(kind: str, segments: list[Segment], layout: Layout | None = None) -> str:
    if kind == "srt":
        return formats.to_srt(segments, layout=layout)
    if kind == "vtt":
        return formats.to_vtt(segments, layout=layout)
    sep = "\n" if kind == "formatted_text" else " "
    return sep.join(s["text"].strip() for s in segments)


def _legacy_keys(job: JobInput, segments: list[Segment], language: str) -> dict[str, Any]:
    """The official worker's output keys, so its clients keep working unchanged."""
    keys: dict[str, Any] = {
        "transcription": _legacy_format(job.transcription or "plain_text", segments, job.layout),
        "detected_language": language or None,
        "segments": formats.segments_public(segments, include_words=False),
        "translation": None,  # that worker always sends the key
    }
    if job.translate:
        # One translate pass: its text is the translation (the official worker ran two).
        keys["translation"] = _legacy_format(job.translation or "plain_text", segments, job.layout)
    if job.word_timestamps:
        keys["word_timestamps"] = [
            {"word": w["word"], "start": w["start"], "end": w["end"]}
            for w in formats.words(segments)
        ]
    return keys
