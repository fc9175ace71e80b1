"""One live WebSocket: its loop over client events, its turns (server VAD or the client's
commits), the interim and final decodes of each turn through the job pipeline."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from handler.audio.live import LiveDecoder, chunk_bytes
from handler.contract import SAMPLE_RATE
from handler.errors import WorkerError
from handler.faces.openai_api import languages, logprobs
from handler.faces.realtime.buffer import LiveBuffer
from handler.faces.realtime.item import LiveItem, delta_logprobs
from handler.faces.realtime.protocol import (
    MAX_EVENT_DEPTH,
    MIN_COMMIT_S,
    Config,
    SessionError,
    error_event,
    event_depth,
    failed_event,
    new_id,
)
from handler.faces.realtime.voices import SessionVoices
from handler.inference.live_vad import StreamVad, TurnDetector, TurnRules
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from handler.settings import Settings

log = logging.getLogger(__name__)

INTERIM_EVERY_S = 2.0
"""Seconds of new speech between two interim decodes of a turn still being spoken, with
one or two sessions open; with more, this times half the sessions (4 s with 4, 8 s with 8)."""
MAX_PENDING_TURNS = 4
"""Committed turns of one session awaiting their transcript before it is read again."""
IDLE_PREFIX_S = 1.0
"""Audio kept before speech starts, beyond the prefix padding (server VAD)."""
KEPT_SILENCE_MS = 1000
"""The most of the silence that ended a turn (server VAD) that its decode hears."""


@dataclass
class LiveState:
    """What the sessions of one server share (all on its event loop: no lock needed)."""

    executor: ThreadPoolExecutor
    sessions: int = 0
    finals: int = 0
    """Final decodes of committed turns in flight: while any waits, interim decodes wait,
    so a completed transcript never queues behind another session's interim text."""


