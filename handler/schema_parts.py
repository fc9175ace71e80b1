"""The job input's nested objects: VAD parameters, a known speaker, a split piece's seal."""

from __future__ import annotations

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
