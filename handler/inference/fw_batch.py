"""The pieces of faster-whisper's batched pipeline that the engine reuses, behind one module.

``BatchedInferencePipeline.transcribe`` splits one file into VAD chunks of at most 30 s,
computes their features and decodes them ``batch_size`` at a time. The engine
(``handler.inference.engine``) needs the same steps apart, because windows of *many* jobs share a
batch: :func:`prepare` does a job's part (VAD, chunks, features, language, tokenizer,
options, prompt) in the job's own thread; :func:`decode_batch` does one batched encode +
generate over windows of any jobs, with one prompt per window, so language, task and
prompt may differ per window; :func:`segments_of` turns a window's output back into
faster-whisper ``Segment`` objects on the original time line.

The private faster-whisper names used here are pinned by tests/test_engine.py against the
installed version (a drift test), the way faster-whisper's own signature test does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from faster_whisper.audio import pad_or_trim
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import (
    Segment,
    TranscriptionOptions,
    Word,
    get_compression_ratio,
    get_suppressed_tokens,
    restore_speech_timestamps,
)
from faster_whisper.vad import collect_chunks, get_speech_timestamps

from handler.contract import SAMPLE_RATE
from handler.inference.options import BATCHED_DEFAULTS, opt, temperatures, vad_options

WINDOW_S = 30

# Options one batched generate() call must share; everything else may differ per window.
GENERATE_KEYS = (
    "beam_size",
    "patience",
    "length_penalty",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "suppress_blank",
    "suppress_tokens",
    "max_new_tokens",
    "word_timestamps",
    "prepend_punctuations",
    "append_punctuations",
    "multilingual",
)


@dataclass
class PreparedJob:
    """A job's windows and what decoding them needs; built in the job's thread."""

    features: list[np.ndarray]
    """(n_mels, 3000) float32 per window."""
    metadata: list[dict[str, Any]]
    """offset and duration (seconds) of each window."""
    speech_chunks: list[dict[str, int]]
    """VAD speech spans (samples) to map window times back to the file's time line."""
    tokenizer: Tokenizer
    options: TranscriptionOptions
    prompt: list[int]
    language: str
    language_probability: float
    key: tuple[Any, ...] = field(default=())
    fallback: TranscriptionOptions | None = None
    """The options with the job's whole temperature ladder, for a window whose batched
    decode fails the compression-ratio or log-probability test (None: no ladder)."""
    """Windows with equal keys may share one batched call."""


def _speech_chunks(audio: np.ndarray, kwargs: dict[str, Any], chunk_length: int) -> list[dict]:
    duration = len(audio) / SAMPLE_RATE
    if kwargs.get("vad_filter", BATCHED_DEFAULTS["vad_filter"]):
        # As the batched pipeline does: windows of at most chunk_length, and its 160-ms
        # pauses unless the job gave VAD parameters.
        extra: dict[str, Any] = {"max_speech_duration_s": chunk_length}
        if not kwargs.get("vad_parameters"):
            extra["min_silence_duration_ms"] = 160
        return get_speech_timestamps(audio, vad_options(kwargs, **extra))
    if duration <= chunk_length:
        return [{"start": 0, "end": len(audio)}]
    # Without VAD the batched pipeline refuses long audio; fixed windows keep it working.
    step = chunk_length * SAMPLE_RATE
    return [{"start": s, "end": min(s + step, len(audio))} for s in range(0, len(audio), step)]


def prepare(
    model: Any,
    audio: np.ndarray,
    kwargs: dict[str, Any],
    detected: tuple[str, float] | None = None,
) -> PreparedJob:
    """VAD, windows, features, language and prompt for one job (no batched decode yet).

    ``detected``: the language (and its probability) found by the caller for a job that set
    none (handler.inference.transcribe detects it as sequential decoding does); without it
    the language is detected on this job's windows, as ``BatchedInferencePipeline`` does.
    """
    chunk_length = int(kwargs.get("chunk_length") or model.feature_extractor.chunk_length)
    chunks = _speech_chunks(audio, kwargs, chunk_length)
    audio_chunks, metadata = collect_chunks(audio, chunks, max_duration=chunk_length)
    speech = sum(c["end"] - c["start"] for c in chunks)
    features = (
        [pad_or_trim(model.feature_extractor(c)[..., :-1]) for c in audio_chunks] if speech else []
    )
    multilingual_model = bool(model.model.is_multilingual)
    language, probability = _language(model, kwargs, features, detected)
    task = opt(kwargs, "task")
    tokenizer = Tokenizer(model.hf_tokenizer, multilingual_model, task=task, language=language)
    options = _options(kwargs, tokenizer, chunks, multilingual_model)
    initial = options.initial_prompt
    prompt = model.get_prompt(
        tokenizer,
        previous_tokens=tokenizer.encode(initial) if initial is not None else [],
        without_timestamps=options.without_timestamps,
        hotwords=options.hotwords,
    )
    key: tuple[Any, ...] = (
        tuple(tuple(v) if isinstance(v := getattr(options, k), list) else v for k in GENERATE_KEYS),
        options.temperatures[0],
        len(prompt),
    )
    if options.word_timestamps:
        # Word alignment runs once per batch with one tokenizer: same language and task.
        key += (language, task)
    ladder = temperatures(kwargs)
    fallback = dataclasses.replace(options, temperatures=ladder) if len(ladder) > 1 else None
    return PreparedJob(
        features,
        metadata,
        chunks,
        tokenizer,
        options,
        prompt,
        language,
        float(probability),
        key,
        fallback,
    )


