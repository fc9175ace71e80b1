"""Deepgram's live protocol on ``/v1/listen`` (a WebSocket): a live session of
handler.faces.realtime (the same audio buffer, server VAD, interim agreement, turn order,
bounds and send guard) spoken in Deepgram's messages.

The connection's query configures it, as Deepgram's does: ``encoding`` (``linear16`` with
``sample_rate``, ``mulaw``, ``alaw``), ``model`` (a model loaded here by name; any other
name, Deepgram's ``nova-3`` included, is this worker's default model), ``language``
(``en``, ``en-US``, ``multi``), ``interim_results``, ``endpointing`` (ms of silence that end a
turn, at least ``ENDPOINTING_FLOOR_MS``; ``false``: turns end at ``NO_ENDPOINTING_MS`` and
are never ``speech_final``), ``utterance_end_ms``, ``vad_events``, ``keywords`` and
``keyterm`` (hotwords), ``profanity_filter`` (every letter masked, as Deepgram does),
``redact`` (numbers, in interim and final results: handler.output.redact),
``diarize`` (each final's words name the turn's voice: handler.faces.realtime.voices),
``extra`` (back in the closing ``Metadata``),
``multichannel=true`` with ``channels`` (each channel of the interleaved audio heard on its
own, a lane of its own on the same socket: ``channel_index`` says whose each result is;
each channel takes a live session's slot). Formatting options (``punctuate``,
``smart_format``, ...) are accepted: Whisper punctuates and formats as it transcribes.

The client sends binary audio and the JSON messages ``KeepAlive``, ``Finalize`` (the
speech so far is transcribed now: a ``Results`` with ``from_finalize``), ``Configure``
(``keyterms`` replace the hotwords) and ``CloseStream`` (the rest is transcribed, then
``Metadata`` and a close; an empty binary message says the same). The server
sends ``Results`` (interim ones with ``is_final: false`` when asked; a final one per turn,
``speech_final`` when silence ended it), ``SpeechStarted``, ``UtteranceEnd`` (once
``utterance_end_ms`` of the stream passed after the last word with nobody speaking),
``Metadata`` and ``Error``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from handler.contract import SAMPLE_RATE
from handler.faces.deepgram import dictation, shape
from handler.faces.deepgram.query import (
    ACCEPTED,
    MAX_KEYWORDS,
    QueryError,
    diarization,
    extra,
    flag,
    keywords,
    language_hints,
    number,
    redaction,
    refuse_unserved,
    served_model,
)
from handler.faces.realtime.binary import QueryAudioSession
from handler.faces.realtime.item import LiveItem
from handler.faces.realtime.protocol import MAX_KEYWORDS_CHARS, MIN_COMMIT_S, SessionError

ENDPOINTING_FLOOR_MS = 300
"""The shortest silence that ends a turn. Deepgram's default endpointing is 10 ms; Whisper
needs whole phrases, so a shorter value asked for is raised to this. ``python -m bench
realtime --sessions 1 --silence-ms N`` (tiny.en, 2-core Xeon): 150 ms: WER 5.4 %, end of
speech to transcript p50 0.54 s; 300 ms: 4.3 %, 0.73 s; 500 ms (the OpenAI face's
default): 4.3 %, 0.87 s; the same clips as files: 4.3 %."""
NO_ENDPOINTING_MS = 1000
"""``endpointing=false``: turns still end at this much silence (as ``is_final`` results
that are not ``speech_final``), so a session's audio never waits without bound."""
FORMATS = {"linear16": "audio/pcm", "mulaw": "audio/pcmu", "alaw": "audio/pcma"}


