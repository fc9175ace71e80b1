"""OpenAI's Realtime transcription protocol: the session object a client configures with
``session.update`` (or the older ``transcription_session.update``) and the error events it
is answered with."""

from __future__ import annotations

import copy
import dataclasses
import secrets
from typing import Any

from handler.audio.live import LEGACY_FORMATS, LiveDecoder
from handler.errors import WorkerError
from handler.faces.openai_api import resolve_model
from handler.inference import align, language
from handler.inference.live_vad import TurnRules
from handler.inference.models import ModelPool
from handler.inference.speakers.online import MAX_SPEAKERS as MAX_LIVE_SPEAKERS
from handler.output import redact
from handler.settings import Settings

MIN_COMMIT_S = 0.1
"""OpenAI refuses to commit less than 100 ms of audio; so does this server."""
MAX_EVENT_DEPTH = 16
"""The deepest nesting of brackets an event may have (OpenAI's events nest 5 deep): deeper
JSON is refused before it is parsed, and the session closed (1008)."""
NOISE_REDUCTION = (None, "near_field", "far_field")
"""``noise_reduction.type`` values a client may send: accepted, none applied (no denoiser
was measured to help Whisper's WER here: docs/http.md), and said so in session.updated."""
DELAYS = ("minimal", "low", "medium", "high", "xhigh")
"""``transcription.delay`` (OpenAI's gpt-realtime-whisper): accepted; interim text here
comes at its own cadence (INTERIM_EVERY_S)."""
LOGPROBS = "item.input_audio_transcription.logprobs"
"""The ``include`` name that asks each delta and completed transcript for its ``logprobs``."""
SEMANTIC_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 500}
"""``semantic_vad`` served as server VAD: its eagerness as the silence that ends a turn."""
MAX_KEYWORDS_CHARS = 1000


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


def failed_event(item_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """A committed turn whose decode failed (OpenAI's ``...transcription.failed``)."""
    error = {"type": "transcription_error", "param": None}
    error |= {"code": result["error_code"], "message": result["error"]}
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": 0,
        "error": error,
    }