def _language(
    model: Any,
    kwargs: dict[str, Any],
    features: list[np.ndarray],
    detected: tuple[str, float] | None,
) -> tuple[str, float]:
    """The job's language and its probability: set, detected by the caller, or here."""
    language = kwargs.get("language")
    if language is not None:
        return language, 1.0
    if detected is not None and features:
        return detected
    if not model.model.is_multilingual or not features:
        return "en", 1.0
    language, probability, _ = model.detect_language(
        features=np.concatenate(
            [*features, np.full((model.model.n_mels, 1), -1.5, dtype="float32")], axis=1
        ),
        language_detection_segments=opt(kwargs, "language_detection_segments"),
        language_detection_threshold=opt(kwargs, "language_detection_threshold"),
    )
    return language, probability


def _options(
    kwargs: dict[str, Any], tokenizer: Tokenizer, chunks: list[dict], multilingual_model: bool
) -> TranscriptionOptions:
    """The job's options with faster-whisper's defaults, and the batched pipeline's fixed
    choices (no previous text, no hallucination skip, no prefix: see NOT_BATCHABLE)."""
    suppress = opt(kwargs, "suppress_tokens")
    return TranscriptionOptions(
        beam_size=opt(kwargs, "beam_size"),
        best_of=opt(kwargs, "best_of"),
        patience=opt(kwargs, "patience"),
        length_penalty=opt(kwargs, "length_penalty"),
        repetition_penalty=opt(kwargs, "repetition_penalty"),
        no_repeat_ngram_size=opt(kwargs, "no_repeat_ngram_size"),
        log_prob_threshold=opt(kwargs, "log_prob_threshold"),
        no_speech_threshold=opt(kwargs, "no_speech_threshold"),
        compression_ratio_threshold=opt(kwargs, "compression_ratio_threshold"),
        temperatures=temperatures(kwargs)[:1],
        initial_prompt=opt(kwargs, "initial_prompt"),
        prefix=None,
        suppress_blank=opt(kwargs, "suppress_blank"),
        suppress_tokens=get_suppressed_tokens(tokenizer, suppress) if suppress else suppress,
        prepend_punctuations=opt(kwargs, "prepend_punctuations"),
        append_punctuations=opt(kwargs, "append_punctuations"),
        max_new_tokens=opt(kwargs, "max_new_tokens"),
        hotwords=opt(kwargs, "hotwords"),
        word_timestamps=bool(opt(kwargs, "word_timestamps")),
        hallucination_silence_threshold=None,
        condition_on_previous_text=False,
        clip_timestamps=chunks,
        prompt_reset_on_temperature=opt(kwargs, "prompt_reset_on_temperature"),
        multilingual=bool(opt(kwargs, "multilingual")) and multilingual_model,
        without_timestamps=bool(opt(kwargs, "without_timestamps")),
        max_initial_timestamp=0.0,
    )


@dataclass
class BatchItem:
    """One window of one job in a batch."""

    job: PreparedJob
    index: int


MAX_CONTINUATIONS = 8
"""Rounds a window may be decoded again from its last timestamp (each must advance)."""


@dataclass
class _Pending:
    """A window still to decode from ``pos`` (frames into the window) to ``size``."""

    item: BatchItem
    slot: int
    pos: int
    size: int

    @property
    def features(self) -> np.ndarray:
        return self.item.job.features[self.item.index]


