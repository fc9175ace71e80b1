"""Deepgram's Flux (``/v2/listen``), the turn-based live API voice agents use (Pipecat's
``DeepgramFluxSTTService``, LiveKit's Deepgram ``STTv2``, the SDK's ``listen.v2``, each
tested): a live session of handler.faces.realtime answered in Flux's messages.

The query: ``model`` (``flux-general-en``: English; ``flux-general-multi``: each turn's
language detected, among ``language_hint`` when given; a model loaded here by name is
that model), ``encoding`` and ``sample_rate`` (as ``/v1/listen``), ``eot_threshold``
(0.5-0.9, default 0.7: the end-of-turn confidence, served as the silence that ends a
turn, ``TURN_SILENCE_MS``), ``eot_timeout_ms`` (the longest silence before a turn ends),
``keyterm``, ``profanity_filter``, ``redact``; ``eager_eot_threshold`` is accepted and no
``EagerEndOfTurn`` is sent (a turn ends once, on silence), ``numerals``, ``mip_opt_out``
and ``tag`` are accepted.

The server sends ``Connected``, then per turn ``TurnInfo`` events: ``StartOfTurn`` when
speech begins, ``Update`` with the words two decodes agree on so far, ``EndOfTurn`` with
the turn's transcript and words (``trigger``: ``model``, or ``manual`` after the client's
``ForceEndTurn``); every message carries its ``sequence_id``. ``CloseStream``: the rest is
transcribed, then a close (1000). ``Configure`` (``keyterms``) answers ``ConfigureSuccess``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.websockets import WebSocketDisconnect

from handler.contract import SAMPLE_RATE
from handler.faces.deepgram import shape
from handler.faces.deepgram.live import audio_format
from handler.faces.deepgram.query import (
    QueryError,
    flag,
    keywords,
    language_hints,
    redaction,
    served_model,
)
from handler.faces.realtime.binary import QueryAudioSession, query_number
from handler.faces.realtime.item import LiveItem
from handler.faces.realtime.protocol import MIN_COMMIT_S, SessionError
from handler.output.formats import whole_words

TURN_SILENCE_MS = (300, 700)
"""The silence that ends a turn at ``eot_threshold`` 0.5 and at 0.9 (linear between; 500 ms
at Flux's default 0.7): a surer end of turn waits longer. Whisper needs whole phrases, so
300 ms is the floor, as on ``/v1/listen``."""
ACCEPTED = ("numerals", "mip_opt_out")


def _silence_ms(params: Any) -> int:
    threshold = query_number(params, "eot_threshold", 0.5, 0.9, "INVALID_QUERY")
    query_number(params, "eager_eot_threshold", 0.3, 0.9, "INVALID_QUERY")
    timeout = query_number(params, "eot_timeout_ms", 500, 10_000, "INVALID_QUERY")
    lo, hi = TURN_SILENCE_MS
    silence = lo + (hi - lo) * ((0.7 if threshold is None else threshold) - 0.5) / 0.4
    if timeout is not None:
        silence = min(silence, timeout)
    return max(lo, round(silence))


def configure(params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI's session object, Flux's own options) from the connection's query."""
    try:
        for name in ACCEPTED:
            flag(params, name)
        model = params.get("model") or ""
        multi = model.endswith("-multi")
        transcription: dict[str, Any] = {
            "model": model if model in loaded else "whisper-1",
            "language": None if multi or model in loaded else "en",
            "word_alignment": "whisper",
        }
        if multi and (hints := language_hints(params, multi=True)):
            transcription["languages"] = hints
        if terms := keywords(params):
            transcription["keywords"] = terms
        if flag(params, "profanity_filter"):
            transcription["profanity_filter"] = "full"
        if kinds := redaction(params):
            transcription["redact"] = kinds
        turns = {"type": "server_vad", "silence_duration_ms": _silence_ms(params)}
        audio = {"format": audio_format(params), "transcription": transcription}
    except QueryError as exc:
        raise SessionError(str(exc), exc.code.upper()) from None
    session = {"type": "transcription", "audio": {"input": {**audio, "turn_detection": turns}}}
    return session, {"model": served_model(model, loaded), "multi": multi}


class FluxSession(QueryAudioSession):
    """One ``/v2/listen`` WebSocket: a live session answered in Flux's messages."""

    names = {
        "transcription.language": "model",
        "transcription.languages": "language_hint",
        "transcription.model": "model",
        "transcription.keywords": "keyterm",
        "format": "encoding",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sequence = 0
        self.next_turn = 0
        self.turns: dict[str, int] = {}
        """Each turn's ``turn_index``, by item id."""
        self.starts: dict[str, int] = {}
        self.interims: dict[str, str] = {}
        self.manual: set[str] = set()
        self.order: list[str] = []
        """Turns not yet ended, in the order they began: Flux's turns never overlap, so a
        turn's events wait while the one before it has not ended (its transcript pending)."""
        self.held: dict[str, list[dict[str, Any]]] = {}

    @staticmethod
    def refusal(message: str, code: str) -> dict[str, Any]:
        return {"type": "Error", "code": code.upper(), "description": message}

    @staticmethod
    def subprotocol(offered: list[str]) -> str | None:
        return next((p for p in offered if p in ("token", "bearer")), None)

    def configure(self, params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        return configure(params, loaded)

    async def send_json(self, message: dict[str, Any]) -> None:
        message = {**message, "sequence_id": self.sequence}
        self.sequence += 1
        await super().send_json(message)

    async def opening(self) -> None:
        await self.send_json({"type": "Connected", "request_id": self.id})

    async def dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "KeepAlive":
            return
        if kind == "ForceEndTurn":
            await self._end_turn()
        elif kind == "CloseStream":
            await self._close()
        elif kind == "Configure":
            if event.get("keyterms") is not None:
                self._keyterms(event["keyterms"])
            await self.send_json({"type": "ConfigureSuccess", "request_id": self.id})
        else:
            raise SessionError(f"unknown message type {kind[:80]!r}", "UNKNOWN_MESSAGE")

    def _keyterms(self, terms: Any) -> None:
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise SessionError("keyterms: a list of words or phrases", "INVALID_MESSAGE")
        self.config = self.config.with_keywords(terms)

    async def _end_turn(self) -> None:
        """``ForceEndTurn``: the turn under way ends now (nothing happens when none is)."""
        if self.turn is not None and len(self.audio) >= MIN_COMMIT_S * SAMPLE_RATE:
            self.manual.add(self.turn.item_id)
            await self.commit(self.audio.received_ms)
            self.detector.speaking = False

    async def _close(self) -> None:
        await self._end_turn()
        pending = {t for t in self.finals | self.tasks if not t.done()}
        if pending:
            await asyncio.wait(pending)
        self.closing = True
        try:
            await self.ws.close(code=1000)
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client closed first

    async def send(self, event: dict[str, Any]) -> None:
        """OpenAI's events of the session, as Flux's messages (most have none)."""
        kind, item = event["type"], event.get("item_id", "")
        if kind == "input_audio_buffer.speech_started":
            self.starts[item] = event["audio_start_ms"]
            await self._emit(item, self._info(item, "StartOfTurn", "", []))
        elif kind == "conversation.item.input_audio_transcription.delta":
            self.interims[item] = self.interims.get(item, "") + event["delta"]
            said = self.interims[item].strip()
            timed, offset = self.partial(item, len(said.split()))
            words = [self._word(w, offset / 1000) for w in timed]
            await self._emit(item, self._info(item, "Update", said, words))
        elif kind == "conversation.item.input_audio_transcription.failed":
            error = event["error"]
            await self.send_json(self.refusal(error["message"], error["code"]))
            await self._ended(item)  # no EndOfTurn will come for it
        elif kind == "error":
            await self.send_json(self.refusal(event["error"]["message"], event["error"]["code"]))

    async def send_final(self, turn: LiveItem, completed: dict[str, Any]) -> None:
        item = turn.item_id
        result = self.results.get(item) or {}
        text = completed["transcript"].strip()
        timed = whole_words(result.get("words", [])) if text else []
        words = [self._word(w, turn.audio_from_ms / 1000) for w in timed]
        self.starts[item] = turn.audio_from_ms  # the audio the turn's decode covered
        ended = self._info(item, "EndOfTurn", text, words, confidence=1.0)
        ended["trigger"] = "manual" if item in self.manual else "model"
        if self.options.get("multi") and result.get("language") and text:
            ended["languages"] = [result["language"]]
        await self._emit(item, ended)
        for table in (self.turns, self.starts, self.interims):
            table.pop(item, None)
        self.manual.discard(item)
        self.forget(item)

    async def _emit(self, item: str, message: dict[str, Any]) -> None:
        """A turn's event now, or (an earlier turn not ended yet) when that one has ended; of
        a waiting turn's updates only the latest is kept."""
        if item not in self.order:
            self.order.append(item)
        if self.order[0] != item:
            kept = self.held.setdefault(item, [])
            if kept and kept[-1]["event"] == message["event"] == "Update":
                kept[-1] = message
            else:
                kept.append(message)
            return
        await self.send_json(message)
        if message["event"] == "EndOfTurn":
            await self._ended(item)

    async def _ended(self, item: str) -> None:
        """``item``'s turn is over (ended, or failed): the next turns' waiting events go
        out, up to a turn that has not ended."""
        head = bool(self.order) and self.order[0] == item
        if item in self.order:
            self.order.remove(item)
        if not head:
            self.held.pop(item, None)  # a later turn that failed: its events never go out
        while head and self.order:
            waiting = self.held.pop(self.order[0], [])
            for m in waiting:
                await self.send_json(m)
            if not any(m["event"] == "EndOfTurn" for m in waiting):
                return
            self.order.pop(0)

    def _info(
        self, item: str, event: str, text: str, words: list[Any], confidence: float = 0.0
    ) -> dict[str, Any]:
        if item not in self.turns:
            self.turns[item], self.next_turn = self.next_turn, self.next_turn + 1
        return {
            "type": "TurnInfo",
            "request_id": self.id,
            "event": event,
            "turn_index": self.turns[item],
            "audio_window_start": round(self.starts.get(item, 0) / 1000, 3),
            "audio_window_end": round(self.audio.received_ms / 1000, 3),
            "transcript": text,
            "words": words,
            "end_of_turn_confidence": confidence,
        }

    @staticmethod
    def _word(w: dict[str, Any], offset: float) -> dict[str, Any]:
        out = shape.word(w, offset)
        return {k: out[k] for k in ("start", "end", "confidence")} | {
            "word": out["punctuated_word"]
        }
