"""Run faster-whisper on decoded audio and consume the whole segment generator.

``WhisperModel.transcribe`` returns a lazy generator: nothing is decoded until it is
iterated, so the caller times this function, not the call that builds the generator.
Segments are turned into plain dicts here (the only module besides models.py that touches
faster-whisper types), checked for cancellation one by one, and handed to an optional
callback for streaming and progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handler.contract import Segment, Word
from handler.errors import Code, WorkerError, is_oom
from handler.guard import raise_if_cancelled
from handler.inference import code_switch, fw_batch, language
from handler.inference.checks import budget_guard
from handler.inference.engine import Engine, EngineJob
from handler.inference.models import LoadedModel, guarded_calls
from handler.inference.options import vad_options

log = logging.getLogger(__name__)

SegmentCallback = Callable[[Segment], None]
Admit = Callable[[str, float, "float | None"], None]
"""Called once the language is known and the VAD has run, before any decoding: (language,
its probability, seconds of speech or None without the VAD); raises to refuse the job."""


@dataclass
class Transcript:
    segments: list[Segment]
    language: str
    language_probability: float
    seconds: float
    warnings: list[str] = field(default_factory=list)
    batch_wait: float | None = None
    """Engine only: seconds this job's windows waited for a batch, summed."""
    batch_sizes: list[int] | None = None
    """Engine only: the size of each batch this job's windows rode in."""
    speech: list[tuple[float, float]] | None = None
    """The VAD's speech spans (seconds) the transcription used; None without the VAD."""
    parts: list[tuple[float, float, str]] | None = None
    """``"language": "multi"`` only: (start s, end s, language) of each part."""
    gathered: bool = False
    """The speech spans were moved to the front of the job's samples (``consume_audio``):
    the samples hold the ``speech`` spans back to back, no longer the recording."""


def segment_dict(seg: Any) -> Segment:
    words: list[Word] | None = None
    if seg.words is not None:
        words = [
            {"start": w.start, "end": w.end, "word": w.word, "probability": w.probability}
            for w in seg.words
        ]
    return {
        "id": seg.id,
        "seek": seg.seek,
        "start": seg.start,
        "end": seg.end,
        "text": seg.text,
        "tokens": list(seg.tokens),
        "temperature": seg.temperature,
        "avg_logprob": seg.avg_logprob,
        "compression_ratio": seg.compression_ratio,
        "no_speech_prob": seg.no_speech_prob,
        "words": words,
    }


# Options the batched pipeline accepts but ignores, or reads in another format.
NOT_BATCHABLE = frozenset(
    {
        "clip_timestamps",
        "condition_on_previous_text",
        "prompt_reset_on_temperature",
        "hallucination_silence_threshold",
        # Sequential decoding puts a prefix on the first window only; batched would put
        # it on every window.
        "prefix",
    }
)


def batch_blocker(kwargs: dict[str, Any], audio_seconds: float) -> str | None:
    """Why this job cannot use the batched pipeline, or None."""
    given = sorted(NOT_BATCHABLE & kwargs.keys())
    if given:
        return f"option(s) {', '.join(given)} need sequential decoding"
    return None


def run(
    instance: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    *,
    cancel: threading.Event | None = None,
    on_segment: SegmentCallback | None = None,
    languages: list[str] | None = None,
    budget_s: float | None = None,
    consume_audio: bool = False,
    admit: Admit | None = None,
) -> Transcript:
    """Transcribe ``audio`` (float32, 16 kHz mono) and return every segment.

    ``languages``: detect only among these (when the job set no language). ``budget_s``:
    seconds this job may spend in the model (COMPUTE_BUDGET_EXCEEDED past it).
    ``consume_audio``: the caller is done with ``audio``; the speech the VAD keeps is
    gathered inside it instead of into a second copy (overwriting it).
    """
    with guarded_calls(budget_guard(cancel, budget_s)):
        return _run_sequential(
            instance, audio, kwargs, cancel, on_segment, languages, consume_audio, admit
        )