def decode_batch(
    model: Any, items: list[BatchItem], alive: Callable[[int], bool] | None = None
) -> list[list[dict[str, Any]]]:
    """One batched encode + generate over windows of any jobs sharing a key.

    Returns each window's segments as dicts (window-relative times), as
    ``BatchedInferencePipeline.forward`` does, but with one prompt per window, and with
    the sequential decoder's seek: when a window's tokens end in an unfinished segment
    (text after the last timestamp pair, not closed by a timestamp), faster-whisper's
    ``_split_segments_by_timestamps`` drops that text and the sequential decoder decodes
    again from the last timestamp. A batched window is decoded once, so without this the
    text was lost (a window's last words, measured on the accuracy corpus). The windows
    that need it are decoded again together, from their last timestamps, in further
    batched rounds. ``alive(n)`` (optional) says whether item ``n`` is still wanted: one
    that is not (its job was cancelled) is not decoded again.
    """
    first = items[0].job
    out: list[list[dict[str, Any]]] = [[] for _ in items]
    pending = [
        _Pending(
            it,
            n,
            0,
            int(math.ceil(it.job.metadata[it.index]["duration"]) * model.frames_per_second),
        )
        for n, it in enumerate(items)
    ]
    for _ in range(1 + MAX_CONTINUATIONS):
        if alive is not None:
            pending = [p for p in pending if alive(p.slot)]
        if not pending:
            break
        pending = _decode_round(model, first, pending, out)
    return out


def _decode_round(
    model: Any, first: PreparedJob, pending: list[_Pending], out: list[list[dict[str, Any]]]
) -> list[_Pending]:
    """Decode each pending window from its position; return those with text left."""
    options = first.options
    features = np.stack(
        [p.features if p.pos == 0 else pad_or_trim(p.features[:, p.pos : p.size]) for p in pending]
    )
    encoder_output = model.encode(features)
    prompts = _prompts(model, options, pending, encoder_output)
    results = _generate(model, first, encoder_output, prompts)
    left: list[_Pending] = []
    unfinished: list[tuple[_Pending, int, list[dict[str, Any]]]] = []
    decoded: list[tuple[_Pending, list[dict[str, Any]]]] = []
    for n, (p, result) in enumerate(zip(pending, results, strict=True)):
        window = _window_segments(model, options, p, result, features[n : n + 1], prompts[n])
        if window is None:
            continue  # WhisperModel.generate_segments skips a silent window
        segments, seek, window_seek = window
        out[p.slot].extend(segments)
        if segments:
            decoded.append((p, segments))
        if p.pos < seek < p.size:
            left.append(dataclasses.replace(p, pos=seek))
            unfinished.append((left[-1], window_seek - p.pos, segments))
    if options.word_timestamps and decoded:
        _add_words(model, first, pending, decoded, unfinished, features, encoder_output)
    return [p for p in left if p.pos < p.size]


def _prompts(
    model: Any, options: TranscriptionOptions, pending: list[_Pending], encoder_output: Any
) -> list[list[int]]:
    """Each window's prompt; with ``multilingual``, its language detected per window."""
    prompts = [list(p.item.job.prompt) for p in pending]
    if options.multilingual:
        detected = model.model.detect_language(encoder_output)
        for prompt, p, langs in zip(prompts, pending, detected, strict=True):
            index = prompt.index(p.item.job.tokenizer.language)
            prompt[index] = p.item.job.tokenizer.tokenizer.token_to_id(langs[0][0])
    return prompts


def _generate(model: Any, first: PreparedJob, encoder_output: Any, prompts: list[list[int]]) -> Any:
    """One batched generate() with the options the batch shares (its key)."""
    options = first.options
    max_length = model.max_length
    if options.max_new_tokens is not None:
        max_length = len(first.prompt) + options.max_new_tokens  # equal lengths: in the key
    return model.model.generate(
        encoder_output,
        prompts,
        beam_size=options.beam_size,
        patience=options.patience,
        length_penalty=options.length_penalty,
        max_length=max_length,
        suppress_blank=options.suppress_blank,
        suppress_tokens=options.suppress_tokens,
        return_scores=True,
        return_no_speech_prob=True,
        sampling_temperature=options.temperatures[0],
        repetition_penalty=options.repetition_penalty,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
    )


