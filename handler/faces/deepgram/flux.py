"""Deepgram's Flux (``/v2/listen``), the turn-based live API voice agents use (Pipecat's
``DeepgramFluxSTTService``, LiveKit's Deepgram ``STTv2``, the SDK's ``listen.v2``, each
tested): a live session of handler.faces.realtime answered in Flux's messages.

The query (handler.faces.deepgram.flux_config): ``model`` (``flux-general-en``: English;
``flux-general-multi``: each turn's language detected, among ``language_hint`` when given;
a model loaded here by name is that model), ``encoding`` and ``sample_rate`` (as
``/v1/listen``), ``eot_threshold``, ``eager_eot_threshold``, ``eot_timeout_ms`` (served as
silences), ``keyterm``, ``profanity_filter``, ``redact``; ``numerals``, ``mip_opt_out`` and
``tag`` are accepted.

The server sends ``Connected``, then per turn ``TurnInfo`` events: ``StartOfTurn`` when
speech begins, ``Update`` with the words two decodes agree on so far, ``EndOfTurn`` with
the turn's transcript and words (``trigger``: ``model``, or ``manual`` after the client's
``ForceEndTurn``); every message carries its ``sequence_id``. With ``eager_eot_threshold``,
a turn silent that long is decoded at once and ``EagerEndOfTurn`` sent with its transcript;
speech again sends ``TurnResumed``; otherwise that decode is the turn's ``EndOfTurn``, the
same transcript, sent as soon as the silence ends the turn (no decode left to wait for).
``CloseStream``: the rest is transcribed, then a close (1000). ``Configure`` (thresholds,
``keyterms``, ``language_hints``, ``numerals``) answers ``ConfigureSuccess`` with what is
in force, or ``ConfigureFailure`` with nothing changed. A turn whose decode failed is a
``Warning`` and an empty ``EndOfTurn`` (Flux's ``Error`` is fatal: clients reconnect).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from handler.contract import SAMPLE_RATE
from handler.faces.deepgram import shape
from handler.faces.deepgram.flux_config import (
    configure,
    configure_message,
    current_thresholds,
    eager_silence_ms,
    silence_ms,
)
from handler.faces.realtime.binary import QueryAudioSession
from handler.faces.realtime.item import LiveItem
from handler.faces.realtime.protocol import MIN_COMMIT_S, SessionError
from handler.faces.realtime.session import KEPT_SILENCE_MS
from handler.output.formats import whole_words


@dataclass
class Early:
    """A turn decoded early, on a silence shorter than the one that ends it."""

    start_ms: int
    end_ms: int
    """Where the speech it heard ends: more speech after it voids it."""
    samples: int
    """How much it heard: the speech and the silence after it so far."""
    task: asyncio.Task | None = None
    sent: dict[str, Any] | None = None
    """The ``EagerEndOfTurn`` sent of it, if any."""
    used: bool = False
    """It is the turn's final decode."""


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
        self.early: dict[str, Early] = {}
        """Turns decoded early (``eager_eot_threshold``), by item id."""
        self.early_task: asyncio.Task | None = None
        """The last early decode started (voided or not): the next waits for its end."""

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
            await self._configure(event)
        else:
            raise SessionError(f"unknown message type {kind[:80]!r}", "UNKNOWN_MESSAGE")

    async def _configure(self, event: dict[str, Any]) -> None:
        """``Configure``: checked whole, then applied, or refused with nothing changed."""
        try:
            changes = configure_message(event, self.options["multi"])
            config = self.config
            names = {"keyterms": "keywords", "language_hints": "languages"}
            if fields := {names[k]: changes[k] for k in names if k in changes}:
                config = config.with_transcription(**fields)
        except SessionError as exc:
            failure = {"type": "ConfigureFailure", "request_id": self.id, "code": exc.code}
            await self.send_json(failure | {"description": str(exc)})
            return
        self.config = config
        if "thresholds" in changes:
            chosen = self.options["thresholds"] | changes["thresholds"]
            self.options["thresholds"] = chosen
            self.retune(silence_duration_ms=silence_ms(chosen))
        self.options["numerals"] = changes.get("numerals", self.options["numerals"])
        success: dict[str, Any] = {"type": "ConfigureSuccess", "request_id": self.id}
        success["thresholds"] = current_thresholds(self.options["thresholds"])
        success["keyterms"] = list(self.config.keywords or [])
        if self.options["multi"]:
            success["language_hints"] = list(self.config.languages or [])
        await self.send_json(success | {"numerals": self.options["numerals"]})

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

    # --- eager end of turn ------------------------------------------------------------

    async def after_audio(self) -> None:
        """With ``eager_eot_threshold``: speech after an early decode voids it (and, where
        its ``EagerEndOfTurn`` went out, sends ``TurnResumed``); a turn silent for the
        eager silence is decoded early."""
        turn = self.turn
        if turn is None or not self.detector.speaking:
            return
        item = turn.item_id
        await self._void_early(item, self.detector.speech_end_ms)
        quiet = eager_silence_ms(self.options["thresholds"])
        if item in self.early or quiet is None or self.detector.silence_ms < quiet:
            return
        if self.early_task is not None and not self.early_task.done():
            return  # one early decode at a time: pauses cannot queue decodes of the turn
        start, end = self._turn_start_ms(), self.detector.speech_end_ms
        heard = end + min(self.detector.silence_ms, KEPT_SILENCE_MS)  # as a commit keeps it
        samples = self.audio.between(start, heard).copy()
        if len(samples) >= MIN_COMMIT_S * SAMPLE_RATE:
            early = self.early[item] = Early(start, end, len(samples))
            early.task = self.early_task = self._spawn(self._decode_early(turn, early, samples))

    async def _void_early(self, item: str, heard_ms: int) -> None:
        """Speech heard up to ``heard_ms``: an early decode of the turn that ends before it
        no longer stands (``TurnResumed`` where its EagerEndOfTurn went out)."""
        early = self.early.get(item)
        if early is not None and heard_ms > early.end_ms:
            del self.early[item]
            if early.sent is not None:
                await self._emit(item, self._resumed(item, early.sent))

    async def commit(self, end_ms: int) -> None:
        """A turn ends: speech after its early decode, heard in the same message as the
        silence that ends it, voids that decode first (its words would be lost)."""
        if self.turn is not None:
            detector = self.detector  # ended by silence: the speech ended where VAD heard it
            heard = detector.speech_end_ms if detector.speaking else detector.stopped_ms
            await self._void_early(self.turn.item_id, heard)
        await super().commit(end_ms)

    async def _decode_early(
        self, turn: LiveItem, early: Early, samples: np.ndarray
    ) -> dict[str, Any]:
        result = await self._transcribe(samples, turn.item_id)
        item = turn.item_id
        if self.early.get(item) is early and "error" not in result:
            _delta, text = copy.copy(turn).final(result["text"].split())  # EndOfTurn's text
            if text.strip():  # Flux's EagerEndOfTurn always has words
                words = [self._word(w, early.start_ms / 1000) for w in whole_words(result["words"])]
                threshold = self.options["thresholds"].get("eager_eot_threshold", 0.0)
                early.sent = self._info(item, "EagerEndOfTurn", text.strip(), words, threshold)
                await self._emit(item, early.sent)
        return result

    async def _maybe_interim(self, start_ms: int) -> None:
        if self.turn is not None and self.turn.item_id in self.early:
            return  # decoded early: the turn awaits its end or more speech
        await super()._maybe_interim(start_ms)

    async def final_decode(self, turn: LiveItem, samples: np.ndarray) -> dict[str, Any]:
        """The early decode, where no speech came after it: the same audio but silence."""
        early = self.early.get(turn.item_id)
        if (
            early is not None
            and early.task is not None
            and early.start_ms == turn.audio_from_ms
            and early.samples <= len(samples)
        ):
            result = await asyncio.shield(early.task)
            if "error" not in result:
                early.used = True
                self.results[turn.item_id] = result  # a late interim decode's is not it
                return result
        return await super().final_decode(turn, samples)

    # --- OpenAI's events as Flux's ----------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        """OpenAI's events of the session, as Flux's messages (most have none)."""
        kind, item = event["type"], event.get("item_id", "")
        if kind == "input_audio_buffer.speech_started":
            self.starts[item] = event["audio_start_ms"]
            await self._emit(item, self._info(item, "StartOfTurn", "", []))
        elif kind == "conversation.item.input_audio_transcription.delta":
            self.interims[item] = self.interims.get(item, "") + event["delta"]
            if item in self.early and self.early[item].sent is not None:
                return  # awaiting its end: no Update after EagerEndOfTurn
            said = self.interims[item].strip()
            timed, offset = self.partial(item, len(said.split()))
            words = [self._word(w, offset / 1000) for w in timed]
            await self._emit(item, self._info(item, "Update", said, words))
        elif kind == "conversation.item.input_audio_transcription.failed":
            error = event["error"]
            warning = {"type": "Warning", "request_id": self.id, "code": error["code"].upper()}
            await self.send_json(warning | {"description": error["message"]})
            ended = self._info(item, "EndOfTurn", "", []) | {"trigger": self._trigger(item)}
            await self._emit(item, ended)  # the client's turn ends; no words
            self._forget_turn(item)
        elif kind == "error":
            await self.send_json(self.refusal(event["error"]["message"], event["error"]["code"]))

    async def send_final(self, turn: LiveItem, completed: dict[str, Any]) -> None:
        item = turn.item_id
        result = self.results.get(item) or {}
        early = self.early.get(item)
        if early is not None and early.used and early.sent is not None:
            text, words = early.sent["transcript"], early.sent["words"]  # the same, as Flux's
        else:
            text = completed["transcript"].strip()
            timed = whole_words(result.get("words", [])) if text else []
            words = [self._word(w, turn.audio_from_ms / 1000) for w in timed]
            if early is not None and early.sent is not None:  # a prediction it does not keep
                await self._emit(item, self._resumed(item, early.sent))
        self.starts[item] = turn.audio_from_ms  # the audio the turn's decode covered
        ended = self._info(item, "EndOfTurn", text, words, confidence=1.0)
        ended["trigger"] = self._trigger(item)
        await self._emit(item, ended)
        self._forget_turn(item)

    def _resumed(self, item: str, predicted: dict[str, Any]) -> dict[str, Any]:
        """``TurnResumed``, with the words heard so far (the prediction's: the speech after
        it is not decoded yet); LiveKit's plugin passes them on as an interim transcript."""
        return self._info(item, "TurnResumed", predicted["transcript"], predicted["words"])

    def _trigger(self, item: str) -> str:
        return "manual" if item in self.manual else "model"

    def _forget_turn(self, item: str) -> None:
        for table in (self.turns, self.starts, self.interims, self.early):
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
        """``item``'s turn is over: the next turns' waiting events go out, up to a turn that
        has not ended."""
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
        info = {
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
        language = (self.results.get(item) or {}).get("language")
        if self.options.get("multi") and language and text:
            info["languages"] = [language]  # flux-general-multi: on every event with words
        return info

    @staticmethod
    def _word(w: dict[str, Any], offset: float) -> dict[str, Any]:
        out = shape.word(w, offset)
        return {k: out[k] for k in ("start", "end", "confidence")} | {
            "word": out["punctuated_word"]
        }
