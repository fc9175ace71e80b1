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

from handler import fw_batch
from handler.contract import Segment, Word
from handler.engine import Engine, EngineJob
from handler.errors import Code, WorkerError, is_oom
from handler.guard import Guard, raise_if_cancelled
from handler.models import LoadedModel, guarded_calls

log = logging.getLogger(__name__)

SegmentCallback = Callable[[Segment], None]


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


ENGLISH_ONLY_MIN_LOGPROB = -0.75
"""Below this token-weighted mean log-probability an English-only model's transcript is
probably of speech in another language (measured by ``python -m bench english-only`` on the
evaluation corpus: see bench/README.md)."""
ENGLISH_ONLY_MIN_TOKENS = 5


def english_only_doubt(model: LoadedModel, segments: list[Segment]) -> str | None:
    """A warning when an English-only model was unsure of all it heard.

    An English-only model cannot detect the language: on Spanish or Russian speech it
    writes confident-looking English nonsense. What gives it away is the decoder's own
    confidence, far lower than on any English recording of the corpus.
    """
    if model.multilingual:
        return None
    tokens = sum(len(s["tokens"]) for s in segments)
    if tokens < ENGLISH_ONLY_MIN_TOKENS:
        return None
    mean = sum(s["avg_logprob"] * len(s["tokens"]) for s in segments) / tokens
    if mean >= ENGLISH_ONLY_MIN_LOGPROB:
        return None
    return (
        f"the English-only model '{model.spec.name}' was unsure of this audio (mean token"
        f" log-probability {mean:.2f}); if the speech is not English the transcript is"
        " likely nonsense: use a multilingual model (WHISPER_MODEL=base, small, large-v3)"
    )


def check_request(model: LoadedModel, kwargs: dict[str, Any]) -> None:
    """Refuse what this model cannot do before any audio is fetched."""
    if kwargs.get("task") == "translate" and not model.can_translate:
        raise WorkerError(
            Code.UNSUPPORTED_FOR_MODEL,
            f"model '{model.spec.name}' cannot translate; use a multilingual model such as "
            "large-v3 or medium",
        )
    _check_prompt_budget(model, kwargs)
    lang = kwargs.get("language")
    if lang is not None:
        if lang not in model.languages:
            raise WorkerError(
                Code.INVALID_INPUT if model.multilingual else Code.UNSUPPORTED_FOR_MODEL,
                f"language '{lang}' is not supported by model '{model.spec.name}'",
            )


MAX_LENGTH = 448
"""Whisper's decoder context (tokens): prompt + prefix + generated tokens must fit."""
MAX_PREFIX_TOKENS = 100


def _tokens(model: LoadedModel, text: str) -> int:
    tokenizer = getattr(model.instances[0], "hf_tokenizer", None)
    if tokenizer is None:  # not a WhisperModel (a test double): count bytes, an upper bound
        return len(text.encode())
    return len(tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids)


def _check_prompt_budget(model: LoadedModel, kwargs: dict[str, Any]) -> None:
    """Refuse a prompt, prefix or max_new_tokens the decoder context cannot hold.

    The worst prompt faster-whisper builds (get_prompt): sot_prev, hotwords (without a
    prefix) or the previous text, each cut to 223 tokens; the 3-token start sequence and
    no-timestamps; then timestamp_begin and the prefix, cut to 223. A longer request fails
    inside the model after the audio was fetched and decoded (INTERNAL before), and a long
    prefix multiplies decoding time, so it is refused before any audio is fetched.
    """
    half = MAX_LENGTH // 2 - 1
    prefix = kwargs.get("prefix")
    prefix_n = _tokens(model, prefix) if prefix else 0
    if prefix_n > MAX_PREFIX_TOKENS:
        raise WorkerError(
            Code.INVALID_INPUT,
            f"invalid input: prefix: {prefix_n} tokens; at most {MAX_PREFIX_TOKENS}",
        )
    max_new = kwargs.get("max_new_tokens")
    if max_new is None:
        return
    previous = 0
    if kwargs.get("condition_on_previous_text", True) or kwargs.get("initial_prompt"):
        previous = half
    hot = kwargs.get("hotwords")
    hot_n = min(half, _tokens(model, hot)) if hot and not prefix else 0
    prompt = 1 + max(previous, 0) + hot_n + 3 + 1 + (1 + prefix_n if prefix else 0)
    if prompt + max_new > MAX_LENGTH:
        raise WorkerError(
            Code.INVALID_INPUT,
            f"invalid input: max_new_tokens: at most {max(0, MAX_LENGTH - prompt)} with these "
            f"prompt options (the decoder holds {MAX_LENGTH} tokens, the prompt up to {prompt})",
        )


def budget_guard(cancel: threading.Event | None, budget_s: float | None) -> Guard:
    return Guard(
        cancel,
        None if budget_s is None else time.monotonic() + budget_s,
        Code.COMPUTE_BUDGET_EXCEEDED,
        f"the job used its compute budget ({budget_s or 0:.0f} s in the model) and was "
        "stopped; options that force decoding fallbacks (tiny compression_ratio_threshold, "
        "huge log_prob_threshold, wide beams) cost this",
    )