def _run_sequential(
    instance: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    cancel: threading.Event | None,
    on_segment: SegmentCallback | None,
    languages: list[str] | None,
    consume_audio: bool = False,
    admit: Admit | None = None,
) -> Transcript:
    start = time.perf_counter()
    kwargs, chosen = language.among(instance, audio, kwargs, languages)
    try:
        generator, info, spans = sequential_segments(instance, audio, kwargs, consume_audio)
        probability = float(info.language_probability) if chosen is None else chosen
        if admit is not None:
            speech = sum(s["end"] - s["start"] for s in spans) if spans is not None else None
            admit(
                info.language,
                probability,
                None if speech is None else speech / fw_batch.SAMPLE_RATE,
            )
        segments = []
        for seg in generator:
            item = segment_dict(seg)
            segments.append(item)
            if on_segment is not None:
                on_segment(item)
            if cancel is not None and cancel.is_set():
                generator.close()
                raise_if_cancelled(cancel)
    except WorkerError:
        raise
    except RuntimeError as exc:
        if is_oom(exc):
            raise WorkerError(
                Code.GPU_OOM, "the GPU ran out of memory; the job can be retried"
            ) from None
        raise
    return Transcript(
        segments=segments,
        language=info.language,
        language_probability=probability,
        seconds=time.perf_counter() - start,
        speech=_seconds(spans) if spans is not None else None,
        gathered=spans is not None and consume_audio and gathers_in_place(audio),
    )


def _seconds(spans: list[dict[str, int]]) -> list[tuple[float, float]]:
    rate = fw_batch.SAMPLE_RATE
    return [(s["start"] / rate, s["end"] / rate) for s in spans]


def sequential_segments(
    instance: Any, audio: np.ndarray, kwargs: dict[str, Any], consume: bool = False
):
    """``WhisperModel.transcribe``, with its VAD step done here in bounded memory.

    With ``vad_filter`` faster-whisper gathers the speech with ``collect_chunks``, which
    grows one array by ``np.concatenate`` per speech span (quadratic time, and two copies
    at once: on hours of audio, gigabytes and minutes). The same spans are found with the
    same VAD call and copied once into one array; transcribing that with the VAD off and
    mapping the times back (faster-whisper's own ``restore_speech_timestamps``) is what
    ``transcribe`` does itself, so the text is the same (tests/test_features.py). With
    ``consume`` the spans are moved to the front of ``audio`` itself (each span moves left,
    never over one still to come), so no second copy of the speech exists at all.
    """
    if not kwargs.get("vad_filter") or kwargs.get("clip_timestamps", "0") != "0":
        return (*instance.transcribe(audio, **kwargs), None)
    from faster_whisper.transcribe import restore_speech_timestamps
    from faster_whisper.vad import get_speech_timestamps

    spans = get_speech_timestamps(audio, vad_options(kwargs))
    total = sum(s["end"] - s["start"] for s in spans)
    in_place = consume and gathers_in_place(audio)
    speech = audio if in_place else np.empty(total, dtype=np.float32)
    at = 0
    for span in spans:
        n = span["end"] - span["start"]
        if not (in_place and at == span["start"]):
            speech[at : at + n] = audio[span["start"] : span["end"]]  # overlap-safe in numpy
        at += n
    speech = speech[:total]
    rest = {k: v for k, v in kwargs.items() if k not in ("vad_filter", "vad_parameters")}
    generator, info = instance.transcribe(speech, vad_filter=False, **rest)
    if spans:
        generator = restore_speech_timestamps(generator, spans, fw_batch.SAMPLE_RATE)
    return generator, info, spans


def gathers_in_place(audio: np.ndarray) -> bool:
    return audio.dtype == np.float32 and bool(audio.flags.writeable)


