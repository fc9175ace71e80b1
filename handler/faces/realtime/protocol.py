"""OpenAI's Realtime transcription protocol: the session object a client configures with
``session.update`` (or the older ``transcription_session.update``) and the error events it
is answered with."""

from __future__ import annotations

import secrets
from typing import Any

from handler.audio.live import LEGACY_FORMATS, LiveDecoder
from handler.errors import WorkerError
from handler.faces.openai_api import resolve_model
from handler.inference.live_vad import TurnRules

MIN_COMMIT_S = 0.1
"""OpenAI refuses to commit less than 100 ms of audio; so does this server."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def error_event(
    message: str, code: str, kind: str = "invalid_request_error", event_id: str | None = None
) -> dict[str, Any]:
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": kind,
            "code": code,
            "message": message,
            "param": None,
            "event_id": event_id,
        },
    }


class SessionError(Exception):
    """A client event this session refuses: answered with an error event, then go on."""

    def __init__(self, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.code = code


class Config:
    """A transcription session's settings, as OpenAI's session object names them."""

    def __init__(self, loaded_models: list[str]) -> None:
        self.loaded_models = loaded_models
        self.format, self.rate = "audio/pcm", 24000
        self.model, self.prompt = "whisper-1", ""
        self.language: str | None = None
        self.turns: TurnRules | None = TurnRules()

    def session(self, session_id: str, expires_at: int) -> dict[str, Any]:
        turn = (
            None
            if self.turns is None
            else {
                "type": "server_vad",
                "threshold": self.turns.threshold,
                "prefix_padding_ms": self.turns.prefix_padding_ms,
                "silence_duration_ms": self.turns.silence_duration_ms,
            }
        )
        fmt: dict[str, Any] = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = self.rate
        return {
            "type": "transcription",
            "id": session_id,
            "object": "realtime.transcription_session",
            "expires_at": expires_at,
            "include": None,
            "audio": {
                "input": {
                    "format": fmt,
                    "noise_reduction": None,
                    "transcription": {
                        "model": self.model,
                        "language": self.language,
                        "prompt": self.prompt,
                    },
                    "turn_detection": turn,
                }
            },
        }

    def update(self, session: Any) -> None:
        """Apply ``session.update``'s session (the current shape)."""
        if not isinstance(session, dict):
            raise SessionError("session: an object")
        if session.get("type", "transcription") != "transcription":
            raise SessionError(
                "only transcription sessions are served here (intent="
                "transcription): not conversations",
                "unsupported",
            )
        if session.get("include"):
            raise SessionError(
                "include: logprobs are not served (the decoder keeps one "
                "log-probability per segment)",
                "unsupported",
            )
        audio_in = (session.get("audio") or {}).get("input") or {}
        if not isinstance(audio_in, dict):
            raise SessionError("session.audio.input: an object")
        if audio_in.get("noise_reduction") is not None:
            raise SessionError("noise_reduction is not served here", "unsupported")
        if "format" in audio_in:
            fmt = audio_in["format"] or {}
            self._format(fmt.get("type", "audio/pcm"), fmt.get("rate"))
        if "transcription" in audio_in:
            self._transcription(audio_in["transcription"] or {})
        if "turn_detection" in audio_in:
            self._turns(audio_in["turn_detection"])

    def update_legacy(self, session: Any) -> None:
        """Apply the older ``transcription_session.update`` shape."""
        if not isinstance(session, dict):
            raise SessionError("session: an object")
        if session.get("include"):
            raise SessionError("include: logprobs are not served", "unsupported")
        if "input_audio_format" in session:
            name = session["input_audio_format"]
            if name not in LEGACY_FORMATS:
                raise SessionError(f"input_audio_format: one of {', '.join(LEGACY_FORMATS)}")
            self._format(LEGACY_FORMATS[name], None)
        if "input_audio_transcription" in session:
            self._transcription(session["input_audio_transcription"] or {})
        if "turn_detection" in session:
            self._turns(session["turn_detection"])

    def _format(self, fmt: str, rate: Any) -> None:
        try:
            LiveDecoder(fmt, rate)  # validates the pair
        except WorkerError as exc:
            raise SessionError(exc.message) from None
        self.format = fmt
        self.rate = LiveDecoder(fmt, rate).rate

    def _transcription(self, t: dict[str, Any]) -> None:
        model = t.get("model", self.model)
        try:
            resolve_model(model, self.loaded_models)
        except WorkerError as exc:
            raise SessionError(exc.message, "invalid_model") from None
        language, prompt = t.get("language"), t.get("prompt") or ""
        if language is not None and not (isinstance(language, str) and 2 <= len(language) <= 8):
            raise SessionError("transcription.language: a language code such as en")
        if not isinstance(prompt, str) or len(prompt) > 2000:
            raise SessionError("transcription.prompt: a string of at most 2000 characters")
        self.model, self.language, self.prompt = model, language, prompt

    def _turns(self, td: Any) -> None:
        if td is None:
            self.turns = None
            return
        if not isinstance(td, dict) or td.get("type", "server_vad") != "server_vad":
            raise SessionError(
                "turn_detection: server_vad or null (semantic_vad is not served)", "unsupported"
            )
        rules = TurnRules()
        for name, lo, hi in (
            ("threshold", 0.0, 1.0),
            ("prefix_padding_ms", 0, 5000),
            ("silence_duration_ms", 100, 10000),
        ):
            value = td.get(name)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise SessionError(f"turn_detection.{name}: from {lo} to {hi}")
            setattr(rules, name, type(getattr(rules, name))(value))
        self.turns = rules

    def job_input(self) -> dict[str, Any]:
        job: dict[str, Any] = {"output": ["text"]}
        model = resolve_model(self.model, self.loaded_models)
        if model is not None:
            job["model"] = model
        if self.language and self.language != "multi":
            # "multi": each live turn is a part of its own, its language detected alone.
            job["language"] = self.language
        if self.prompt:
            job["initial_prompt"] = self.prompt
        return job
