"""The job input: one pydantic model that is the single list of parameters a job may set.

Accepted shapes (``job["input"]``):

- ours: ``{"audio_base64" | "audio_url": ..., "output": [...], <faster-whisper options>}``
- RunPod's official worker: ``{"audio": <url> | "audio_base64": ..., "transcription":
  "plain_text"|"formatted_text"|"srt"|"vtt", "translate": bool, "translation": ...,
  "enable_vad", "logprob_threshold", "temperature_increment_on_fallback", ...}``; the old
  names are aliases, and such a job also gets the old output keys (see ``legacy``).

Decoding options carry faster-whisper's own names. An option left unset is not passed on,
so the library's defaults apply and are not restated here.
"""

from __future__ import annotations

import json
import math
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from handler import schema_parts
from handler.contract import OutputFormat
from handler.errors import Code, WorkerError
from handler.output.cues import Layout
from handler.schema_parts import KnownSpeaker, PieceSeal, VadParameters

MAX_TEMPERATURES = 20
"""Temperatures one job may fall back through (a list or the official worker's increment)."""
MAX_CLIP_TIMESTAMPS = 200
MAX_CLIP_SECONDS = 24 * 3600.0
MAX_SPEAKERS = 20
"""The most speakers a job may ask the diarizer for."""
MAX_PIECES = 32
"""The most jobs one recording may be split into (``split``)."""
MAX_KNOWN_SPEAKERS = 10
"""Reference clips per job (OpenAI takes 4)."""
MAX_TOKEN_ID = 51865
"""The largest token id of any Whisper vocabulary (large-v3's has 51866 entries)."""

LegacyFormat = Literal["plain_text", "formatted_text", "srt", "vtt"]

DEFAULT_OUTPUT: tuple[OutputFormat, ...] = ("text", "segments")

# Names the official worker uses, mapped to ours.
ALIASES = {
    "audio": "audio_url",
    "enable_vad": "vad_filter",
    "logprob_threshold": "log_prob_threshold",
}
# Keys whose presence marks a job written for the official worker.
LEGACY_KEYS = frozenset(
    {
        "audio",
        "transcription",
        "translate",
        "translation",
        "enable_vad",
        "logprob_threshold",
        "temperature_increment_on_fallback",
    }
)


# Every input key of the official worker (runpod-workers/worker-faster_whisper's schema).
OFFICIAL_KEYS = LEGACY_KEYS | frozenset(
    {
        "audio_base64",
        "model",
        "language",
        "temperature",
        "best_of",
        "beam_size",
        "patience",
        "length_penalty",
        "suppress_tokens",
        "initial_prompt",
        "condition_on_previous_text",
        "compression_ratio_threshold",
        "no_speech_threshold",
        "word_timestamps",
    }
)


class JobInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    _raw_keys: set[str] = PrivateAttr(default_factory=set)

    # --- audio (exactly one) -------------------------------------------------------------
    audio_base64: str | None = Field(None, min_length=1)
    """Audio bytes as base64, raw or a data: URI."""
    audio_url: str | None = Field(None, min_length=1, max_length=8192)
    """http(s) URL (SSRF-guarded) or s3://bucket/key (allowlisted buckets). Alias: audio."""

    # --- what to run and return ------------------------------------------------------------
    model: str | None = Field(None, max_length=200)
    """One of the models this worker loaded; unset: the default one."""
    output: list[OutputFormat] = Field(default_factory=lambda: list(DEFAULT_OUTPUT), min_length=1)
    batch_size: int | None = Field(None, ge=1, le=128)
    """> 1 runs faster-whisper's BatchedInferencePipeline. Unset: the worker's default."""
    split: Annotated[int, Field(ge=1, le=MAX_PIECES)] | Literal["auto"] | None = None
    """Fan the recording out across the endpoint's workers as this many ordinary jobs
    (pieces cut at silences), or ``auto`` (one piece per AUTO_PIECE_S of audio); the result
    is stitched into one. Queue mode, with RUNPOD_API_KEY in the worker's environment."""
    languages: (
        list[Annotated[str, Field(min_length=2, max_length=8, pattern=r"^[a-zA-Z_-]+$")]] | None
    ) = Field(None, min_length=1, max_length=100)
    """Languages detection may pick among when ``language`` is unset (OpenAI's
    ``languages[]``); within the deployment's own WHISPER_LANGUAGES when that is set."""

    # --- speakers (the deployment must enable WHISPER_DIARIZATION) -------------------------
    diarize: bool | None = None
    """Label who spoke when: segments (split where the speaker changes) and words get
    ``speaker``; adds ``speakers``; enables the diarized_json and rttm formats."""
    num_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    min_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    max_speakers: int | None = Field(None, ge=1, le=MAX_SPEAKERS)
    known_speakers: list[KnownSpeaker] | None = Field(
        None, min_length=1, max_length=MAX_KNOWN_SPEAKERS
    )
    """Names for speakers, each with a 2-10-s reference clip of the voice."""
    speaker_embeddings: bool | None = None
    """Return each speaker's voice embedding (192 numbers, unit length) under
    ``speaker_embeddings``: to match speakers across recordings."""
    piece: PieceSeal | None = None
    """A split job's piece read from the piece bucket: the seal its parent signed (set by
    the worker; a job without a valid one cannot read that bucket)."""
    speaker_windows: bool | None = None
    """A split job's piece: return the speech windows and their voice embeddings under
    ``speaker_windows`` instead of speakers, for the whole recording to cluster."""

    multichannel: bool | None = None
    """Transcribe each channel of the recording on its own (a call's agent and customer):
    segments and words get ``channel`` (0 is the first), ``channels`` gives each channel's
    text and language, and subtitles label each cue with its channel. Unset: the channels
    are mixed down to one. Each channel costs its own transcription; a channel that
    repeats an earlier one is transcribed once."""

    profanity_filter: bool | Literal["full"] | None = None
    """Mask profane words wherever the transcript is returned (text, segments, words,
    subtitles, streams): ``true``, the first letter kept, the rest as asterisks ("s***", as
    AssemblyAI and Google do); ``"full"``, every letter ("****", Deepgram's). Checked in
    English and in the transcript's language (handler.output.profanity)."""

    redact: list[Literal["numbers", "pci", "ssn"]] | None = Field(None, max_length=3)
    """Mask numbers wherever the transcript is returned: each run of three numerals or more
    as asterisks (Deepgram's ``numbers``; ``pci`` and ``ssn`` by the same rule, a superset of
    both: handler.output.redact)."""

    min_language_probability: float | None = Field(None, ge=0, le=1)
    """Fail the job (LANGUAGE_UNCERTAIN) when the language it detects has a lower
    probability; checked once detected, before any decoding is paid for. A job that
    names its language always passes (AssemblyAI's language_confidence_threshold)."""
    min_speech_ratio: float | None = Field(None, ge=0, le=1)
    """Fail the job (TOO_LITTLE_SPEECH) when the VAD finds less of the recording speech
    than this share; checked before decoding. Needs the VAD (AssemblyAI's
    speech_threshold)."""

    loop_guard: bool | None = None
    """Repetition loops in the transcript (a phrase said back to back 4 times or more, a
    word 6 times) kept when its occurrences heard alone say it, else decoded again without
    the previous text or collapsed; ``warnings`` says where a loop was mended. Unset:
    WHISPER_LOOP_GUARD (on)."""

    # --- word times ----------------------------------------------------------------------
    word_alignment: Literal["whisper", "forced", "auto"] | None = None
    """How words are timed: ``whisper`` (its cross-attention times), ``forced`` (the
    recognised words aligned to the audio again by a forced aligner, English here),
    ``auto`` (forced where an aligner for the language is installed). Implies word
    timestamps. Unset: the deployment's WHISPER_WORD_ALIGNMENT."""

    # --- faster-whisper options (names as in WhisperModel.transcribe) ---------------------
    language: str | None = Field(None, min_length=2, max_length=8, pattern=r"^[a-zA-Z_-]+$")
    task: Literal["transcribe", "translate"] | None = None
    beam_size: int | None = Field(None, ge=1, le=20)
    best_of: int | None = Field(None, ge=1, le=20)
    patience: float | None = Field(None, ge=0.5, le=10)
    length_penalty: float | None = Field(None, ge=0, le=10)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    no_repeat_ngram_size: int | None = Field(None, ge=0, le=20)
    temperature: float | list[float] | None = None
    compression_ratio_threshold: float | None = Field(None, gt=0)
    log_prob_threshold: float | None = None
    no_speech_threshold: float | None = Field(None, ge=0, le=1)
    condition_on_previous_text: bool | None = None
    prompt_reset_on_temperature: float | None = Field(None, ge=0, le=1)
    initial_prompt: str | None = Field(None, max_length=2000)
    prefix: str | None = Field(None, max_length=500)
    suppress_blank: bool | None = None
    suppress_tokens: list[Annotated[int, Field(ge=-1, le=MAX_TOKEN_ID)]] | None = Field(
        None, max_length=2000
    )
    without_timestamps: bool | None = None
    max_initial_timestamp: float | None = Field(None, ge=0, le=30)
    word_timestamps: bool | None = None
    prepend_punctuations: str | None = Field(None, max_length=100)
    append_punctuations: str | None = Field(None, max_length=100)
    multilingual: bool | None = None
    vad_filter: bool | None = None
    """Unset: the worker's default (on). Alias: enable_vad."""
    vad_parameters: VadParameters | None = None
    max_new_tokens: int | None = Field(None, ge=1, le=448)
    chunk_length: int | None = Field(None, ge=1, le=30)
    clip_timestamps: str | list[float] | None = None
    """Seconds, start,end,start,end,...: at most MAX_CLIP_TIMESTAMPS values, in order."""
    hallucination_silence_threshold: float | None = Field(None, gt=0)
    hotwords: str | None = Field(None, max_length=1000)
    language_detection_threshold: float | None = Field(None, ge=0, le=1)
    language_detection_segments: int | None = Field(None, ge=1, le=100)

    # --- subtitle layout (the openai-whisper CLI's names) --------------------------------
    max_line_width: int | None = Field(None, ge=10, le=200)
    """Characters per subtitle line (default 42). Cues come from word timestamps, which
    are computed whenever srt or vtt is asked for."""
    max_line_count: int | None = Field(None, ge=1, le=10)
    """Lines per cue (default 2)."""
    max_cue_seconds: float | None = Field(None, ge=1, le=60)
    """Longest time one cue stays on screen (default 7 s)."""

    # --- the official worker's options ---------------------------------------------------
    transcription: LegacyFormat | None = None
    translate: bool | None = None
    translation: LegacyFormat | None = None
    temperature_increment_on_fallback: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("input must be a JSON object")
        # null means "not set" (clients of the official worker send nulls for defaults).
        data = {k: v for k, v in data.items() if v is not None}
        for old, new in ALIASES.items():
            if old in data:
                if new in data:
                    raise ValueError(f"give either '{old}' or '{new}', not both")
                data[new] = data.pop(old)
        _refuse_coercion(data)
        # The official worker's own Hub test sends "plain text"; it meant plain_text.
        for key in ("transcription", "translation"):
            if isinstance(data.get(key), str):
                data[key] = data[key].strip().lower().replace(" ", "_")
        # The official worker takes suppress_tokens as a string such as "-1" or "1,2".
        st = data.get("suppress_tokens")
        if isinstance(st, str):
            try:
                data["suppress_tokens"] = [int(t) for t in st.split(",") if t.strip()]
            except ValueError:
                raise ValueError("suppress_tokens must be integers") from None
        return data

    @field_validator("clip_timestamps", mode="after")
    @classmethod
    def _clips(cls, v: str | list[float] | None) -> list[float] | None:
        if v is None:
            return None
        if isinstance(v, str):
            parts = [p for p in v.split(",") if p.strip()]
            if len(parts) > MAX_CLIP_TIMESTAMPS:
                raise ValueError(f"at most {MAX_CLIP_TIMESTAMPS} values")
            try:
                v = [float(p) for p in parts]
            except ValueError:
                raise ValueError("must be numbers separated by commas") from None
        if not v:
            raise ValueError("give at least one value")
        if len(v) > MAX_CLIP_TIMESTAMPS:
            raise ValueError(f"at most {MAX_CLIP_TIMESTAMPS} values")
        if any(not math.isfinite(t) or not 0 <= t <= MAX_CLIP_SECONDS for t in v):
            raise ValueError(f"values must be seconds between 0 and {MAX_CLIP_SECONDS:g}")
        if any(b < a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("values must be in increasing order (start,end,start,end,...)")
        return v

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> JobInput:
        if (info.context or {}).get("audio_given"):
            # The audio came another way (an HTTP upload): no audio field may compete.
            if self.audio_base64 is not None or self.audio_url is not None:
                raise ValueError("give either the file or audio_base64/audio_url, not both")
        elif (self.audio_base64 is None) == (self.audio_url is None):
            raise ValueError("give exactly one of audio_base64 or audio_url (alias audio)")
        if self.translate is not None and self.task is not None:
            if (self.task == "translate") != self.translate:
                raise ValueError("task and translate disagree")
        temps = self.temperature if isinstance(self.temperature, list) else [self.temperature]
        if any(t is not None and not 0 <= t <= 1.5 for t in temps):
            raise ValueError("temperature must be between 0 and 1.5")
        if isinstance(self.temperature, list) and not 1 <= len(self.temperature) <= 20:
            raise ValueError("temperature list must have 1 to 20 values")
        if self.temperature_increment_on_fallback is not None:
            if isinstance(self.temperature, list):
                raise ValueError("temperature_increment_on_fallback needs a single temperature")
            n = self._temperature_count()
            if n > MAX_TEMPERATURES:
                raise ValueError(
                    f"temperature_increment_on_fallback expands to {n} temperatures; at most "
                    f"{MAX_TEMPERATURES} (use an increment of 0.05 or more)"
                )
        schema_parts.speaker_rules(self)
        schema_parts.threshold_rules(self)
        beam = self.beam_size or 5
        if self.patience is not None and beam * self.patience < 1:
            raise ValueError("beam_size x patience must be at least 1")
        return self

    @property
    def legacy(self) -> bool:
        """True for a job in the official worker's shape: it also gets that worker's keys.

        That is a job with a key only that worker uses, or one whose keys are all keys that
        worker knows (``{"audio_base64": ...}`` alone is a job its clients send)."""
        sent = self._raw_keys
        return bool(LEGACY_KEYS & self._given) or bool(sent) and sent <= OFFICIAL_KEYS

    @property
    def _given(self) -> set[str]:
        return set(self.model_fields_set) | self._raw_keys

    @property
    def effective_task(self) -> str:
        if self.translate:
            return "translate"
        return self.task or "transcribe"

    def transcribe_kwargs(self, *, vad_default: bool) -> dict[str, Any]:
        """Keyword arguments for ``WhisperModel.transcribe``: only options the job set."""
        kwargs = {
            name: getattr(self, name) for name in self.model_fields_set if name in DECODING_OPTIONS
        }
        if self.vad_parameters is not None and "vad_parameters" in kwargs:
            kwargs["vad_parameters"] = self.vad_parameters.model_dump(exclude_none=True)
        if self.effective_task != "transcribe" or "task" in kwargs:
            kwargs["task"] = self.effective_task
        if self.vad_filter is None:
            kwargs["vad_filter"] = vad_default
        if self.temperature_increment_on_fallback is not None:
            kwargs["temperature"] = self._expanded_temperatures()
        if self.wants_subtitles and self.word_timestamps is None:
            kwargs["word_timestamps"] = True  # cues are built from words
        return kwargs

    @property
    def wants_subtitles(self) -> bool:
        legacy = {self.transcription, self.translation} & {"srt", "vtt"}
        return bool({"srt", "vtt"} & set(self.output) or legacy)

    @property
    def layout(self) -> Layout:
        return Layout(
            max_line_width=self.max_line_width or 42,
            max_line_count=self.max_line_count or 2,
            max_cue_seconds=self.max_cue_seconds or 7.0,
        )

    def _fallback_start_step(self) -> tuple[float, float, int]:
        first = self.temperature if self.temperature is not None else 0.0
        start = first[0] if isinstance(first, list) else first
        step = self.temperature_increment_on_fallback or 1.0
        ratio = (1.0 - start) / step if start < 1.0 else 0.0
        # A subnormal step (5e-324, found by hypothesis) makes the ratio infinite: count it
        # as "far too many", which the temperature rule refuses as INVALID_INPUT.
        n = int(round(ratio)) if math.isfinite(ratio) and ratio < 1e9 else 10**9
        return start, step, n

    def _temperature_count(self) -> int:
        """How many temperatures the official worker's increment gives, without building them."""
        return self._fallback_start_step()[2] + 1

    def _expanded_temperatures(self) -> list[float]:
        """The official worker's temperature, +step, ... up to 1.0 (validated count)."""
        start, step, n = self._fallback_start_step()
        return [round(start + i * step, 6) for i in range(n + 1)]


# Options passed straight to WhisperModel.transcribe (tests check each is a real parameter).
DECODING_OPTIONS: frozenset[str] = frozenset(
    name
    for name in JobInput.model_fields
    if name
    not in {
        "audio_base64",
        "audio_url",
        "model",
        "output",
        "batch_size",
        "languages",
        "transcription",
        "translate",
        "translation",
        "temperature_increment_on_fallback",
        "max_line_width",
        "max_line_count",
        "max_cue_seconds",
        "diarize",
        "num_speakers",
        "min_speakers",
        "max_speakers",
        "known_speakers",
        "speaker_embeddings",
        "speaker_windows",
        "piece",
        "split",
        "word_alignment",
        "loop_guard",
        "multichannel",
        "profanity_filter",
        "redact",
        "min_language_probability",
        "min_speech_ratio",
    }
)


def _scalar_kinds() -> dict[str, tuple[type, frozenset[str]]]:
    """Each field that takes a bool, an int or a float: that type, and the strings its
    type also allows (``split``'s ``"auto"``)."""

    def flat(t: Any) -> list[Any]:
        origin = get_origin(t)
        if origin is Annotated:
            return flat(get_args(t)[0])
        if origin in (Union, types.UnionType):
            return [x for a in get_args(t) for x in flat(a)]
        return [t]

    kinds: dict[str, tuple[type, frozenset[str]]] = {}
    for name, info in JobInput.model_fields.items():
        parts = flat(info.annotation)
        literals = frozenset(
            v for p in parts if get_origin(p) is Literal for v in get_args(p) if isinstance(v, str)
        )
        for kind in (bool, int, float):
            if kind in parts and str not in parts:
                kinds[name] = (kind, literals)
                break
    return kinds


def _refuse_coercion(data: dict[str, Any]) -> None:
    """A JSON job's booleans and numbers come as JSON booleans and numbers: ``"split": true``
    would run unsplit and ``"num_speakers": "2"`` or ``true`` pass as 2 or 1, so each is
    refused by its field's name (HTTP form fields are typed first: :func:`typed_form`)."""
    for name, value in data.items():
        kind, literals = SCALAR_KINDS.get(name, (None, frozenset()))
        if kind is None or (isinstance(value, str) and value in literals):
            continue
        if isinstance(value, str) or (isinstance(value, bool) and kind is not bool):
            want = {bool: "true or false", int: "an integer", float: "a number"}[kind]
            want += "".join(f' or "{lit}"' for lit in sorted(literals))
            raise ValueError(f"{name}: {want}, not {json.dumps(value)}")


def typed_form(fields: dict[str, Any]) -> dict[str, Any]:
    """HTTP form fields (always text) as the job's types: ``"true"``/``"false"`` for a
    bool, digits for an int, a number for a float; text that is none of these is left as
    is, for the schema to refuse by the field's name."""
    out = dict(fields)
    for name, value in fields.items():
        if name in TEXT_LISTS and isinstance(value, str):
            out[name] = [part.strip() for part in value.split(",")]  # output=srt,vtt
            continue
        # The official worker's names (enable_vad, logprob_threshold) as what they alias.
        kind, literals = SCALAR_KINDS.get(ALIASES.get(name, name), (None, frozenset()))
        if kind is None or not isinstance(value, str) or value in literals:
            continue
        text = value.strip().lower()
        if kind is bool and text in ("true", "1", "false", "0"):
            out[name] = text in ("true", "1")
        elif kind is int and text.lstrip("-").isdigit():
            out[name] = int(text)
        elif kind is int and schema_parts.integral(text):
            out[name] = int(float(text))  # "4.0", as a JSON job's 4.0 is taken
        elif kind is float:
            try:
                out[name] = float(text)
            except ValueError:
                pass
    return out


SCALAR_KINDS = _scalar_kinds()
TEXT_LISTS = frozenset({"output", "languages", "redact"})
"""Fields that take a list of names: one form field may give them comma-separated."""


def parse_job_input(data: Any, *, audio_given: bool = False) -> JobInput:
    """Validate ``job["input"]`` (``audio_given``: its audio comes beside it, an HTTP
    upload); any problem becomes INVALID_INPUT naming field and rule."""
    try:
        job = JobInput.model_validate(data, context={"audio_given": audio_given})
    except ValidationError as exc:
        raise WorkerError(Code.INVALID_INPUT, _describe(exc)) from None
    if isinstance(data, dict):
        job._raw_keys = set(data)
    return job


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "input"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "invalid input: " + "; ".join(parts)