class SessionError(Exception):
    """A client event this session refuses: answered with an error event, then go on."""

    def __init__(self, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.code = code


class Config:
    """A transcription session's settings, as OpenAI's session object names them.

    ``update``/``update_legacy`` validate a whole ``session.update`` and return a new
    Config: a refused update changes nothing (not the rate, not the model)."""

    def __init__(self, pool: ModelPool, settings: Settings) -> None:
        self.pool, self.settings = pool, settings
        self.format, self.rate = "audio/pcm", 24000
        self.model, self.prompt = "whisper-1", ""
        self.language: str | None = None
        self.languages: list[str] | None = None
        self.keywords: list[str] | None = None
        self.turns: TurnRules | None = TurnRules()
        self.word_alignment: str | None = None
        """Our extension: completed transcripts carry their timed ``words``."""
        self.profanity_filter: bool | str = False
        """Our extension: profane words masked in deltas and transcripts alike."""
        self.redact: list[str] | None = None
        """Our extension: numbers masked in deltas and transcripts (handler.output.redact)."""
        self.logprobs = False
        """OpenAI's ``include: ["item.input_audio_transcription.logprobs"]``."""
        self.diarize = False
        """Our extension: each completed transcript names its ``speaker`` (a number from
        0, the same for the same voice all session long); Deepgram's ``diarize`` and
        AssemblyAI's ``speaker_labels`` (handler.inference.speakers.online)."""
        self.max_speakers: int | None = None

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
            "include": [LOGPROBS] if self.logprobs else None,
            "audio": {
                "input": {
                    "format": fmt,
                    "noise_reduction": None,  # none applied (NOISE_REDUCTION)
                    "transcription": {
                        "model": self.model,
                        "language": self.language,
                        "languages": self.languages,
                        "keywords": self.keywords,
                        "prompt": self.prompt,
                        **({"word_alignment": self.word_alignment} if self.word_alignment else {}),
                        **(
                            {"profanity_filter": self.profanity_filter}
                            if self.profanity_filter
                            else {}
                        ),
                        **({"redact": self.redact} if self.redact else {}),
                    },
                    "turn_detection": turn,
                }
            },
        }

    def update(self, session: Any) -> Config:
        """``session.update``'s session (the current shape), applied to a copy."""
        session = _object(session, "session")
        if session.get("type", "transcription") != "transcription":
            raise SessionError(
                "only transcription sessions are served here (intent="
                "transcription): not conversations",
                "unsupported",
            )
        logprobs = _include(session.get("include"), self.logprobs)
        audio = _object(session.get("audio"), "session.audio")
        audio_in = _object(audio.get("input"), "session.audio.input")
        _noise(audio_in.get("noise_reduction"), "session.audio.input.noise_reduction")
        new = copy.copy(self)
        new.logprobs = logprobs
        if "format" in audio_in:
            new._format(audio_in["format"], "session.audio.input.format")
        if "transcription" in audio_in:
            t = _object(audio_in["transcription"], "session.audio.input.transcription")
            new._transcription(t, "session.audio.input.transcription")
        if "turn_detection" in audio_in:
            new._turns(audio_in["turn_detection"], "session.audio.input.turn_detection")
        return new

    def with_transcription(self, **changes: Any) -> Config:
        """A copy with these transcription fields changed (``keywords``, ``prompt``,
        ``languages``: ``[]`` for none, ``profanity_filter``), checked as an update is; the
        rest of the config as it is (the live faces' own configure messages)."""
        transcription = {
            "model": self.model,
            "language": self.language,
            "languages": self.languages,
            "keywords": self.keywords,
            "prompt": self.prompt,
            "word_alignment": self.word_alignment,
        }
        transcription |= changes
        return self.update(
            {"type": "transcription", "audio": {"input": {"transcription": transcription}}}
        )

    def with_turns(self, **rules: Any) -> Config:
        """A copy whose server VAD rules have these values (a live face's own configure
        message: its thresholds, checked by the face)."""
        new = copy.copy(self)
        if self.turns is not None:
            new.turns = dataclasses.replace(self.turns, **rules)
        return new

    def update_legacy(self, session: Any) -> Config:
        """The older ``transcription_session.update`` shape, applied to a copy."""
        session = _object(session, "session")
        logprobs = _include(session.get("include"), self.logprobs)
        _noise(session.get("input_audio_noise_reduction"), "session.input_audio_noise_reduction")
        new = copy.copy(self)
        new.logprobs = logprobs
        if "input_audio_format" in session:
            new._format(session["input_audio_format"], "session.input_audio_format")
        if "input_audio_transcription" in session:
            where = "session.input_audio_transcription"
            new._transcription(_object(session["input_audio_transcription"], where), where)
        if "turn_detection" in session:
            new._turns(session["turn_detection"], "session.turn_detection")
        return new

    def _format(self, fmt: Any, where: str) -> None:
        if isinstance(fmt, str):  # the older shape's names, or a bare type
            kind, rate = LEGACY_FORMATS.get(fmt, fmt), None
        else:
            fmt = _object(fmt, where)
            kind, rate = fmt.get("type", "audio/pcm"), fmt.get("rate")
        if not isinstance(kind, str) or (rate is not None and type(rate) is not int):
            raise SessionError(f"{where}: {{type: audio/pcm | audio/pcmu | audio/pcma, rate}}")
        try:
            decoder = LiveDecoder(kind, rate)  # validates the pair
        except WorkerError as exc:
            raise SessionError(f"{where}: {exc.message}") from None
        self.format, self.rate = kind, decoder.rate

    def _speakers(self, t: dict[str, Any], where: str) -> None:
        """``diarize`` and ``max_speakers``, checked (applied with the rest: a refused
        update changes nothing, and a session's speakers are set before its audio)."""
        diarize = t.get("diarize", self.diarize)
        if type(diarize) is not bool:
            raise SessionError(f"{where}.diarize: true or false")
        if diarize and not self.settings.diarization:
            raise SessionError(
                f"{where}.diarize: speaker labels need a worker with speaker diarization "
                "(the image built with DIARIZATION=true, WHISPER_DIARIZATION=true)",
                "unsupported",
            )
        most = t.get("max_speakers", self.max_speakers)
        if most is not None and (type(most) is not int or not 1 <= most <= MAX_LIVE_SPEAKERS):
            raise SessionError(f"{where}.max_speakers: from 1 to {MAX_LIVE_SPEAKERS}")
        self.diarize, self.max_speakers = diarize, most

    def _redaction(self, t: dict[str, Any], where: str) -> None:
        kinds = t.get("redact", self.redact)
        if kinds is not None and not (
            isinstance(kinds, list) and 1 <= len(kinds) <= 3 and set(kinds) <= set(redact.KINDS)
        ):
            raise SessionError(f"{where}.redact: a list of {', '.join(redact.KINDS)}")
        self.redact = kinds

    def _transcription(self, t: dict[str, Any], where: str) -> None:
        model = t.get("model", self.model)
        try:
            resolve_model(model, self.pool.names)
        except WorkerError as exc:
            raise SessionError(f"{where}.model: {exc.message}", "invalid_model") from None
        lang, langs = t.get("language"), _strings(t.get("languages"), f"{where}.languages", 100)
        if lang is not None and not (isinstance(lang, str) and 2 <= len(lang) <= 8):
            raise SessionError(f"{where}.language: a language code such as en")
        keywords = _strings(t.get("keywords"), f"{where}.keywords", 100)
        if keywords and len(", ".join(keywords)) > MAX_KEYWORDS_CHARS:
            raise SessionError(f"{where}.keywords: at most {MAX_KEYWORDS_CHARS} characters")
        prompt = t.get("prompt") or ""
        if not isinstance(prompt, str) or len(prompt) > 2000:
            raise SessionError(f"{where}.prompt: a string of at most 2000 characters")
        if t.get("delay") not in (None, *DELAYS):
            raise SessionError(f"{where}.delay: one of {', '.join(DELAYS)}")
        timing = t.get("word_alignment", self.word_alignment)
        if timing not in (None, *align.METHODS):
            raise SessionError(f"{where}.word_alignment: one of {', '.join(align.METHODS)}")
        masked = t.get("profanity_filter", self.profanity_filter)
        if type(masked) is not bool and masked != "full":
            raise SessionError(f'{where}.profanity_filter: true, false or "full"')
        self._speakers(t, where)
        self._redaction(t, where)
        if lang is None and langs and len(langs) == 1:
            lang = langs[0]  # detection among one language is that language
        self._languages_served(model, lang, langs, where)
        self.profanity_filter = masked
        self.model, self.language, self.languages = model, lang, langs or None
        self.keywords, self.prompt = keywords or None, prompt
        self.word_alignment = timing

    def _languages_served(
        self, model: str, lang: str | None, langs: list[str] | None, where: str
    ) -> None:
        """Refused now, as a file job would be, not turn after turn: a language the
        model does not know, or a list of which the deployment allows none."""
        loaded = self.pool.get(resolve_model(model, self.pool.names))
        kwargs = {"language": lang} if lang else {}
        try:
            language.plan(loaded, kwargs, None, self.settings.languages, langs or None)
        except WorkerError as exc:
            field = "language" if lang and lang in exc.message else "languages"
            raise SessionError(f"{where}.{field}: {exc.message}") from None

    def _turns(self, td: Any, where: str) -> None:
        if td is None:
            self.turns = None
            return
        td = _object(td, where)
        kind = td.get("type", "server_vad")
        rules = TurnRules()
        if kind == "semantic_vad":
            eagerness = td.get("eagerness", "auto")
            if eagerness not in SEMANTIC_SILENCE_MS:
                raise SessionError(f"{where}.eagerness: one of {', '.join(SEMANTIC_SILENCE_MS)}")
            rules.silence_duration_ms = SEMANTIC_SILENCE_MS[eagerness]
            self.turns = rules
            return
        if kind != "server_vad":
            raise SessionError(f"{where}.type: server_vad, semantic_vad or null")
        for name, lo, hi in (
            ("threshold", 0.0, 1.0),
            ("prefix_padding_ms", 0, 5000),
            ("silence_duration_ms", 100, 10000),
        ):
            value = td.get(name)
            if value is None:
                continue
            if type(value) not in (int, float) or not lo <= value <= hi:
                raise SessionError(f"{where}.{name}: from {lo} to {hi}")
            setattr(rules, name, type(getattr(rules, name))(value))
        self.turns = rules

    def job_input(self) -> dict[str, Any]:
        job: dict[str, Any] = {"output": ["text"]}
        model = resolve_model(self.model, self.pool.names)
        if model is not None:
            job["model"] = model
        if self.language and self.language != "multi":
            # "multi": each live turn is a part of its own, its language detected alone.
            job["language"] = self.language
        elif self.languages and not self.language:
            job["languages"] = self.languages
        if self.prompt:
            job["initial_prompt"] = self.prompt
        if self.keywords:
            job["hotwords"] = ", ".join(self.keywords)
        if self.word_alignment:
            # Whisper's own word times come only with word_timestamps (a session that asked
            # for them got an empty list before: found through handler.faces.deepgram).
            job["word_alignment"] = self.word_alignment
        if self.word_alignment or self.logprobs:
            job["word_timestamps"] = True
            job["output"] = ["text", "words"]
        if self.profanity_filter:
            job["profanity_filter"] = self.profanity_filter
        if self.redact:
            job["redact"] = self.redact
        return job