def _window_segments(
    model: Any,
    options: TranscriptionOptions,
    p: _Pending,
    result: Any,
    features: np.ndarray,
    prompt: list[int],
) -> tuple[list[dict[str, Any]], int, int] | None:
    """(segments, seek, the window's first frame) of one decoded window; None if silent."""
    tokens = result.sequences_ids[0]
    seq_len = len(tokens)
    avg_logprob = result.scores[0] * (seq_len**options.length_penalty) / (seq_len + 1)
    temperature = options.temperatures[0]
    job = p.item.job
    tok = job.tokenizer
    if job.fallback is not None and needs_fallback(
        options,
        avg_logprob,
        get_compression_ratio(tok.decode(tokens).strip()),
        result.no_speech_prob,
    ):
        # As WhisperModel.generate_with_fallback does for one window of a sequential
        # decode: the temperature ladder, on this window alone.
        result, avg_logprob, temperature, _ = model.generate_with_fallback(
            model.encode(features), prompt, tok, job.fallback
        )
        tokens = result.sequences_ids[0]
    if is_silence(options, avg_logprob, result.no_speech_prob):
        return None
    meta = job.metadata[p.item.index]
    window_seek = int(round(meta["offset"] * model.frames_per_second)) + p.pos
    subsegments, seek, _ = model._split_segments_by_timestamps(
        tokenizer=tok,
        tokens=tokens,
        time_offset=meta["offset"] + p.pos / model.frames_per_second,
        segment_size=p.size - p.pos,
        segment_duration=meta["duration"] - p.pos / model.frames_per_second,
        seek=p.pos,
    )
    segments = [
        {
            "text": (text := tok.decode(sub["tokens"])),
            "avg_logprob": avg_logprob,
            "no_speech_prob": result.no_speech_prob,
            "tokens": sub["tokens"],
            "start": sub["start"],
            "end": sub["end"],
            "compression_ratio": get_compression_ratio(text),
            "seek": window_seek,
            "temperature": temperature,
        }
        for sub in subsegments
        if sub["tokens"]
    ]
    return segments, seek, window_seek


def _add_words(
    model: Any,
    first: PreparedJob,
    pending: list[_Pending],
    decoded: list[tuple[_Pending, list[dict[str, Any]]]],
    unfinished: list[tuple[_Pending, int, list[dict[str, Any]]]],
    features: np.ndarray,
    encoder_output: Any,
) -> None:
    """Word timestamps for the decoded windows; unfinished ones go on from their last word."""
    options = first.options
    if len(decoded) < len(pending):  # alignment needs one encoder row per window
        rows = [n for n, p in enumerate(pending) if any(p is d for d, _ in decoded)]
        encoder_output = model.encode(features[rows])
    model.add_word_timestamps(
        [segments for _, segments in decoded],
        first.tokenizer,
        encoder_output,
        [p.size - p.pos for p, _ in decoded],
        options.prepend_punctuations,
        options.append_punctuations,
        0.0,
    )
    for p, window_frame, segments in unfinished:
        # As the sequential decoder does with words: go on from the last word's end.
        ends = [w["end"] for seg in segments for w in seg.get("words") or []]
        if ends and (pos := round(ends[-1] * model.frames_per_second) - window_frame) > p.pos:
            p.pos = min(pos, p.size)


def needs_fallback(
    options: TranscriptionOptions, avg_logprob: float, compression_ratio: float, no_speech: float
) -> bool:
    """WhisperModel.generate_with_fallback's test of one decode (silence never falls back)."""
    lp = options.log_prob_threshold
    bad = (
        options.compression_ratio_threshold is not None
        and compression_ratio > options.compression_ratio_threshold
    ) or (lp is not None and avg_logprob < lp)
    silence = (
        options.no_speech_threshold is not None
        and no_speech > options.no_speech_threshold
        and lp is not None
        and avg_logprob < lp
    )
    return bad and not silence


def is_silence(options: TranscriptionOptions, avg_logprob: float, no_speech: float) -> bool:
    """WhisperModel.generate_segments' skip: likely no speech, and not a confident decode."""
    if options.no_speech_threshold is None or no_speech <= options.no_speech_threshold:
        return False
    lp = options.log_prob_threshold
    return not (lp is not None and avg_logprob > lp)


def to_segments(window_outputs: Any, job: PreparedJob) -> Any:
    """faster-whisper Segments, numbered across windows, on the file's time line."""

    def numbered() -> Any:
        n = 0
        for window in window_outputs:
            for seg in window:
                n += 1
                yield Segment(
                    seek=seg["seek"],
                    id=n,
                    text=seg["text"],
                    start=round(seg["start"], 3),
                    end=round(seg["end"], 3),
                    words=[Word(**w) for w in seg["words"]]
                    if job.options.word_timestamps
                    else None,
                    tokens=seg["tokens"],
                    avg_logprob=seg["avg_logprob"],
                    no_speech_prob=seg["no_speech_prob"],
                    compression_ratio=seg["compression_ratio"],
                    temperature=seg.get("temperature", job.options.temperatures[0]),
                )

    return restore_speech_timestamps(numbered(), job.speech_chunks, SAMPLE_RATE)