class Session:
    """One live WebSocket: its config, decoder, VAD, audio and turns."""

    def __init__(
        self,
        ws: WebSocket,
        worker: Runtime,
        settings: Settings,
        live: LiveState,
        on_result: Callable[[Any], None],
    ) -> None:
        self.ws, self.worker, self.settings = ws, worker, settings
        self.live, self.on_result = live, on_result
        self.id = new_id("sess")
        self.started = time.monotonic()
        self.config = Config(worker.pool, settings)
        self.decoder = LiveDecoder()
        self.vad: StreamVad | None = None
        self.detector = TurnDetector()
        self.audio = LiveBuffer()
        self.turn: LiveItem | None = None
        self.previous_item: str | None = None
        self.cancel = threading.Event()
        self.tasks: set[asyncio.Task] = set()
        self.finals: set[asyncio.Task] = set()
        """Committed turns of this session still being transcribed."""
        self.last_final: asyncio.Task | None = None
        """The last committed turn's transcription: the next one answers after it."""
        self._send_lock = asyncio.Lock()
        self.voices = SessionVoices(self.id)

    # --- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        await self.send({"type": "session.created", "session": self._session()})
        try:
            while True:
                left = self.settings.realtime_max_session_s - (time.monotonic() - self.started)
                if left <= 0:
                    await self.send(
                        error_event("the session reached its longest length", "session_expired")
                    )
                    await self.ws.close(code=1000)
                    return
                try:
                    message = await asyncio.wait_for(
                        self.ws.receive(), timeout=min(left, self.settings.realtime_idle_s)
                    )
                except asyncio.TimeoutError:
                    if self.waiting():
                        continue  # the client waits on its transcripts: it is not idle
                    if time.monotonic() - self.started < self.settings.realtime_max_session_s:
                        await self.send(error_event("no event for too long", "idle_timeout"))
                        await self.ws.close(code=1000)
                        return
                    continue
                if message["type"] == "websocket.disconnect":
                    return
                if not await self.receive(message):
                    return
        except (WebSocketDisconnect, RuntimeError):
            return  # the client vanished
        finally:
            self.cancel.set()  # turns in flight stop at their next cancel check
            for task in list(self.tasks):
                task.cancel()

    def waiting(self) -> bool:
        """Committed turns of this session still being transcribed (the client waits)."""
        return any(not t.done() for t in self.finals)

    async def receive(self, message: Any) -> bool:
        """Handle one message; False when the session is over (closed by this server)."""
        if message.get("text") is None:
            await self.send(error_event("send JSON text events, not binary", "binary_unsupported"))
            return True
        if (depth := event_depth(message["text"])) > MAX_EVENT_DEPTH:
            log.warning("live session %s: closed, an event nested %d deep", self.id, depth)
            text = f"an event nests deeper than {MAX_EVENT_DEPTH}: the session is closed"
            await self.send(error_event(text, "invalid_event"))
            await self.ws.close(code=1008)
            return False
        try:
            event = json.loads(message["text"])
        except ValueError:
            await self.send(error_event("the message is not JSON", "invalid_json"))
            return True
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.send(error_event("an event is a JSON object with a type", "invalid_event"))
            return True
        try:
            await self.dispatch(event)
        except SessionError as exc:
            await self.send(error_event(str(exc), exc.code, event_id=event.get("event_id")))
        except WorkerError as exc:
            await self.send(
                error_event(exc.message, exc.code.value.lower(), event_id=event.get("event_id"))
            )
        except (WebSocketDisconnect, asyncio.CancelledError):
            raise
        except Exception:  # a bug of ours: the log has the traceback, the client a sentence
            log.exception("live session %s: an event failed", self.id)
            message = "internal error while handling the event"
            await self.send(error_event(message, "internal", "server_error", event.get("event_id")))
        return True

    async def dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.update":
            self._reconfigure(self.config.update, event.get("session"))
            await self.send({"type": "session.updated", "session": self._session()})
        elif kind == "transcription_session.update":
            self._reconfigure(self.config.update_legacy, event.get("session"))
            await self.send({"type": "transcription_session.updated", "session": self._session()})
        elif kind == "input_audio_buffer.append":
            await self.append(
                chunk_bytes(event.get("audio"), self.settings.realtime_max_message_bytes)
            )
        elif kind == "input_audio_buffer.commit":
            if len(self.audio) < MIN_COMMIT_S * SAMPLE_RATE:
                raise SessionError(
                    "the buffer holds less than 100 ms of audio", "input_audio_buffer_commit_empty"
                )
            await self.commit(self.audio.received_ms)
        elif kind == "input_audio_buffer.clear":
            self._clear()
            await self.send({"type": "input_audio_buffer.cleared"})
        else:
            raise SessionError(f"unknown event type {kind[:80]!r}", "unknown_event")

    def _reconfigure(self, update: Callable[[Any], Config], session: Any) -> None:
        """A whole update validated first (``update`` returns a new Config, or raises with
        nothing changed), then applied whole: another format or rate, another decoder. The
        same audio under server VAD before and after: the turn under way goes on (a
        language or prompt change dropped it, its transcript never sent)."""
        before, self.config = self.config, update(session)
        same = (self.config.format, self.config.rate) == (self.decoder.format, self.decoder.rate)
        if same and before.turns is not None and self.config.turns is not None:
            self.detector.rules = self.config.turns
            return
        if not same:
            self.decoder = LiveDecoder(self.config.format, self.config.rate)
        self.detector = TurnDetector(self.config.turns or TurnRules(), self.audio.received_ms)
        self.vad = None
        self._clear()

    def retune(self, **rules: Any) -> None:
        """Server VAD's rules changed in the middle of the stream, the turn under way kept."""
        self.config = self.config.with_turns(**rules)
        if self.config.turns is not None:
            self.detector.rules = self.config.turns

    def _session(self) -> dict[str, Any]:
        expires = int(
            time.time() + self.settings.realtime_max_session_s - (time.monotonic() - self.started)
        )
        return self.config.session(self.id, expires)

    # --- audio, turns -----------------------------------------------------------------

    async def append(self, data: bytes) -> None:
        samples = self.decoder.decode(data)
        cap = int(self.settings.realtime_max_turn_s * SAMPLE_RATE)
        if self.config.turns is None and len(self.audio) + len(samples) > cap:
            raise SessionError(
                f"the buffer holds {self.settings.realtime_max_turn_s:g} s: "
                "commit or clear it first",
                "input_audio_buffer_full",
            )
        self.audio.add(samples)
        if self.config.turns is None:
            await self._maybe_interim(self.audio.start_ms)
            return
        if self.vad is None:
            self.vad = StreamVad()
            self.detector = TurnDetector(
                self.config.turns, self.audio.received_ms - len(samples) * 1000 // SAMPLE_RATE
            )
        for kind, ms in self.detector.feed(self.vad.push(samples)):
            if kind == "started":
                await self.speech_started(ms)
            else:
                stopped = {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms}
                await self.send(stopped | {"item_id": self._item().item_id})
                # The turn keeps the silence that ended it, up to KEPT_SILENCE_MS (Whisper
                # hears the sentence finish: 4.3 % WER on the live bench, 7.5 % cut at the
                # speech's end), and ends there, not at the end of the audio received (a
                # message of seconds may hold several turns).
                turn = self._item()
                turn.tail_ms = min(self.detector.rules.silence_duration_ms, KEPT_SILENCE_MS)
                await self.commit(ms + turn.tail_ms)
        if self.turn is not None and self.detector.speaking:
            turn_ms = self.audio.received_ms - self.turn.start_ms
            if turn_ms >= self.settings.realtime_max_turn_s * 1000:
                # A turn this long is committed as it stands; speech goes on in a new one.
                await self.commit(self.audio.received_ms)
                self.detector.speaking = False
            else:
                await self._maybe_interim(self._turn_start_ms())
        elif not self.detector.speaking:
            self._trim_idle()

    async def speech_started(self, ms: int) -> None:
        self.turn = LiveItem(new_id("item"), ms)
        started = {"type": "input_audio_buffer.speech_started", "audio_start_ms": ms}
        await self.send(started | {"item_id": self.turn.item_id})

    def _item(self) -> LiveItem:
        if self.turn is None:
            self.turn = LiveItem(new_id("item"), self.audio.start_ms)
        return self.turn

    def _turn_start_ms(self) -> int:
        pad = self.config.turns.prefix_padding_ms if self.config.turns else 0
        return max(self.audio.start_ms, self._item().start_ms - pad)

    def _trim_idle(self) -> None:
        """Before speech, keep only what a turn's prefix padding can reach back to."""
        keep_ms = self.config.turns.prefix_padding_ms if self.config.turns else 0
        self.audio.keep_last(keep_ms / 1000 + IDLE_PREFIX_S)

    def _clear(self) -> None:
        self.audio.clear()
        self.turn = None

    async def commit(self, end_ms: int) -> None:
        turn = self._item()
        start_ms = self._turn_start_ms() if self.config.turns else self.audio.start_ms
        samples = self.audio.take(start_ms, end_ms)
        self.turn = None
        await self.send(
            {
                "type": "input_audio_buffer.committed",
                "item_id": turn.item_id,
                "previous_item_id": self.previous_item,
            }
        )
        await self.send(
            {
                "type": "conversation.item.added",
                "previous_item_id": self.previous_item,
                "item": {
                    "id": turn.item_id,
                    "object": "realtime.item",
                    "type": "message",
                    "role": "user",
                    "status": "completed",
                    "content": [{"type": "input_audio", "transcript": None}],
                },
            }
        )
        self.previous_item = turn.item_id
        turn.audio_from_ms = start_ms
        self.last_final = self._spawn(self._final(turn, samples, self.last_final))
        self.finals.add(self.last_final)
        self.finals = {t for t in self.finals if not t.done()}
        while len(self.finals) >= MAX_PENDING_TURNS:
            # Backpressure: a client that commits faster than its turns are transcribed
            # is not read from until one is done, so it cannot queue turns without bound.
            _done, pending = await asyncio.wait(self.finals, return_when=asyncio.FIRST_COMPLETED)
            self.finals = set(pending)

    # --- transcription ----------------------------------------------------------------

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _transcribe(self, samples: np.ndarray, item_id: str) -> dict[str, Any]:
        job = self.config.job_input()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self.live.executor,
            lambda: run_job(
                job, self.worker, job_id=f"live-{item_id}", cancel=self.cancel, samples=samples
            ),
        )
        self.on_result(result)
        return result

    async def _maybe_interim(self, start_ms: int) -> None:
        turn = self._item()
        samples_now = len(self.audio.between(start_ms, self.audio.received_ms))
        if turn.interim is not None and not turn.interim.done():
            return  # one interim decode per turn at a time: it throttles itself
        if self.live.finals:
            return  # a committed turn waits for its transcript: interim text can wait
        # More sessions, fewer interim decodes each: they share the same cores as the finals.
        every = INTERIM_EVERY_S * max(1.0, self.live.sessions / 2)
        if samples_now - turn.interim_at < every * SAMPLE_RATE:
            return
        turn.interim_at = samples_now
        turn.interim = self._spawn(
            self._interim(turn, self.audio.between(start_ms, self.audio.received_ms).copy())
        )

    async def _interim(self, turn: LiveItem, samples: np.ndarray) -> None:
        result = await self._transcribe(samples, turn.item_id)
        if "error" in result or self.turn is not turn:
            return  # a failed interim decode is not reported; the final one is
        sent = len(turn.emitted)
        delta = turn.agreed_delta(result["text"].split())
        if delta:
            await self._delta(turn, delta, self._logprobs(result, sent, len(turn.emitted)))

    async def _delta(self, turn: LiveItem, delta: str, probs: list | None = None) -> None:
        event = {
            "type": "conversation.item.input_audio_transcription.delta",
            "item_id": turn.item_id,
            "content_index": 0,
            "delta": delta,
        }
        if probs is not None:
            event["logprobs"] = probs
        await self.send(event)

    def _logprobs(self, result: dict[str, Any], start: int, end: int) -> list | None:
        """A delta's ``logprobs``, where the session's ``include`` asks for them."""
        return delta_logprobs(result, start, end) if self.config.logprobs else None

    async def _final(
        self, turn: LiveItem, samples: np.ndarray, before: asyncio.Task | None
    ) -> None:
        """Transcribe a committed turn (beside the turns before it) and answer it once the
        turn before it is answered: transcripts go out in the order the turns were
        committed, as clients that append finals as they arrive (LiveKit, Pipecat) need."""
        self.live.finals += 1
        try:
            if turn.interim is not None and not turn.interim.done():
                await asyncio.wait({turn.interim})  # its deltas come before the final text
            result = await self.final_decode(turn, samples)
        finally:
            self.live.finals -= 1
        if before is not None and not before.done():
            await asyncio.wait({before})
        if "error" in result:
            await self.send(failed_event(turn.item_id, result))
            return
        sent = len(turn.emitted)
        delta, text = turn.final(result["text"].split())
        if delta:
            # The final decode's last words are the ones this delta adds.
            await self._delta(turn, delta, self._logprobs(result, sent - len(turn.emitted), 0))
        completed = {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": turn.item_id,
            "content_index": 0,
            "transcript": text,
            "usage": {"type": "duration", "seconds": round(len(samples) / SAMPLE_RATE, 3)},
        }
        completed["languages"] = languages(result)  # the turn's (LiveKit reads it)
        if "words" in result and self.config.word_alignment:
            completed.update(turn.timed_words(result))
        if self.config.logprobs:
            completed["logprobs"] = logprobs(result.get("words") or [])
        # The voice from the speech alone: the silence kept moved its embedding.
        voiced = samples[: max(1, len(samples) - turn.tail_ms * SAMPLE_RATE // 1000)]
        speaker = await self.voices.of(voiced, self.config, self.worker.diarizer)
        if speaker is not None:
            completed["speaker"], completed["speaker_confidence"] = speaker[0], round(speaker[1], 4)
        await self.send_final(turn, completed)

    async def final_decode(self, turn: LiveItem, samples: np.ndarray) -> dict[str, Any]:
        """A committed turn's decode (a face that decoded it already may answer that)."""
        return await self._transcribe(samples, turn.item_id)

    async def send_final(self, turn: LiveItem, completed: dict[str, Any]) -> None:
        """A committed turn's transcript (OpenAI's ``completed`` event): sent as it is; a
        face with another protocol (handler.faces.deepgram) answers it its own way."""
        await self.send(completed)

    @staticmethod
    def refusal(message: str, code: str) -> dict[str, Any]:
        """The event a connection refused before its session starts is answered with."""
        return error_event(message, code)

    @staticmethod
    def subprotocol(offered: list[str]) -> str | None:
        """The subprotocol answered of those a client offered: a browser fails the handshake
        unless the server picks one (OpenAI's clients offer "realtime" beside
        "openai-insecure-api-key.<key>")."""
        return "realtime" if "realtime" in offered else None

    @staticmethod
    def query_refusal(params: Any) -> str | None:
        """Why the connection's query refuses it before a session starts, else None."""
        if params.get("intent", "transcription") != "transcription":
            return "only intent=transcription is served here: live transcription, not conversations"
        return None

    async def send(self, event: dict[str, Any]) -> None:
        event.setdefault("event_id", new_id("event"))
        await self.send_json(event)

    async def send_json(self, message: dict[str, Any]) -> None:
        """One message to the client, whole (one send at a time)."""
        async with self._send_lock:
            try:
                await self.ws.send_text(json.dumps(message))
            except (WebSocketDisconnect, RuntimeError):
                self.cancel.set()  # the client is gone: nothing more to send


async def serve(
    ws: WebSocket,
    worker: Runtime | None,
    settings: Settings,
    live: LiveState,
    on_result: Callable[[Any], None],
    gateway: bool = False,
    face: type[Session] = Session,
) -> None:
    """One live connection (``/v1/realtime``, or another protocol's ``face``): refused with
    an error event, or a session."""
    await ws.accept(subprotocol=face.subprotocol(list(ws.scope.get("subprotocols") or [])))

    async def refuse(message: str, code: str, close: int) -> None:
        await ws.send_text(json.dumps(face.refusal(message, code)))
        await ws.close(code=close)

    if (why := face.query_refusal(ws.query_params)) is not None:
        return await refuse(why, "unsupported", 1008)
    if gateway:  # live audio needs the model in this process
        return await refuse("a gateway to a job broker serves no live audio", "unsupported", 1008)
    if settings.realtime_max_sessions == 0:
        return await refuse(
            "live sessions are off here (WHISPER_REALTIME_MAX_SESSIONS=0)", "unsupported", 1008
        )
    if worker is None:
        return await refuse("the model is still loading; retry shortly", "not_ready", 1013)
    if live.sessions >= settings.realtime_max_sessions:
        return await refuse(
            f"the server holds {settings.realtime_max_sessions} live sessions; retry later",
            "session_limit",
            1013,
        )
    live.sessions += 1
    try:
        await face(ws, worker, settings, live, on_result).run()
    finally:
        live.sessions -= 1


async def serve_on(ws: WebSocket, state: Any, face: type[Session] = Session) -> None:
    """``serve`` for a route of the HTTP server (``state``: its ServerState)."""
    await serve(
        ws,
        state.worker,
        state.settings,
        state.live,
        state.metrics.job_done,
        gateway=state.gateway is not None,
        face=face,
    )
