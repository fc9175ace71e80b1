"""What a job may ask of a model, checked before any audio is fetched; the compute budget;
the English-only model's doubt about what it heard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from handler.contract import Segment
from handler.errors import Code, WorkerError
from handler.guard import Guard
from handler.inference.models import LoadedModel

ENGLISH_ONLY_MIN_LOGPROB = -0.75
"""Below this token-weighted mean log-probability an English-only model's transcript is
probably of speech in another language (measured by ``python -m bench english-only`` on the
evaluation corpus: see bench/README.md)."""
ENGLISH_ONLY_MIN_TOKENS = 5


EMPTY_SUSPECT_SPEECH_S = 30.0
"""Speech (by the VAD) past which a transcript with no text at all is the model's fault:
CTranslate2's kernels answering empty on a GPU whose driver cannot run them (seen in the
field after 1 h 49 min of one file). Shorter speech may be music or noise the VAD let
through, which rightly gives no text."""


def speech_seconds(speech: list[tuple[float, float]] | None) -> float:
    return sum(end - start for start, end in speech or [])


def silently_empty(speech: list[tuple[float, float]] | None, segments: list[Segment]) -> bool:
    """The VAD found at least EMPTY_SUSPECT_SPEECH_S of speech and no segment has text."""
    if speech_seconds(speech) < EMPTY_SUSPECT_SPEECH_S:
        return False
    return not any(seg["text"].strip() for seg in segments)


def empty_transcript(speech: list[tuple[float, float]] | None) -> WorkerError:
    return WorkerError(
        Code.EMPTY_TRANSCRIPT,
        f"the model returned no text for {speech_seconds(speech):.0f} s of speech the VAD "
        "found: a fault of this GPU, not of the audio; this worker asks to be replaced, "
        "retry the job",
    )


def admission(
    min_language_probability: float | None,
    min_speech_ratio: float | None,
    duration: float,
    detects: bool,
) -> Callable[[str, float, float | None], None] | None:
    """The job's own thresholds, judged once the language is detected and the VAD has run,
    before any decoding is paid for (None: the job set none). ``detects``: the job named no
    language (one it named is never judged)."""
    if min_language_probability is None and min_speech_ratio is None:
        return None

    def admit(language: str, probability: float, speech: float | None) -> None:
        if detects and min_language_probability is not None:
            if probability < min_language_probability:
                raise WorkerError(
                    Code.LANGUAGE_UNCERTAIN,
                    f"the language detected, '{language}', has probability {probability:.2f}, "
                    f"under min_language_probability {min_language_probability:g}; nothing "
                    "was decoded (name the language to transcribe it anyway)",
                )
        if min_speech_ratio is not None and speech is not None and duration > 0:
            if speech / duration < min_speech_ratio:
                raise WorkerError(
                    Code.TOO_LITTLE_SPEECH,
                    f"the VAD found {speech:.1f} s of speech in {duration:.1f} s "
                    f"({100 * speech / duration:.0f} %), under min_speech_ratio "
                    f"{min_speech_ratio:g}; nothing was decoded",
                )

    return admit


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