def audio_format(params: Any) -> dict[str, Any]:
    encoding = params.get("encoding")
    if encoding not in FORMATS:
        raise SessionError(
            "encoding: send raw audio and name it: linear16 with sample_rate, mulaw or alaw "
            "(containers such as webm or ogg are not served live)",
            "unsupported_encoding",
        )
    rate = number(params, "sample_rate", 8000, 48000)
    if encoding == "linear16":
        if rate is None:
            raise SessionError("sample_rate: required with encoding=linear16", "invalid_query")
        return {"type": "audio/pcm", "rate": rate}
    if rate not in (None, 8000):
        raise SessionError(f"sample_rate: {encoding} is served at 8000 Hz", "invalid_query")
    return {"type": FORMATS[encoding]}


MAX_LIVE_CHANNELS = 8
"""Channels of one live stream at most; each also takes a live session's slot."""


def _channels(params: Any) -> int:
    """``channels`` with ``multichannel=true``: each channel heard on its own (a call's two
    sides); without it, one channel is all that is served live."""
    count = number(params, "channels", 1, 16) or 1
    if not flag(params, "multichannel"):
        if count != 1:
            raise SessionError(
                "channels: with multichannel=true each channel is transcribed on its own; "
                "without it, send one channel",
                "unsupported",
            )
        return 1
    if count > MAX_LIVE_CHANNELS:
        raise SessionError(f"channels: at most {MAX_LIVE_CHANNELS} live", "unsupported")
    return count


def split_frames(data: bytes, count: int, width: int) -> tuple[list[bytes], bytes]:
    """Interleaved samples (``width`` bytes each: 2 in linear16, 1 in mu-law and A-law) as
    each of ``count`` channels' bytes, and the bytes short of a whole frame (they wait for
    the next message)."""
    cut = len(data) - len(data) % (width * count)
    frames = np.frombuffer(data[:cut], np.uint8).reshape(-1, count, width)
    return [frames[:, i, :].tobytes() for i in range(count)], data[cut:]


def _turns(params: Any) -> tuple[dict[str, Any], bool]:
    """OpenAI's server VAD for Deepgram's endpointing; whether turns are ``speech_final``."""
    value = params.get("endpointing")
    if value is not None and value.lower() == "false":
        return {"type": "server_vad", "silence_duration_ms": NO_ENDPOINTING_MS}, False
    ms = number(params, "endpointing", 0, 10_000)
    silence = max(ENDPOINTING_FLOOR_MS, ms if ms is not None else 0)
    return {"type": "server_vad", "silence_duration_ms": silence}, True


def configure(params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI's session object, Deepgram's own options) from the connection's query."""
    try:
        return _configure(params, loaded)
    except QueryError as exc:
        raise SessionError(str(exc), exc.code) from None


def _configure(params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    for name in ACCEPTED:
        flag(params, name)
    refuse_unserved(params)  # a stream asked to be redacted must not come back as if it was
    for name in ("replace", "search", "callback"):
        if params.getlist(name):
            raise QueryError(f"{name}: served on files (POST /v1/listen), not live", "unsupported")
    model = params.get("model") or ""
    terms = keywords(params)
    turns, speech_final = _turns(params)
    transcription: dict[str, Any] = {
        "model": model if model in loaded else "whisper-1",
        "language": shape.language_of(params.get("language")),
        "word_alignment": "whisper",
    }
    if terms:
        transcription["keywords"] = terms
    if hints := language_hints(params):
        transcription["languages"] = hints  # language=multi: each turn detected among them
    if flag(params, "profanity_filter"):
        transcription["profanity_filter"] = "full"  # Deepgram writes every letter: "****"
    if kinds := redaction(params):
        transcription["redact"] = kinds
    if diarization(params, live=True):
        transcription["diarize"] = True  # each final's words name their speaker
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": audio_format(params),
                "transcription": transcription,
                "turn_detection": turns,
            }
        },
    }
    options = {
        "channels": _channels(params),
        "model": served_model(model, loaded),
        "interim_results": flag(params, "interim_results"),
        "dictation": flag(params, "dictation"),
        "vad_events": flag(params, "vad_events"),
        "utterance_end_ms": number(params, "utterance_end_ms", 1000, 5000),
        "speech_final": speech_final,
        "extra": extra(params),  # the closing Metadata carries them back
    }
    return session, options