def with_language(
    model: Any, audio: np.ndarray, kwargs: dict[str, Any], allowed: list[str] | None
) -> dict[str, Any]:
    """``kwargs`` with the language detected among ``allowed`` when the job set none."""
    if not allowed or "language" in kwargs or not model.model.is_multilingual:
        return kwargs
    return {**kwargs, "language": detect_among(model, audio, allowed, kwargs)}


def detect_among(model: Any, audio: np.ndarray, allowed: list[str], kwargs: dict[str, Any]) -> str:
    """The most probable of the ``allowed`` languages (faster-whisper's own detection)."""
    _lang, _prob, probs = model.detect_language(
        audio=audio,
        vad_filter=bool(kwargs.get("vad_filter", True)),
        language_detection_segments=kwargs.get("language_detection_segments", 1),
        language_detection_threshold=kwargs.get("language_detection_threshold", 0.5),
    )
    ranked = [lang for lang, _p in probs if lang in allowed]
    return ranked[0] if ranked else allowed[0]


# Speech that language detection reads beyond its segments' 30 s each: the features'
# normalisation (log-mel clamped at the input's maximum - 8) sees this much more.
DETECTION_MARGIN_S = 30


def language_as_sequential(
    instance: Any, audio: np.ndarray, kwargs: dict[str, Any]
) -> tuple[str, float] | None:
    """The language sequential decoding would detect for this job, or None (no speech).

    Sequential decoding gathers the speech with the job's VAD options (2-s pauses by
    default) and ``WhisperModel.transcribe`` detects on the features of that speech; the
    engine's windows come from the batched pipeline's VAD (160-ms pauses) and are padded
    one by one, and on clips of a second or two that flipped the language (an Italian
    "amici" heard as Portuguese, "telephone number" as Malayalam: the accuracy bench's
    short group, 34.8 % WER through the engine against 32.6 % sequential). Same VAD, same
    features, same call here. Only the first ``language_detection_segments`` x 30 s of
    speech (plus a margin) are read, so a long file costs no second copy of itself; within
    that the result is exactly the sequential one (tests/test_engine.py).
    """
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    segments = int(kwargs.get("language_detection_segments") or 1)
    limit = (segments * fw_batch.WINDOW_S + DETECTION_MARGIN_S) * fw_batch.SAMPLE_RATE
    if kwargs.get("vad_filter", True):
        params = kwargs.get("vad_parameters")
        options = params if isinstance(params, VadOptions) else VadOptions(**(params or {}))
        parts, n = [], 0
        for span in get_speech_timestamps(audio, options):
            take = min(span["end"] - span["start"], limit - n)
            parts.append(audio[span["start"] : span["start"] + take])
            n += take
            if n >= limit:
                break
        if not parts:
            return None
        speech = np.concatenate(parts)
    else:
        speech = audio[:limit]
    features = instance.feature_extractor(speech, chunk_length=kwargs.get("chunk_length"))
    language, probability, _ = instance.detect_language(
        features=features,
        language_detection_segments=segments,
        language_detection_threshold=kwargs.get("language_detection_threshold", 0.5),
    )
    return language, float(probability)


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
) -> Transcript:
    """Transcribe ``audio`` (float32, 16 kHz mono) and return every segment.

    ``languages``: detect only among these (when the job set no language). ``budget_s``:
    seconds this job may spend in the model (COMPUTE_BUDGET_EXCEEDED past it).
    ``consume_audio``: the caller is done with ``audio``; the speech the VAD keeps is
    gathered inside it instead of into a second copy (overwriting it).
    """
    with guarded_calls(budget_guard(cancel, budget_s)):
        return _run_sequential(
            instance, audio, kwargs, cancel, on_segment, languages, consume_audio
        )


def _run_sequential(
    instance: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    cancel: threading.Event | None,
    on_segment: SegmentCallback | None,
    languages: list[str] | None,
    consume_audio: bool = False,
) -> Transcript:
    start = time.perf_counter()
    kwargs = with_language(instance, audio, kwargs, languages)
    try:
        generator, info = _transcribe_sequential(instance, audio, kwargs, consume_audio)
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
        language_probability=float(info.language_probability),
        seconds=time.perf_counter() - start,
    )


def _transcribe_sequential(
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
        return instance.transcribe(audio, **kwargs)
    from faster_whisper.transcribe import restore_speech_timestamps
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    params = kwargs.get("vad_parameters")
    options = params if isinstance(params, VadOptions) else VadOptions(**(params or {}))
    spans = get_speech_timestamps(audio, options)
    total = sum(s["end"] - s["start"] for s in spans)
    in_place = consume and audio.dtype == np.float32 and audio.flags.writeable
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
    return generator, info


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
) -> Transcript:
    """Transcribe through the engine: windows prepared here, decoded in shared batches."""
    start = time.perf_counter()
    instance, scheduler = engine.scheduler_for(model.instances)
    kwargs = with_language(instance, audio, kwargs, languages)
    detected = None
    if kwargs.get("language") is None and instance.model.is_multilingual:
        detected = language_as_sequential(instance, audio, kwargs)
    prepared = fw_batch.prepare(instance, audio, kwargs, detected)
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
    )
