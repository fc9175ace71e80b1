"""A job's language, decided in one place.

The deployment's default language (``WHISPER_LANGUAGE``) for a multilingual model, the
deployment's allow-list (``WHISPER_LANGUAGES``: detection picks among these), the model's
own list (a language it does not know is refused before any audio is fetched), and
detection exactly as sequential decoding detects it, for the engine's batched windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from faster_whisper.tokenizer import _LANGUAGE_CODES
from faster_whisper.vad import get_speech_timestamps

from handler.errors import Code, WorkerError
from handler.inference import code_switch
from handler.inference.fw_batch import SAMPLE_RATE, WINDOW_S
from handler.inference.models import LoadedModel
from handler.inference.options import opt, vad_options


def plan(
    model: LoadedModel,
    kwargs: dict[str, Any],
    default: str | None,
    allow: list[str],
    job_allow: list[str] | None = None,
) -> tuple[dict[str, Any], list[str] | None]:
    """(kwargs with the deployment's default language, the languages detection may pick).

    ``allow``: the deployment's list; ``job_allow``: the job's own (OpenAI's
    ``languages[]``), which narrows the deployment's and cannot widen it. Raises
    WorkerError for a language the model does not know (UNSUPPORTED_FOR_MODEL on an
    English-only model, INVALID_INPUT otherwise), or a job list that leaves none.
    """
    if job_allow:
        if nonsense := sorted(set(job_allow) - set(_LANGUAGE_CODES)):
            what = f"languages: {', '.join(nonsense)}: not a language Whisper knows"
            raise WorkerError(Code.INVALID_INPUT, what)
        unknown = sorted(set(job_allow) - set(model.languages))
        if unknown and model.multilingual:
            raise WorkerError(
                Code.INVALID_INPUT,
                f"languages: {', '.join(unknown)} not supported by model '{model.spec.name}'",
            )
        narrowed = [x for x in job_allow if not allow or x in allow]
        if not narrowed:
            raise WorkerError(
                Code.INVALID_INPUT,
                f"languages: none of them is allowed here (WHISPER_LANGUAGES: {', '.join(allow)})",
            )
        allow = narrowed
    if default and "language" not in kwargs and model.multilingual:
        kwargs = {**kwargs, "language": default}
    lang = kwargs.get("language")
    if lang == code_switch.MULTI and not model.multilingual:
        raise WorkerError(
            Code.UNSUPPORTED_FOR_MODEL,
            f"language 'multi' (a language per part) needs a multilingual model; "
            f"'{model.spec.name}' is English-only",
        )
    if lang is not None and lang != code_switch.MULTI and lang not in model.languages:
        raise WorkerError(
            Code.INVALID_INPUT if model.multilingual else Code.UNSUPPORTED_FOR_MODEL,
            f"language '{lang}' is not supported by model '{model.spec.name}'",
        )
    allowed = [x for x in allow if x in model.languages] or None
    return kwargs, allowed


def among(
    model: Any, audio: np.ndarray, kwargs: dict[str, Any], allowed: list[str] | None
) -> tuple[dict[str, Any], float | None]:
    """``kwargs`` with the language detected among ``allowed`` when the job set none, and
    that language's probability (None: nothing was detected here)."""
    if not allowed or "language" in kwargs or not model.model.is_multilingual:
        return kwargs, None
    lang, probability = scored_among(model, audio, allowed, kwargs)
    return {**kwargs, "language": lang}, probability


def detect_among(model: Any, audio: np.ndarray, allowed: list[str], kwargs: dict[str, Any]) -> str:
    """The most probable of the ``allowed`` languages (faster-whisper's own detection)."""
    return scored_among(model, audio, allowed, kwargs)[0]


def scored_among(
    model: Any, audio: np.ndarray, allowed: list[str], kwargs: dict[str, Any]
) -> tuple[str, float]:
    """The most probable of the ``allowed`` languages and the model's probability of it."""
    _lang, _prob, probs = model.detect_language(
        audio=audio,
        vad_filter=bool(opt(kwargs, "vad_filter")),
        language_detection_segments=opt(kwargs, "language_detection_segments"),
        language_detection_threshold=opt(kwargs, "language_detection_threshold"),
    )
    ranked = [(lang, p) for lang, p in probs if lang in allowed]
    return (ranked[0][0], float(ranked[0][1])) if ranked else (allowed[0], 0.0)


# Speech that language detection reads beyond its segments' 30 s each: the features'
# normalisation (log-mel clamped at the input's maximum - 8) sees this much more.
DETECTION_MARGIN_S = 30


def as_sequential(
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
    segments = int(opt(kwargs, "language_detection_segments") or 1)
    limit = (segments * WINDOW_S + DETECTION_MARGIN_S) * SAMPLE_RATE
    if kwargs.get("vad_filter", True):  # the job's kwargs always say (handler.schema)
        parts = speech_head(audio, kwargs, limit)
        if not parts:
            return None
        speech = np.concatenate(parts)
    else:
        speech = audio[:limit]
    features = instance.feature_extractor(speech, chunk_length=kwargs.get("chunk_length"))
    language, probability, _ = instance.detect_language(
        features=features,
        language_detection_segments=segments,
        language_detection_threshold=opt(kwargs, "language_detection_threshold"),
    )
    return language, float(probability)


HEAD_S = 300
"""The VAD reads this much of a recording first for its head of speech, then twice as much."""


def speech_head(audio: np.ndarray, kwargs: dict[str, Any], limit: int) -> list[np.ndarray]:
    """The first ``limit`` samples of speech the job's VAD finds, as the VAD over the
    whole recording finds them, without running it over an hour to read a minute.

    The VAD runs on a prefix that doubles until it holds enough speech. Silero's
    probability for a 512-sample window depends only on the windows before it (the state
    is carried forward), and a span is settled once the silence after it is longer than
    the pause it needs and the padding; spans ending within that margin of the prefix's
    end are not used until a longer prefix (or the whole) has been read.
    """
    options = vad_options(kwargs)
    settle = (
        int((options.min_silence_duration_ms + 2 * options.speech_pad_ms) / 1000 * SAMPLE_RATE)
        + SAMPLE_RATE
    )
    n = HEAD_S * SAMPLE_RATE
    while True:
        whole = n >= len(audio)
        parts, got = [], 0
        for span in get_speech_timestamps(audio[:n], options):
            if not whole and span["end"] > n - settle:
                break
            take = min(span["end"] - span["start"], limit - got)
            parts.append(audio[span["start"] : span["start"] + take])
            got += take
            if got >= limit:
                return parts
        if whole:
            return parts
        n *= 2