def error_message(message: str, code: str) -> dict[str, Any]:
    """Deepgram's ``Error`` message."""
    return {"type": "Error", "variant": code, "code": code, "description": message}


class DeepgramSession(QueryAudioSession):
    """One ``/v1/listen`` WebSocket: a live session answered in Deepgram's messages."""

    names = {
        "transcription.language": "language",
        "transcription.model": "model",
        "transcription.keywords": "keywords, keyterm",
        "transcription.diarize": "diarize",
        "format": "encoding",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: dict[str, int] = {}
        """A turn's first audio (ms of the session's audio), by item id, for its interims."""
        self.interims: dict[str, str] = {}
        self.endpointed: set[str] = set()
        self.finalized: set[str] = set()
        self.empty_final: asyncio.Task | None = None
        self.last_word_end: float | None = None
        """The end (s) of the last word sent in a final whose utterance end is not yet said."""
        self.speech_starts: list[int] = []
        """Where speech began (ms of the stream) since the last word sent, the last 16."""
        self.channel = (0, 1)
        """(this channel, the stream's channels): with ``multichannel`` the other channels
        are lanes, sessions of their own answering on the same socket."""
        self.lanes: list[DeepgramSession] = []
        self.pending = b""
        """A multichannel message's bytes short of a whole frame (every channel's sample)."""

    @staticmethod
    def refusal(message: str, code: str) -> dict[str, Any]:
        return error_message(message, code)

    @staticmethod
    def subprotocol(offered: list[str]) -> str | None:
        # A browser's "token, <key>", or "bearer, <token>" with a short-lived token.
        return next((p for p in offered if p in ("token", "bearer")), None)

    def configure(self, params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        session, options = configure(params, loaded)
        count, limit = options["channels"], self.settings.realtime_max_sessions
        if count > 1 and self.live.sessions - 1 + count > limit:
            free = limit - self.live.sessions + 1
            raise SessionError(
                f"channels: each of the {count} takes a live session; {free} free here",
                "session_limit",
            )
        return session, options

    async def opening(self) -> None:
        """A multichannel stream's other channels: a lane each, configured as this one."""
        count = self.options["channels"]
        self.live.sessions += count - 1
        for i in range(1, count):
            lane = DeepgramSession(self.ws, self.worker, self.settings, self.live, self.on_result)
            lane.id, lane.options, lane.channel = self.id, self.options, (i, count)
            lane._send_lock = self._send_lock  # one message at a time on the one socket
            lane._reconfigure(lambda _session: self.config, None)
            self.lanes.append(lane)
        self.channel = (0, count)

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            for lane in self.lanes:
                lane.cancel.set()
                for task in list(lane.tasks):
                    task.cancel()
            self.live.sessions -= len(self.lanes)

    def waiting(self) -> bool:
        return super().waiting() or any(lane.waiting() for lane in self.lanes)

    async def append(self, data: bytes) -> None:
        if not self.lanes:
            return await super().append(data)
        parts = self._split(data)
        if parts[0]:
            await super().append(parts[0])
            for lane, part in zip(self.lanes, parts[1:], strict=True):
                await lane.append(part)

    def _split(self, data: bytes) -> list[bytes]:
        width = 2 if self.config.format == "audio/pcm" else 1
        parts, self.pending = split_frames(self.pending + data, len(self.lanes) + 1, width)
        return parts

    async def empty_message(self) -> bool:
        # An empty binary message: Deepgram's older way to say CloseStream.
        await self.dispatch({"type": "CloseStream"})
        return False

    async def after_audio(self) -> None:
        for lane in (self, *self.lanes):
            await lane._utterance_end()

    async def dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "KeepAlive":
            return
        everyone = (self, *self.lanes)
        if kind == "Finalize":
            for lane in everyone:
                await lane._finalize()
        elif kind == "Configure":
            await self._configure(event)
        elif kind == "CloseStream":
            for lane in everyone:
                await lane._finalize(answer_empty=False)
            pending = {t for lane in everyone for t in lane.finals | lane.tasks if not t.done()}
            if pending:
                await asyncio.wait(pending)
            model = self.options["model"]
            meta = shape.metadata(self.id, model, self.audio.received_ms / 1000)
            meta["channels"] = self.channel[1]
            if self.options.get("extra"):
                meta["extra"] = self.options["extra"]
            await self.send_json({"type": "Metadata", **meta})
            self.closing = True
            try:
                await self.ws.close(code=1000)
            except (WebSocketDisconnect, RuntimeError):
                pass  # the client closed first (Pipecat closes right after CloseStream)
        else:
            raise SessionError(f"unknown message type {kind[:80]!r}", "unknown_message")

    async def _configure(self, event: dict[str, Any]) -> None:
        """Deepgram's ``Configure``: ``keyterms`` replace the session's hotwords (null keeps
        them, [] clears them); ``features`` (formatting switches) change nothing here. The
        audio, its turns and the rest of the config stay as they are."""
        features = event.get("features")
        if features is not None and not (
            isinstance(features, dict) and all(isinstance(v, bool) for v in features.values())
        ):
            raise SessionError("features: an object of booleans", "invalid_message")
        terms = event.get("keyterms")
        if terms is not None:
            try:
                self.config = self.config.with_transcription(keywords=terms)
                for lane in self.lanes:
                    lane.config = self.config  # the same hotwords on every channel
            except SessionError:
                limit = f"keyterms: at most {MAX_KEYWORDS} terms, {MAX_KEYWORDS_CHARS} characters"
                await self.send_json(
                    {
                        "type": "ConfigureFailure",
                        "request_id": self.id,
                        "code": "CONFIGURE_KEYTERM_LIMIT_EXCEEDED",
                        "description": limit,
                    }
                )
                return
        keyterms = self.config.keywords or []
        await self.send_json(
            {"type": "ConfigureSuccess", "request_id": self.id, "keyterms": keyterms}
        )

    async def _finalize(self, answer_empty: bool = True) -> None:
        """Transcribe the speech of the turn under way now. With none, an empty final
        ``Results`` marked ``from_finalize`` once the turns before it are answered, as
        Deepgram answers (Pipecat waits on it to time its turn)."""
        if self.turn is not None and len(self.audio) >= MIN_COMMIT_S * SAMPLE_RATE:
            self.finalized.add(self.turn.item_id)
            await self.commit(self.audio.received_ms)
            self.detector.speaking = False
            return
        if answer_empty and (self.empty_final is None or self.empty_final.done()):
            # One waits at a time: Finalize after Finalize while a long turn is being
            # transcribed must not pile up tasks (each answered once the turn is).
            self.empty_final = self._spawn(
                self._nothing_to_finalize(self.last_final, self.audio.received_ms)
            )

    async def _nothing_to_finalize(self, before: asyncio.Task | None, at_ms: int) -> None:
        if before is not None and not before.done():
            await asyncio.wait({before})
        message = self._results("", [], at_ms, at_ms, True)
        message["from_finalize"] = True
        await self.send_json(message)

    async def send(self, event: dict[str, Any]) -> None:
        """OpenAI's events of the session, as Deepgram's messages (most have none)."""
        kind, item = event["type"], event.get("item_id", "")
        if kind == "input_audio_buffer.speech_started":
            self.starts[item] = event["audio_start_ms"]
            self.speech_starts = [*self.speech_starts[-15:], event["audio_start_ms"]]
            await self._utterance_end(before_ms=event["audio_start_ms"])
            if self.options.get("vad_events"):
                timestamp = round(event["audio_start_ms"] / 1000, 3)
                await self.send_json(
                    {"type": "SpeechStarted", "channel": [self.channel[0]], "timestamp": timestamp}
                )
        elif kind == "input_audio_buffer.speech_stopped":
            if self.options.get("speech_final"):
                self.endpointed.add(item)
        elif kind == "conversation.item.input_audio_transcription.delta":
            self.interims[item] = self.interims.get(item, "") + event["delta"]
            if self.options.get("interim_results"):
                start = self.starts.get(item, 0)
                end = self.audio.received_ms
                timed, offset = self.partial(item, len(self.interims[item].split()))
                words = [shape.word(w, offset / 1000, limit=end / 1000) for w in timed]
                await self.send_json(self._results(self.interims[item], words, start, end, False))
        elif kind == "conversation.item.input_audio_transcription.failed":
            self._forget(item)
            error = event["error"]
            await self.send_json(error_message(error["message"], error["code"].lower()))
        elif kind == "error":
            await self.send_json(error_message(event["error"]["message"], event["error"]["code"]))

    async def send_final(self, turn: LiveItem, completed: dict[str, Any]) -> None:
        item = turn.item_id
        result = self.results.get(item) or {}
        offset = turn.audio_from_ms / 1000
        end_ms = turn.audio_from_ms + round(completed["usage"]["seconds"] * 1000)
        words = [
            shape.word(w, offset, limit=end_ms / 1000)
            for w in shape.whole_words(result.get("words", []))
        ]
        if "speaker" in completed:  # diarize: the turn's voice, on each of its words
            who = {k: completed[k] for k in ("speaker", "speaker_confidence")}
            words = [{**w, **who} for w in words]
        message = self._results(
            completed["transcript"], words, turn.audio_from_ms, end_ms, True, result.get("language")
        )
        message["speech_final"] = item in self.endpointed
        message["from_finalize"] = item in self.finalized
        await self.send_json(message)
        self._forget(item)
        if words:
            self.last_word_end = words[-1]["end"]
            # Speech that began after this word (heard while it was being transcribed)
            # closes the gap on the stream's clock: long enough, the utterance ended.
            later = [ms for ms in self.speech_starts if ms > self.last_word_end * 1000]
            self.speech_starts = later
            if later:
                await self._utterance_end(before_ms=later[0])
        await self._utterance_end()

    async def _utterance_end(self, before_ms: int | None = None) -> None:
        """``UtteranceEnd`` when ``utterance_end_ms`` of the stream passed after the last
        transcribed word without speech (until ``before_ms``, when speech began again; else
        until now, nobody speaking and no turn waiting for its words): once per gap."""
        gap_ms = self.options.get("utterance_end_ms")
        if not gap_ms or self.last_word_end is None:
            return
        if before_ms is None:
            if self.detector.speaking or any(not t.done() for t in self.finals):
                return
            before_ms = self.audio.received_ms
        if before_ms - self.last_word_end * 1000 >= gap_ms:
            end = self.last_word_end
            channel = list(self.channel)
            await self.send_json({"type": "UtteranceEnd", "channel": channel, "last_word_end": end})
        if before_ms - self.last_word_end * 1000 >= gap_ms or before_ms < self.audio.received_ms:
            self.last_word_end = None  # said, or speech came back before the gap

    def _forget(self, item: str) -> None:
        for table in (self.starts, self.interims):
            table.pop(item, None)
        self.forget(item)
        self.endpointed.discard(item)
        self.finalized.discard(item)

    def _results(
        self,
        text: str,
        words: list[dict[str, Any]],
        start_ms: int,
        end_ms: int,
        final: bool,
        language: str | None = None,
    ) -> dict[str, Any]:
        model = self.options["model"]
        if self.options.get("dictation"):
            words = dictation.apply(words)
            text = dictation.transcript(words)
        return {
            "type": "Results",
            "channel_index": list(self.channel),
            "duration": round(max(0, end_ms - start_ms) / 1000, 3),
            "start": round(start_ms / 1000, 3),
            "is_final": final,
            "speech_final": False,
            "from_finalize": False,
            "channel": {"alternatives": [shape.alternative(text, words, language)]},
            "metadata": {
                "request_id": self.id,
                "model_info": shape.model_info(model),
                "model_uuid": model,
            },
        }
