"""The job input's nested objects: VAD parameters, a known speaker, a split piece's seal;
the rules across its speaker options and its thresholds (``self``: the JobInput)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VadParameters(BaseModel):
    """faster_whisper.vad.VadOptions, checked field by field."""

    model_config = ConfigDict(extra="forbid")

    threshold: float | None = Field(None, ge=0, le=1)
    neg_threshold: float | None = Field(None, ge=0, le=1)
    min_speech_duration_ms: int | None = Field(None, ge=0, le=60_000)
    max_speech_duration_s: float | None = Field(None, gt=0)
    min_silence_duration_ms: int | None = Field(None, ge=0, le=60_000)
    speech_pad_ms: int | None = Field(None, ge=0, le=10_000)


class KnownSpeaker(BaseModel):
    """A name and a 2-10-s clip of that voice, to name a diarized speaker."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f<>]+$")
    audio_base64: str | None = Field(None, min_length=1)
    audio_url: str | None = Field(None, min_length=1, max_length=8192)

    @model_validator(mode="after")
    def _one_source(self) -> KnownSpeaker:
        if (self.audio_base64 is None) == (self.audio_url is None):
            raise ValueError("give exactly one of audio_base64 or audio_url")
        return self


class PieceSeal(BaseModel):
    """A split job's piece in the piece bucket: its digest, the seal's expiry (Unix
    seconds) and the seal (handler.audio.seal); set by the worker that cut it."""

    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    expires: int = Field(ge=0)
    sig: str = Field(pattern=r"^[0-9a-f]{64}$")


def speaker_rules(self: Any) -> None:
    """Who-spoke-when options that need diarize, or each other, or exclude each other."""
    given = [self.num_speakers, self.min_speakers, self.max_speakers, self.known_speakers]
    speaker_formats = {"diarized_json", "rttm"} & set(self.output)
    if not self.diarize and (any(v is not None for v in given) or speaker_formats):
        what = sorted(speaker_formats) or ["speaker options"]
        raise ValueError(f"{', '.join(what)} need diarize: true")
    if self.num_speakers is not None and (self.min_speakers or self.max_speakers):
        raise ValueError("give num_speakers or min_speakers/max_speakers, not both")
    if self.min_speakers and self.max_speakers and self.min_speakers > self.max_speakers:
        raise ValueError("min_speakers is above max_speakers")
    names = [k.name for k in self.known_speakers or []]
    if len(set(names)) != len(names):
        raise ValueError("known_speakers names must differ")
    if self.speaker_embeddings and not self.diarize:
        raise ValueError("speaker_embeddings need diarize: true")
    if self.speaker_windows and not self.diarize:
        raise ValueError("speaker_windows need diarize: true")
    if self.multichannel and self.diarize and any(v is not None for v in given[:3]):
        raise ValueError(
            "num_speakers, min_speakers, max_speakers count a recording's speakers; with "
            "multichannel each channel's are found on their own (known_speakers still name them)"
        )
    if self.multichannel and self.split not in (None, 1):
        raise ValueError(
            "multichannel labels each segment with its channel; it does not combine with "
            "split (send one job per channel)"
        )


def threshold_rules(self: Any) -> None:
    """The job's thresholds judge one recording in one language, with the VAD on."""
    given = [
        name
        for name in ("min_language_probability", "min_speech_ratio")
        if getattr(self, name) is not None
    ]
    if not given:
        return
    apart = self.multichannel or self.split not in (None, 1) or self.language == "multi"
    if apart:
        raise ValueError(
            f"{given[0]} judges one recording in one language before it is decoded; it "
            "does not combine with multichannel, split or language multi"
        )
    if self.min_speech_ratio is not None:
        if self.vad_filter is False:
            raise ValueError("min_speech_ratio measures speech with the VAD: leave it on")
        if self.clip_timestamps not in (None, "0", [0.0], []):
            raise ValueError("min_speech_ratio judges the whole recording: no clip_timestamps")


def integral(text: str) -> bool:
    """Whether a form field's text is a whole number written as a float ("4.0")."""
    try:
        number = float(text)
    except ValueError:
        return False
    return math.isfinite(number) and number == int(number)