def _object(value: Any, where: str) -> dict[str, Any]:
    """An object field (absent or null: empty); another shape is refused by its name."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SessionError(f"{where}: an object, not {type(value).__name__}")
    return value


def _strings(value: Any, where: str, most: int) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > most:
        raise SessionError(f"{where}: a list of at most {most} strings")
    if not all(isinstance(v, str) and 0 < len(v) <= 100 for v in value):
        raise SessionError(f"{where}: strings of 1-100 characters")
    return list(value)


def _include(value: Any, before: bool) -> bool:
    """``include``: whether each delta and completed transcript carries its ``logprobs``
    (OpenAI's ``item.input_audio_transcription.logprobs``; one per word, as the file route
    gives them: handler.faces.openai_api.logprobs). Other names are taken and change nothing;
    absent, the session's choice stands."""
    if value is None:
        return before
    if not (isinstance(value, list) and all(isinstance(v, str) and len(v) <= 200 for v in value)):
        raise SessionError("session.include: a list of strings")
    return LOGPROBS in value


def _noise(value: Any, where: str) -> None:
    kind = _object(value, where).get("type") if value is not None else None
    if kind not in NOISE_REDUCTION:
        raise SessionError(f"{where}.type: near_field, far_field, or null for none")


def event_depth(text: str) -> int:
    """How deep the brackets of a JSON text nest, strings skipped (before it is parsed:
    a 200,000-deep array is a few hundred kilobytes). Audio chunks hold no brackets, so
    most events are passed by counting them."""
    if (opened := text.count("[") + text.count("{")) <= MAX_EVENT_DEPTH:
        return opened
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_EVENT_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest
