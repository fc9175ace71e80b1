"""Facts the worker shares with its outside: the public, dependency-free part of ``handler``.

The client (``whisper_client``), the platform emulator (``runpod_emulator``) and ``bench``
may import this module and ``handler.schema`` and nothing else of the worker (the
import-boundary test in tests/test_layout.py checks it). It imports only the standard
library, so importing it costs nothing and pulls in no model code.
"""

from __future__ import annotations

import json
from typing import Final, Literal, TypedDict, get_args

from typing_extensions import NotRequired

SAMPLE_RATE: Final = 16000
"""Samples per second of the audio every model here reads (Whisper, the VADs, CAM++)."""

MAX_CHANNELS: Final = 16
"""The most channels a ``multichannel`` job transcribes one by one (Deepgram allows 20)."""

TERMINAL_JOB_STATES: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
"""RunPod job states after which a job never changes again (``/status``)."""

OPENAI_TRANSCRIPTION_MODELS: Final = frozenset(
    {
        "whisper-1",
        "gpt-transcribe",
        "gpt-live-transcribe",
        "gpt-4o-transcribe",
        "gpt-4o-mini-transcribe",
        "gpt-4o-mini-transcribe-2025-12-15",
        "gpt-4o-transcribe-diarize",
        "gpt-realtime-whisper",
    }
)
"""OpenAI's transcription model names (its API reference and the openai SDK's
``AudioTranscription.model``, 2026-12; LiveKit's and Pipecat's defaults among them): each
one is this worker's default model, on every face. A later ``gpt-*transcribe*`` or
``gpt-*whisper*`` name is taken the same way (:func:`is_openai_model`)."""


def is_openai_model(name: str) -> bool:
    """Whether ``name`` is one of OpenAI's transcription models (now or later)."""
    n = name.lower()
    return n in OPENAI_TRANSCRIPTION_MODELS or (
        n.startswith("gpt-") and ("transcribe" in n or "whisper" in n)
    )


STARTUP_LOG_TAG: Final = "startup"
"""The word before the JSON of the worker's one start-up timing line (``startup {...}``)."""

OutputFormat = Literal[
    "text", "segments", "words", "srt", "vtt", "verbose_json", "diarized_json", "rttm"
]
"""What a job may ask for in ``output``."""
OUTPUT_FORMATS: Final[tuple[str, ...]] = get_args(OutputFormat)


def parse_startup_line(line: str) -> dict | None:
    """The JSON of a worker's start-up timing line, or None when ``line`` is not one."""
    marker = f" {STARTUP_LOG_TAG} " + "{"
    at = line.find(marker)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(marker) - 1 :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class Word(TypedDict):
    """One word with its times (seconds) and faster-whisper's probability."""

    word: str
    start: float
    end: float
    probability: float
    speaker: NotRequired[str]
    """Only in a diarized job."""
    channel: NotRequired[int]
    """Only in a ``multichannel`` job: the channel it was heard on (0 is the first)."""


class Segment(TypedDict):
    """One decoded segment: the one shape that formats, streaming and legacy keys read.

    Built from faster-whisper's ``Segment`` in ``handler.inference.transcribe``; every field but
    ``words`` is returned under ``segments`` (``words`` only when asked).
    """

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None
    speaker: NotRequired[str]
    """Only in a diarized job (handler.output.speakers)."""
    language: NotRequired[str]
    """Only with ``"language": "multi"``: the language its part was decoded in."""
    channel: NotRequired[int]
    """Only in a ``multichannel`` job: the channel it was heard on (0 is the first)."""


SEGMENT_FIELDS: Final[tuple[str, ...]] = tuple(
    k for k in Segment.__annotations__ if k not in ("words", "speaker", "language", "channel")
)
"""The fields of a returned segment, in order."""
