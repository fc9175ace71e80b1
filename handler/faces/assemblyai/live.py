"""AssemblyAI's streaming protocol (Universal-Streaming, v3) on ``/v3/ws``: a live session of
handler.faces.realtime (the same audio buffer, server VAD, interim agreement, turn order,
bounds and send guard) spoken in AssemblyAI's messages, for AssemblyAI's SDK and the
voice-agent frameworks' AssemblyAI services (Pipecat's ``AssemblyAISTTService``).

The connection's query configures it: ``encoding`` (``pcm_s16le`` with ``sample_rate``,
or ``pcm_mulaw`` at 8 kHz), ``speech_model`` (a model loaded here by name; any other name
is this worker's model), ``language_code``, ``language_detection``, ``keyterms_prompt``
(a JSON list: hotwords), ``prompt``, ``format_turns``, ``min_turn_silence`` (ms of silence
that end a turn, at least ``TURN_SILENCE_FLOOR_MS``; its older name
``min_end_of_turn_silence_when_confident`` too), ``max_turn_silence`` (the silence that ends
a turn when ``end_of_turn_confidence_threshold`` is 1, the setting that turns AssemblyAI's
semantic end of turn off), ``vad_threshold`` and ``speaker_labels`` with ``max_speakers``
(each turn's end names its voice: handler.faces.realtime.voices). Other options are taken
as sent, but for what cannot be served, which refuses the connection: ``webhook_url``,
``llm_gateway``,
``redact_pii`` with a policy that is not numbers (number policies are served as on files:
every partial and final turn masked, ``#`` for each character), and containers (``opus``,
``aac``).

The client sends binary PCM and ``ForceEndpoint`` (the turn under way ends now),
``UpdateConfiguration`` (the turn options, ``vad_threshold``, ``keyterms_prompt``, ``prompt``,
``language_codes``, ``filter_profanity``, ``format_turns``), ``KeepAlive``
and ``Terminate`` (the rest is transcribed, then ``Termination``, then a close). The server
sends ``Begin``, ``SpeechStarted``, ``Turn`` messages (partials while a turn is spoken: the
words two decodes agree on, lower case and timed, ``end_of_turn: false``; then the turn's
end, its
``words`` timed on the stream's clock in ms, unformatted; then with ``format_turns`` the
same turn formatted, ``turn_is_formatted: true``; with ``language_detection`` a turn's end
carries its ``language_code`` and ``language_confidence``), ``Termination`` and ``Error``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.websockets import WebSocketDisconnect

from handler.contract import SAMPLE_RATE
from handler.faces.assemblyai.request import Refused, language_of, number_redaction
from handler.faces.assemblyai.shape import sub as hashes
from handler.faces.realtime.binary import QueryAudioSession, query_number
from handler.faces.realtime.item import LiveItem
from handler.faces.realtime.protocol import MAX_KEYWORDS_CHARS, MIN_COMMIT_S, SessionError
from handler.inference.speakers.online import MAX_SPEAKERS
from handler.inference.speakers.turns import letter
from handler.output.formats import plain, whole_words

TURN_SILENCE_FLOOR_MS = 300
"""The shortest silence that ends a turn (as the Deepgram face's endpointing floor: Whisper
needs whole phrases; its measurements are in handler.faces.deepgram.live)."""
DEFAULT_SILENCE_MS = 400
"""``min_turn_silence`` when none is asked (AssemblyAI's default when confident)."""
DEFAULT_MAX_SILENCE_MS = 1280
"""``max_turn_silence`` when none is asked (AssemblyAI's default)."""
REFUSED = {
    "webhook_url": "a streaming webhook is not served here",
    "llm_gateway": "an LLM run on the turns is not served here",
}
MAX_TERMS = 100
MAX_PROMPT_CHARS = 2000
INPUT_ERROR = 3006
"""AssemblyAI's close code (and ``error_code``) for a request it cannot serve as sent."""


def _flag(params: Any, name: str) -> bool | None:
    value = params.get(name)
    if value is None:
        return None
    if value.lower() not in ("true", "false"):
        raise SessionError(f"{name}: true or false", "invalid_query")
    return value.lower() == "true"


def _truthy(params: Any, name: str) -> bool:
    """A flag as AssemblyAI's streaming reads it: true, 1 or yes (false, 0 or no)."""
    value = (params.get(name) or "false").lower()
    if value not in ("true", "1", "yes", "false", "0", "no"):
        raise SessionError(f"{name}: true or false", "invalid_query")
    return value in ("true", "1", "yes")


def _terms(value: Any, name: str) -> list[str] | None:
    """A list of hotwords (a JSON list in the query; a list in a message), bounded as the
    live config bounds them, so the refusal names AssemblyAI's option and not ours."""
    if value is None:
        return None
    try:
        terms = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        terms = None
    if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
        raise SessionError(f"{name}: a JSON list of words or phrases", "invalid_query")
    if len(terms) > MAX_TERMS or len(", ".join(terms)) > MAX_KEYWORDS_CHARS:
        raise SessionError(
            f"{name}: at most {MAX_TERMS} terms, {MAX_KEYWORDS_CHARS} characters in all",
            "invalid_query",
        )
    return terms


def _prompt(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise SessionError(
            f"prompt: text of at most {MAX_PROMPT_CHARS} characters", "invalid_query"
        )
    return value


def _format(params: Any) -> dict[str, Any]:
    encoding = params.get("encoding") or "pcm_s16le"
    rate = query_number(params, "sample_rate", 8000, 48000)
    if encoding == "pcm_s16le":
        if rate is None:
            raise SessionError("sample_rate: required with pcm_s16le", "invalid_query")
        return {"type": "audio/pcm", "rate": int(rate)}
    if encoding == "pcm_mulaw":
        if rate not in (None, 8000):
            raise SessionError("sample_rate: pcm_mulaw is served at 8000 Hz", "invalid_query")
        return {"type": "audio/pcmu"}
    raise SessionError(
        "encoding: send raw audio, pcm_s16le with its sample_rate or pcm_mulaw "
        "(opus, ogg_opus and aac are not served live)",
        "unsupported_encoding",
    )


TURN_OPTIONS = (
    "min_turn_silence",
    "min_end_of_turn_silence_when_confident",
    "max_turn_silence",
    "end_of_turn_confidence_threshold",
    "vad_threshold",
)
"""The options that set the turns (the query's, changed by ``UpdateConfiguration``)."""


def _turns(params: Any) -> dict[str, Any]:
    """OpenAI's server VAD for AssemblyAI's turn silences."""
    low = query_number(params, "min_turn_silence", 0, 10_000)
    if low is None:
        low = query_number(params, "min_end_of_turn_silence_when_confident", 0, 10_000)
    high = query_number(params, "max_turn_silence", 0, 10_000)
    semantic = query_number(params, "end_of_turn_confidence_threshold", 0, 1)
    if semantic is not None and semantic >= 1:  # AssemblyAI's own end of turn is off
        silence = high if high is not None else DEFAULT_MAX_SILENCE_MS
    else:
        silence = low if low is not None else DEFAULT_SILENCE_MS
        if high is not None:
            silence = min(silence, high)
    turns: dict[str, Any] = {
        "type": "server_vad",
        "silence_duration_ms": int(max(TURN_SILENCE_FLOOR_MS, silence)),
    }
    threshold = query_number(params, "vad_threshold", 0, 1)
    if threshold is not None:
        turns["threshold"] = threshold
    return turns


def configure(params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI's session object, AssemblyAI's own options) from the connection's query."""
    for name, why in REFUSED.items():
        value = params.get(name)
        if value and value.lower() not in ("false", "0", "", "null", "{}"):
            raise SessionError(f"{name}: {why}", "unsupported")
    model = params.get("speech_model") or ""
    codes = _terms(params.get("language_codes"), "language_codes")
    code = params.get("language_code")
    transcription: dict[str, Any] = {
        "model": model if model in loaded else "whisper-1",
        "language": language_of(code) if code and not _flag(params, "language_detection") else None,
        "word_alignment": "whisper",
    }
    if codes and transcription["language"] is None:
        transcription["languages"] = sorted({language_of(c) for c in codes})
    terms = _terms(params.get("keyterms_prompt"), "keyterms_prompt")
    if terms:
        transcription["keywords"] = terms
    if prompt := _prompt(params.get("prompt")):
        transcription["prompt"] = prompt
    if _truthy(params, "filter_profanity"):
        transcription["profanity_filter"] = True  # partial and final turns alike
    if _truthy(params, "redact_pii"):  # numbers, as on files; partial turns too
        transcription["redact"] = _redaction(params)
    if _truthy(params, "speaker_labels"):
        transcription["diarize"] = True  # each turn's end names its speaker
        most = query_number(params, "max_speakers", 1, MAX_SPEAKERS)
        if most is not None and most != int(most):
            raise SessionError(
                f"max_speakers: a whole number from 1 to {MAX_SPEAKERS}", "invalid_query"
            )
        if most is not None:
            transcription["max_speakers"] = int(most)
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": _format(params),
                "transcription": transcription,
                "turn_detection": _turns(params),
            }
        },
    }
    options = {
        "turns": {name: params[name] for name in TURN_OPTIONS if params.get(name) is not None},
        "hashed": "redact" in transcription,
        "format_turns": bool(_flag(params, "format_turns")),
        "language_detection": bool(_flag(params, "language_detection")),
    }
    return session, options