def run_by_parts(
    instance: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    run_part: Callable[..., Transcript],
    *,
    cancel: threading.Event | None = None,
    on_segment: SegmentCallback | None = None,
    languages: list[str] | None = None,
    breaks: list[float] | None = None,
    **rest: Any,
) -> Transcript:
    """``"language": "multi"``: the recording cut into parts of one language each
    (handler.inference.code_switch), each part transcribed by ``run_part`` (``run`` or
    ``run_engine``, with ``rest``) in its language; segments on the file's time line,
    numbered across parts, each with its ``language``; the result's language is the one
    with the most speech."""
    start = time.perf_counter()
    plan, found = code_switch.plan_parts(instance, audio, kwargs, languages, breaks)
    segments: list[Segment] = []
    batch_wait, batch_sizes = 0.0, []
    for part in plan:
        raise_if_cancelled(cancel)
        offset = part.start / fw_batch.SAMPLE_RATE

        def placed(seg: Segment, offset: float = offset, lang: str = part.language) -> None:
            code_switch.shift(seg, offset)
            seg["language"] = lang
            seg["id"] = len(segments) + 1
            segments.append(seg)
            if on_segment is not None:
                on_segment(seg)

        tr = run_part(
            audio[part.start : part.end],
            {**kwargs, "language": part.language},
            cancel=cancel,
            on_segment=placed,
            **rest,
        )
        batch_wait += tr.batch_wait or 0.0
        batch_sizes += tr.batch_sizes or []
    main, probability = code_switch.main_language(plan) if plan else ("", 0.0)
    return Transcript(
        segments=segments,
        language=main,
        language_probability=probability,
        seconds=time.perf_counter() - start,
        batch_wait=batch_wait,
        batch_sizes=batch_sizes,
        speech=[(r.start / fw_batch.SAMPLE_RATE, r.end / fw_batch.SAMPLE_RATE) for r in found],
        parts=[
            (p.start / fw_batch.SAMPLE_RATE, p.end / fw_batch.SAMPLE_RATE, p.language) for p in plan
        ],
    )


def run_engine(
    engine: Engine,
    model: LoadedModel,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    *,
    batch_size: int,
    cancel: threading.Event | None = None,
    on_segment: SegmentCallback | None = None,
    languages: list[str] | None = None,
    budget_s: float | None = None,
    admit: Admit | None = None,
) -> Transcript:
    """Transcribe through the engine: windows prepared here, decoded in shared batches."""
    start = time.perf_counter()
    instance, scheduler = engine.scheduler_for(model.instances)
    kwargs, chosen = language.among(instance, audio, kwargs, languages)
    detected = None
    if kwargs.get("language") is None and instance.model.is_multilingual:
        detected = language.as_sequential(instance, audio, kwargs)
    prepared = fw_batch.prepare(instance, audio, kwargs, detected)
    if chosen is not None:
        prepared.language_probability = chosen  # detected among the job's languages
    vad = kwargs.get("vad_filter", fw_batch.BATCHED_DEFAULTS["vad_filter"])
    if admit is not None:
        speech = sum(e - s for s, e in _seconds(prepared.speech_chunks)) if vad else None
        admit(prepared.language, prepared.language_probability, speech)
    raise_if_cancelled(cancel)
    job = EngineJob(prepared, batch_size, cancel, guard=budget_guard(cancel, budget_s))
    scheduler.submit(job)

    def windows() -> Any:
        for index in range(len(prepared.features)):
            yield scheduler.result(job, index)

    segments: list[Segment] = []
    try:
        for seg in fw_batch.to_segments(windows(), prepared):
            item = segment_dict(seg)
            segments.append(item)
            if on_segment is not None:
                on_segment(item)
    finally:
        scheduler.drop(job)
    return Transcript(
        segments=segments,
        language=prepared.language,
        language_probability=prepared.language_probability,
        seconds=time.perf_counter() - start,
        batch_wait=sum(job.waits),
        batch_sizes=list(job.batch_sizes),
        speech=_seconds(prepared.speech_chunks) if vad else None,
    )
