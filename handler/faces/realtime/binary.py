"""A live face configured by its connection's query and fed raw audio in binary messages, as
Deepgram's and AssemblyAI's live protocols are (OpenAI's sends base64 in JSON events and a
``session.update``): the query read whole before the session starts, a refusal closing the
connection, each binary message appended with its errors answered in the face's shape; each
turn's last decode kept for the words of its interim and final messages."""

from __future__ import annotations

from typing import Any

from handler.errors import WorkerError
from handler.faces.realtime.protocol import SessionError
from handler.faces.realtime.session import Session
from handler.output.formats import whole_words


def query_number(
    params: Any, name: str, lo: float, hi: float, code: str = "invalid_query"
) -> float | None:
    """A number from ``lo`` to ``hi`` in a live query (or a JSON message's object); absent:
    None; else SessionError."""
    value = params.get(name)
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):  # a list or an object in a JSON message
        number = float("nan")
    if not lo <= number <= hi:  # nan too
        raise SessionError(f"{name}: a number from {lo:g} to {hi:g}", code)
    return number


class QueryAudioSession(Session):
    """A live session whose query configures it and whose audio is binary (subclassed by
    each face: ``configure``, ``error``, and ``opening`` for a first message)."""

    refused_close = 1008
    """The close code of a connection whose query is refused."""
    names: dict[str, str] = {}
    """The live config's fields (``transcription.language``, ...) by the face's own names
    for them, so that a refusal names what the client sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options: dict[str, Any] = {}
        """The face's own options, read from the query beside the session's config."""
        self.closing = False
        """Set once the face has closed the connection itself (its end of stream)."""
        self.results: dict[str, dict[str, Any]] = {}
        """A turn's last decode (interim or final: its timed words), by item id."""
        self.partial_from: dict[str, int] = {}
        """Where a turn's last interim decode began (ms of the stream)."""

    def configure(self, params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(OpenAI's session object, the face's own options) from the query; SessionError
        when it can never be served."""
        raise NotImplementedError

    def error(self, message: str, code: str) -> dict[str, Any]:
        """The face's error message."""
        return self.refusal(message, code)

    @staticmethod
    def query_refusal(params: Any) -> str | None:
        return None  # the query is read whole when the session starts (it needs the models)

    async def opening(self) -> None:
        """After the query is taken, before the first message is read."""

    async def empty_message(self) -> bool:
        """An empty binary message; False ends the session (some faces' end of stream)."""
        return True

    async def after_audio(self) -> None:
        """After each binary message's audio is appended."""

    async def _transcribe(self, samples: Any, item_id: str) -> dict[str, Any]:
        result = await super()._transcribe(samples, item_id)
        self.results[item_id] = result
        return result

    async def _maybe_interim(self, start_ms: int) -> None:
        turn = self._item()
        if turn.interim is None or turn.interim.done():
            self.partial_from[turn.item_id] = start_ms  # the decode about to start, if any
        await super()._maybe_interim(start_ms)

    def partial(self, item: str, count: int) -> tuple[list[dict[str, Any]], int]:
        """(the first ``count`` whole words of the turn's last interim decode, the ms of the
        stream its times count from): an interim message's words, which the faces' clients
        read (LiveKit's plugins take an interim's times, and AssemblyAI's its text, from
        them)."""
        words = whole_words((self.results.get(item) or {}).get("words", []))
        return words[:count], self.partial_from.get(item, 0)

    def forget(self, item: str) -> None:
        """A turn answered: what was kept of it goes."""
        self.results.pop(item, None)
        self.partial_from.pop(item, None)

    def renamed(self, message: str) -> str:
        """A refusal of the live config with the face's names for its fields."""
        for field, name in self.names.items():
            for where in ("session.audio.input.", "session.input_audio_"):
                if message.startswith(where + field + ":"):
                    return name + message[len(where + field) :]
        return message

    async def run(self) -> None:
        try:
            session, self.options = self.configure(self.ws.query_params, self.worker.pool.names)
            self._reconfigure(self.config.update, session)
        except SessionError as exc:
            said = self.renamed(str(exc))
            await self.send_json(self.error(said, exc.code))
            await self.ws.close(code=self.refused_close, reason=said[:120])
            return
        await self.opening()
        await super().run()

    async def receive(self, message: Any) -> bool:
        data = message.get("bytes")
        if data is None:
            return await super().receive(message) and not self.closing
        if not data:
            return await self.empty_message()
        try:
            await self.append(data)
            await self.after_audio()
        except SessionError as exc:
            await self.send_json(self.error(str(exc), exc.code))
        except WorkerError as exc:  # the audio cannot be read as the query names it
            await self.send_json(self.error(exc.message, exc.code.value.lower()))
        return True