def _redaction(params: Any) -> list[str]:
    """``redact_pii`` with ``redact_pii_policies`` (a JSON list, as the SDK sends it) and
    ``redact_pii_sub``: the job's ``redact`` (numbers), or the refusal files get."""
    try:
        policies = json.loads(params.get("redact_pii_policies") or "null")
    except ValueError:
        policies = None
    try:
        return number_redaction(policies, params.get("redact_pii_sub"))
    except Refused as exc:
        raise SessionError(str(exc), "invalid_query") from None


def error_message(message: str, code: int = INPUT_ERROR) -> dict[str, Any]:
    """AssemblyAI's ``Error`` message."""
    return {"type": "Error", "error_code": code, "error": message}


def unformatted(words: list[str]) -> str:
    """A turn's words as AssemblyAI's unformatted transcript: lower case, no punctuation."""
    return " ".join(p for p in (plain(w) for w in words) if p)


class AssemblyAISession(QueryAudioSession):
    """One ``/v3/ws`` WebSocket: a live session answered in AssemblyAI's messages."""

    refused_close = INPUT_ERROR
    names = {
        "transcription.language": "language_code",
        "transcription.languages": "language_codes",
        "transcription.model": "speech_model",
        "transcription.keywords": "keyterms_prompt",
        "transcription.prompt": "prompt",
        "transcription.diarize": "speaker_labels",
        "format": "encoding",
        "turn_detection.threshold": "vad_threshold",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interims: dict[str, str] = {}
        self.orders: dict[str, int] = {}
        """Each turn's ``turn_order``, given when its first message is sent."""
        self.next_order = 0

    @staticmethod
    def refusal(message: str, code: str) -> dict[str, Any]:
        return error_message(message)

    @staticmethod
    def subprotocol(offered: list[str]) -> str | None:
        return None

    def configure(self, params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        return configure(params, loaded)

    async def opening(self) -> None:
        expires = int(time.time() + self.settings.realtime_max_session_s)
        await self.send_json({"type": "Begin", "id": self.id, "expires_at": expires})

    async def dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "KeepAlive":
            return
        if kind == "ForceEndpoint":
            await self._force_endpoint()
        elif kind == "UpdateConfiguration":
            self._update(event)
        elif kind == "Terminate":
            await self._terminate()
        else:
            raise SessionError(f"unknown message type {kind[:80]!r}", "unknown_message")

    async def _force_endpoint(self) -> None:
        """The turn under way ends now (nothing happens when none is)."""
        if self.turn is not None and len(self.audio) >= MIN_COMMIT_S * SAMPLE_RATE:
            await self.commit(self.audio.received_ms)
            self.detector.speaking = False

    def _update(self, event: dict[str, Any]) -> None:
        """``UpdateConfiguration``, checked whole before anything changes: the turn options
        (``min_turn_silence``, ``max_turn_silence``, ``end_of_turn_confidence_threshold``,
        ``vad_threshold``: the turn under way goes on under them), ``keyterms_prompt``,
        ``prompt``, ``language_codes`` and ``filter_profanity`` replace the session's (null
        keeps them); ``format_turns`` switches formatted turns; the rest is taken."""
        changed = {name: event[name] for name in TURN_OPTIONS if event.get(name) is not None}
        turns = _turns(self.options["turns"] | changed)
        terms = _terms(event.get("keyterms_prompt"), "keyterms_prompt")
        prompt = _prompt(event.get("prompt"))
        codes = _terms(event.get("language_codes"), "language_codes")
        languages = sorted({language_of(c) for c in codes}) if codes is not None else None
        masked = event.get("filter_profanity")
        if masked is not None and not isinstance(masked, bool):
            raise SessionError("filter_profanity: true or false", "invalid_message")
        given: dict[str, Any] = {"keywords": terms, "prompt": prompt, "languages": languages}
        given["profanity_filter"] = masked
        config = self.config
        if fields := {k: v for k, v in given.items() if v is not None}:
            try:
                config = config.with_transcription(**fields)
            except SessionError as exc:  # named as the client names it
                raise SessionError(self.renamed(str(exc)), exc.code) from None
        self.config = config
        if changed:
            self.options["turns"] |= changed
            del turns["type"]
            self.retune(**turns)
        if event.get("format_turns") is not None:
            self.options["format_turns"] = bool(event["format_turns"])

    async def _terminate(self) -> None:
        await self._force_endpoint()
        pending = {t for t in self.finals | self.tasks if not t.done()}
        if pending:
            await asyncio.wait(pending)
        await self.send_json(
            {
                "type": "Termination",
                "audio_duration_seconds": round(self.audio.received_ms / 1000),
                "session_duration_seconds": round(time.monotonic() - self.started),
            }
        )
        self.closing = True
        try:
            await self.ws.close(code=1000)
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client closed first

    def _partial_words(self, item: str, count: int) -> list[dict[str, Any]]:
        """The turn's agreed words so far, timed on the stream's clock (what LiveKit's
        AssemblyAI plugin builds its interim text from)."""
        timed, offset = self.partial(item, count)
        return [self._word(w, offset, self.audio.received_ms, False) for w in timed]

    async def send(self, event: dict[str, Any]) -> None:
        """OpenAI's events of the session, as AssemblyAI's messages (most have none)."""
        kind, item = event["type"], event.get("item_id", "")
        if kind == "input_audio_buffer.speech_started":
            await self.send_json({"type": "SpeechStarted", "timestamp": event["audio_start_ms"]})
        elif kind == "conversation.item.input_audio_transcription.delta":
            self.interims[item] = self.interims.get(item, "") + event["delta"]
            said = self.interims[item].split()
            words = self._partial_words(item, len(said))
            text = unformatted(said)
            await self.send_json(self._turn(item, text, words, end=False, formatted=False))
        elif kind == "conversation.item.input_audio_transcription.failed":
            self._forget(item)
            await self.send_json(error_message(event["error"]["message"], 3005))
        elif kind == "error":
            await self.send_json(error_message(event["error"]["message"]))

    async def send_final(self, turn: LiveItem, completed: dict[str, Any]) -> None:
        item = turn.item_id
        result = self.results.get(item) or {}
        self._forget(item)
        text = completed["transcript"].strip()
        if not text and item not in self.orders:
            return  # no words were heard, none were said: AssemblyAI sends no turn
        end_ms = turn.audio_from_ms + round(completed["usage"]["seconds"] * 1000)
        timed = whole_words(result.get("words", [])) if text else []

        def words(formatted: bool) -> list[dict[str, Any]]:
            return [self._word(w, turn.audio_from_ms, end_ms, formatted) for w in timed]

        detected: dict[str, Any] = {}
        if self.options.get("language_detection") and result.get("language"):
            # The turn's language, as AssemblyAI adds it to a turn's end (Pipecat takes it
            # at a confidence of 0.7 or more; LiveKit reads language_code).
            detected = {
                "language_code": result["language"],
                "language_confidence": round(float(result.get("language_probability") or 0), 4),
            }
        if "speaker" in completed:  # speaker_labels: the turn's voice, on it and its words
            detected["speaker_label"] = letter(completed["speaker"])
        raw = unformatted(text.split())
        for formatted in (False, True) if self.options.get("format_turns") else (False,):
            ended = self._turn(
                item, text if formatted else raw, words(formatted), end=True, formatted=formatted
            )
            if "speaker_label" in detected:
                ended["words"] = [
                    {**w, "speaker": detected["speaker_label"]} for w in ended["words"]
                ]
            await self.send_json({**ended, **detected})
        self.orders.pop(item, None)

    @staticmethod
    def _word(w: dict[str, Any], offset_ms: int, end_ms: int, formatted: bool) -> dict[str, Any]:
        written = w["word"].strip()
        return {
            "start": min(end_ms, offset_ms + round(float(w["start"]) * 1000)),
            "end": min(end_ms, offset_ms + round(float(w["end"]) * 1000)),
            "text": written if formatted else (plain(written) or written),
            "confidence": round(float(w.get("probability", 0.0)), 4),
            "word_is_final": True,
        }

    def _turn(
        self, item: str, text: str, words: list[dict[str, Any]], *, end: bool, formatted: bool
    ) -> dict[str, Any]:
        if item not in self.orders:
            self.orders[item] = self.next_order
            self.next_order += 1
        if self.options.get("hashed"):  # redact_pii: numbers as AssemblyAI writes them
            text = hashes(text)
            words = [{**w, "text": hashes(w["text"])} for w in words]
        return {
            "type": "Turn",
            "turn_order": self.orders[item],
            "turn_is_formatted": formatted,
            "end_of_turn": end,
            "transcript": text,
            "end_of_turn_confidence": 1.0 if end else 0.0,
            "words": words,
        }

    def _forget(self, item: str) -> None:
        self.interims.pop(item, None)
        self.forget(item)
