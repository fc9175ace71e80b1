"""Deepgram's Flux (``/v2/listen``), the turn-based live API of voice agents: through the
SDK's ``listen.v2`` client, Pipecat's ``DeepgramFluxSTTService`` and raw sockets on a real
server on 127.0.0.1 (tiny.en, real speech); the turn order and the messages' rules pure."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from handler.faces.realtime.protocol import SessionError
from speech_assets.clips import clips, wer
from tests.test_deepgram import CHUNK, KEY, RATE, pcm16, silence, streamed_through, ws_url
from tests.test_http import Server
from tests.voice import no_error_logged, pipecat_turns

PACE_S = 0.025  # 100 ms of audio every 25 ms: 4x real time


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server(
        {
            "WHISPER_API_KEY": KEY,
            "WHISPER_MAX_CONCURRENCY": "2",
            "WHISPER_REALTIME_MAX_SESSIONS": "2",
            "WHISPER_REALTIME_IDLE_S": "10",
        }
    )
    yield srv
    srv.stop()


def flux(srv: Server, query: str) -> Any:
    """A raw socket on ``/v2/listen``; the first message (Connected) read."""
    ws = connect(
        f"{ws_url(srv)}/v2/listen?{query}",
        additional_headers={"Authorization": f"Token {KEY}"},
        open_timeout=30,
    )
    assert json.loads(ws.recv(timeout=30))["type"] == "Connected"
    return ws


def answer(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    """The reply to a control message (no audio in flight)."""
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def send_audio(ws: Any, audio: np.ndarray) -> None:
    pcm = pcm16(audio)
    for i in range(0, len(pcm), CHUNK):
        ws.send(pcm[i : i + CHUNK])
        time.sleep(PACE_S)


def silence_until(ws: Any, until: Any, most_s: float = 8.0) -> list[dict[str, Any]]:
    """Silence sent 100 ms at a time, at real-time pace, until a message for which ``until``
    holds (an early decode starts only as audio arrives, and waits for the one before it)."""
    got: list[dict[str, Any]] = []
    quiet = pcm16(silence(0.1))
    for _ in range(int(most_s * 10)):
        ws.send(quiet)
        try:
            while True:
                got.append(json.loads(ws.recv(timeout=0.1)))
                if until(got[-1]):
                    return got
        except TimeoutError:
            continue
    raise AssertionError(f"not in {got}")


def turn_events(ws: Any, until: Any, timeout: float = 180) -> list[dict[str, Any]]:
    """The messages up to the first for which ``until`` holds."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got.append(json.loads(ws.recv(timeout=deadline - time.monotonic())))
        if until(got[-1]):
            return got
    raise AssertionError(f"not in {got}")


def flux_rules_hold(infos: list[dict[str, Any]]) -> None:
    """Flux's state machine: an EagerEndOfTurn has words; TurnResumed only after one; an
    EndOfTurn after an EagerEndOfTurn says what it said; no Update after it."""
    eager: dict[str, Any] | None = None
    for m in infos:
        event = m["event"]
        if event == "EagerEndOfTurn":
            assert m["transcript"] and eager is None, m
            eager = m
        elif event == "TurnResumed":
            assert eager is not None, infos
            eager = None
        elif event == "EndOfTurn":
            if eager is not None:
                assert m["transcript"] == eager["transcript"], (eager, m)
                assert m["words"] == eager["words"]
            eager = None
        elif event == "Update":
            assert eager is None, (eager, m)


@pytest.mark.e2e
def test_deepgrams_flux_turns_through_the_sdk(server: Server) -> None:
    """Deepgram's Flux (``/v2/listen``: the turn-based live API that Pipecat's
    DeepgramFluxSTTService and LiveKit's Deepgram STTv2 speak) was not served: the socket
    was refused. Now the SDK's ``listen.v2`` client gets Connected, then per turn
    StartOfTurn, Updates with the words so far, and EndOfTurn with the turn's transcript;
    sequence ids count every message; ForceEndTurn ends a turn at once (trigger manual)."""
    from deepgram import DeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    spoken = clips()[:3]
    audio = np.concatenate([silence(0.5)] + [x for c in spoken for x in (c.samples, silence(1.5))])
    env = DeepgramClientEnvironment(
        base=server.url, production=ws_url(server), agent="", agent_rest=""
    )
    client = DeepgramClient(api_key=KEY, environment=env)
    with client.listen.v2.connect(
        model="flux-general-en", encoding="linear16", sample_rate=str(RATE), eot_threshold="0.7"
    ) as conn:
        messages = streamed_through(conn, audio)
    kinds = [m.type for m in messages]
    assert kinds[0] == "Connected" and "Error" not in kinds, kinds
    assert [m.sequence_id for m in messages] == list(range(len(messages)))
    infos = [m for m in messages if m.type == "TurnInfo"]
    ends = [m for m in infos if m.event == "EndOfTurn"]
    assert len(ends) >= 3, [(m.event, m.transcript) for m in infos]
    text = " ".join(m.transcript for m in ends)
    assert wer(" ".join(c.text for c in spoken), text) < 0.25, text
    assert [m.turn_index for m in ends] == list(range(len(ends)))
    for end in ends:
        turn = [m for m in infos if m.turn_index == end.turn_index]
        assert turn[0].event == "StartOfTurn" and turn[-1] is end, [m.event for m in turn]
        assert " ".join(w.word for w in end.words) == end.transcript and end.trigger == "model"
        assert end.audio_window_start <= end.words[0].start <= end.words[-1].end
    assert any(m.event == "Update" and m.transcript for m in infos), kinds

    jfk = clips()[0].samples[: int(10.2 * RATE)]  # still speaking when it is cut
    with client.listen.v2.connect(
        model="flux-general-en", encoding="linear16", sample_rate=str(RATE)
    ) as conn:
        pcm = pcm16(jfk)
        for i in range(0, len(pcm), CHUNK):
            conn.send_media(pcm[i : i + CHUNK])
        conn.send_force_end_turn()
        forced = None
        for message in conn:
            if message.type == "TurnInfo" and message.event == "EndOfTurn":
                forced = message
                if message.trigger == "manual":
                    break
    assert forced is not None and forced.trigger == "manual", forced


@pytest.mark.e2e
def test_pipecats_deepgram_flux_service_with_its_defaults(server: Server) -> None:
    """Pipecat's DeepgramFluxSTTService as its docs show it, inside a real pipeline, with
    only ``url`` pointed here (it could not connect before: /v2/listen was not served):
    every turn heard from Flux's EndOfTurn events, no error."""
    pytest.importorskip("pipecat", reason="pip install '.[dev]' (pipecat-ai)")
    from pipecat.services.deepgram.flux.stt import DeepgramFluxSTTService

    spoken = clips()[:2]
    before = len(server.logs())
    finals, errors = pipecat_turns(
        lambda: DeepgramFluxSTTService(api_key=KEY, url=ws_url(server) + "/v2/listen"),
        lambda stt: stt._websocket is not None,
        spoken,
    )
    assert errors == [], errors
    text = " ".join(finals)
    assert wer(" ".join(c.text for c in spoken), text) < 0.25, text
    no_error_logged(server.logs()[before:])


def test_flux_turns_never_overlap_when_a_transcript_is_late() -> None:
    """Flux's turns never overlap: a turn that began while the one before it was still being
    transcribed waits (its latest update kept) until that one's EndOfTurn is sent. Beside
    stress-ng, LiveKit's STTv2 got the second StartOfTurn first and lost the first turn's
    end; a failed turn lets the next go on."""
    import asyncio

    from handler.faces.deepgram.flux import FluxSession

    session = FluxSession.__new__(FluxSession)
    session.order, session.held, sent = [], {}, []

    async def send_json(message: dict[str, Any]) -> None:
        sent.append((message["item"], message["event"]))

    session.send_json = send_json  # type: ignore[method-assign]

    def info(item: str, event: str) -> dict[str, Any]:
        return {"item": item, "event": event}

    async def run() -> None:
        for item, event in [
            ("a", "StartOfTurn"), ("b", "StartOfTurn"), ("b", "Update"), ("b", "Update"),
            ("a", "EndOfTurn"), ("c", "StartOfTurn"), ("c", "EndOfTurn"), ("b", "EndOfTurn"),
            ("d", "StartOfTurn"),
        ]:  # fmt: skip
            await session._emit(item, info(item, event))
        await session._ended("d")  # failed
        await session._emit("e", info("e", "StartOfTurn"))

    asyncio.run(run())
    assert sent == [
        ("a", "StartOfTurn"), ("a", "EndOfTurn"), ("b", "StartOfTurn"), ("b", "Update"),
        ("b", "EndOfTurn"), ("c", "StartOfTurn"), ("c", "EndOfTurn"), ("d", "StartOfTurn"),
        ("e", "StartOfTurn"),
    ]  # fmt: skip


@pytest.mark.e2e
def test_configure_changes_the_thresholds_and_eager_turns_end_as_predicted(server: Server) -> None:
    """Flux's ``Configure`` was half served: its ``thresholds`` (the end-of-turn ones Pipecat
    and LiveKit send when their settings change) were ignored, ``ConfigureSuccess`` lacked
    the ``thresholds`` and ``keyterms`` the SDK's model requires, a bad one was a fatal
    ``Error`` (Pipecat reconnects on it), ``eot_threshold=1.0`` (turns driven by
    ForceEndTurn) and an ``eot_timeout_ms`` over 10 s were refused, and
    ``eager_eot_threshold`` sent no EagerEndOfTurn. Now, with eot_threshold 1.0, two phrases
    1.5 s apart are one turn, ended by ForceEndTurn; with eager_eot_threshold, each pause
    gets an EagerEndOfTurn, the next phrase a TurnResumed, and the EndOfTurn says what the
    last EagerEndOfTurn said; eot_threshold back at 0.7, a pause ends the turn again."""
    a, b, c = clips()[2], clips()[5], clips()[3]
    ws = flux(server, "model=flux-general-en&encoding=linear16&sample_rate=16000"
                      "&eot_threshold=1.0&eot_timeout_ms=20000")  # fmt: skip
    try:
        bad = answer(ws, {"type": "Configure", "thresholds": {"eot_threshold": 2}})
        assert bad["type"] == "ConfigureFailure" and "eot_threshold" in bad["description"], bad
        bad = answer(ws, {"type": "Configure", "thresholds": {"eot_timeout_ms": [1]}})
        assert bad["type"] == "ConfigureFailure", bad
        eager = {"eager_eot_threshold": 0.5}
        ok = answer(ws, {"type": "Configure", "keyterms": ["Dashwood"], "thresholds": eager})
        assert ok["type"] == "ConfigureSuccess", ok
        assert ok["thresholds"] == {
            "eot_threshold": 1.0, "eager_eot_threshold": 0.5, "eot_timeout_ms": 20000
        }  # fmt: skip
        assert ok["keyterms"] == ["Dashwood"] and ok["sequence_id"] == 3

        eager = lambda m: m.get("event") == "EagerEndOfTurn"  # noqa: E731
        send_audio(ws, np.concatenate([silence(0.5), a.samples]))
        got = silence_until(ws, eager)  # no end at eot_threshold 1.0
        send_audio(ws, b.samples)  # speech again
        got += silence_until(ws, eager)
        ws.send(json.dumps({"type": "ForceEndTurn"}))
        got += turn_events(ws, lambda m: m.get("event") == "EndOfTurn")
        infos = [m for m in got if m["type"] == "TurnInfo"]
        events = [m["event"] for m in infos]
        assert not [m for m in got if m["type"] in ("Error", "Warning")], got
        assert events[0] == "StartOfTurn" and events.count("StartOfTurn") == 1, events
        assert events.count("EagerEndOfTurn") >= 2 and "TurnResumed" in events, events
        flux_rules_hold(infos)
        end = infos[-1]
        assert end["trigger"] == "manual" and end["turn_index"] == 0
        assert wer(f"{a.text} {b.text}", end["transcript"]) < 0.3, end["transcript"]
        assert events[-2] == "EagerEndOfTurn", events  # nothing said after it: its decode

        ok = answer(ws, {"type": "Configure", "thresholds": {"eot_threshold": 0.7}})
        assert ok["thresholds"]["eot_threshold"] == 0.7, ok
        send_audio(ws, np.concatenate([c.samples, silence(1.5)]))
        got = turn_events(ws, lambda m: m.get("event") == "EndOfTurn")
        infos = [m for m in got if m["type"] == "TurnInfo"]
        flux_rules_hold(infos)
        assert infos[-1]["trigger"] == "model" and infos[-1]["turn_index"] == 1, infos[-1]
        assert wer(c.text, infos[-1]["transcript"]) < 0.3, infos[-1]["transcript"]
    finally:
        ws.close()


@pytest.mark.e2e
def test_speech_after_a_prediction_in_the_message_that_ends_the_turn_is_kept(
    server: Server,
) -> None:
    """A message holding both more speech and the silence that ends the turn (a client
    that sends seconds at once) ended the turn before the early decode was voided: the
    EndOfTurn was the prediction's, the second phrase lost. Now it is withdrawn first and
    the turn decoded whole."""
    a, b = clips()[2], clips()[5]  # 3 s of silence end the turn, 300 ms decode it early
    ws = flux(server, "model=flux-general-en&encoding=linear16&sample_rate=16000"
                      "&eot_threshold=1.0&eot_timeout_ms=3000&eager_eot_threshold=0.5")  # fmt: skip
    try:
        send_audio(ws, np.concatenate([silence(0.5), a.samples]))
        got = silence_until(ws, lambda m: m.get("event") == "EagerEndOfTurn", most_s=2.5)
        ws.send(pcm16(np.concatenate([b.samples, silence(3.5)])))  # one message
        got += turn_events(ws, lambda m: m.get("event") == "EndOfTurn")
    finally:
        ws.close()
    infos = [m for m in got if m["type"] == "TurnInfo"]
    flux_rules_hold(infos)
    assert [m["event"] for m in infos].count("StartOfTurn") == 1, infos
    assert "TurnResumed" in [m["event"] for m in infos], infos
    assert wer(f"{a.text} {b.text}", infos[-1]["transcript"]) < 0.3, infos[-1]["transcript"]


@pytest.mark.e2e
def test_language_hints_change_on_the_multilingual_model_only(server: Server) -> None:
    """``Configure``'s ``language_hints`` were ignored; now flux-general-multi's hints are
    set (Whisper's codes) and cleared with ``[]``; on flux-general-en they are refused
    with a ConfigureFailure, and the connection goes on."""
    ws = flux(server, "model=flux-general-multi&encoding=linear16&sample_rate=16000")
    try:
        ok = answer(ws, {"type": "Configure", "language_hints": ["en-US", "ES"]})
        assert ok["type"] == "ConfigureSuccess" and ok["language_hints"] == ["en", "es"], ok
        ok = answer(ws, {"type": "Configure", "language_hints": [], "numerals": True})
        assert ok["language_hints"] == [] and ok["numerals"] is True, ok
        bad = answer(ws, {"type": "Configure", "language_hints": "en"})
        assert bad["type"] == "ConfigureFailure", bad
    finally:
        ws.close()
    ws = flux(server, "model=flux-general-en&encoding=linear16&sample_rate=16000")
    try:
        bad = answer(ws, {"type": "Configure", "language_hints": ["en"]})
        assert bad["type"] == "ConfigureFailure" and "multi" in bad["description"], bad
        assert answer(ws, {"type": "Configure"})["type"] == "ConfigureSuccess"
    finally:
        ws.close()


@pytest.mark.e2e
def test_pipecats_eager_end_of_turn_gets_its_predictions(server: Server) -> None:
    """Pipecat's ``enable_eager_end_of_turn`` (its speculative replies) got no prediction:
    EagerEndOfTurn was never sent. Now each turn's prediction comes before its end and says
    what the end says (Pipecat keeps the reply it began)."""
    pytest.importorskip("pipecat", reason="pip install '.[dev]' (pipecat-ai)")
    from pipecat.services.deepgram.flux.stt import DeepgramFluxSTTService

    spoken = [clips()[2], clips()[5]]
    said: list[tuple[str, str]] = []

    def make() -> Any:
        stt = DeepgramFluxSTTService(
            api_key=KEY, url=ws_url(server) + "/v2/listen", enable_eager_end_of_turn=True
        )
        for event in ("on_eager_end_of_turn", "on_end_of_turn"):

            async def note(_service: Any, transcript: str, event: str = event) -> None:
                said.append((event, transcript))

            stt.add_event_handler(event, note)

        async def resumed(_service: Any) -> None:
            said.append(("on_turn_resumed", ""))

        stt.add_event_handler("on_turn_resumed", resumed)
        return stt

    before = len(server.logs())
    finals, errors = pipecat_turns(make, lambda stt: stt._websocket is not None, spoken, 1.0)
    assert errors == [], errors
    assert wer(" ".join(c.text for c in spoken), " ".join(finals)) < 0.25, finals
    assert [event for event, _ in said].count("on_end_of_turn") == len(spoken), said
    pending, kept = None, 0  # a prediction kept says what the end says; a withdrawn one
    for event, transcript in said:  # (on_turn_resumed) is not kept
        if event == "on_end_of_turn" and pending is not None:
            assert transcript == pending, said
            kept += 1
        pending = transcript if event == "on_eager_end_of_turn" else None
    assert kept, said
    no_error_logged(server.logs()[before:])


def test_a_failed_turn_is_a_warning_and_an_empty_end() -> None:
    """A turn whose decode failed was answered with Flux's ``Error``, which is fatal to its
    clients (Pipecat raises and reconnects) and left the turn without its EndOfTurn. Now: a
    ``Warning`` with the code, and the turn's EndOfTurn, empty; the next turn goes on."""
    from handler.faces.deepgram.flux import FluxSession
    from handler.faces.realtime.buffer import LiveBuffer

    session = FluxSession.__new__(FluxSession)
    session.id, session.sequence, session.next_turn = "sess_1", 0, 0
    session.order, session.held, session.early, session.manual = [], {}, {}, set()
    session.turns, session.starts, session.interims = {}, {}, {}
    session.results, session.partial_from, session.audio = {}, {}, LiveBuffer()
    session.options = {"multi": False}
    sent: list[dict[str, Any]] = []

    async def send_json(message: dict[str, Any]) -> None:
        sent.append(message)

    session.send_json = send_json  # type: ignore[method-assign]

    async def run() -> None:
        for item in ("a", "b"):
            await session.send({"type": "input_audio_buffer.speech_started", "item_id": item,
                                "audio_start_ms": 0})  # fmt: skip
        error = {"code": "busy", "message": "the worker is busy"}
        await session.send({"type": "conversation.item.input_audio_transcription.failed",
                            "item_id": "a", "error": error})  # fmt: skip

    asyncio.run(run())
    kinds = [(m["type"], m.get("event"), m.get("turn_index")) for m in sent]
    assert kinds == [
        ("TurnInfo", "StartOfTurn", 0), ("Warning", None, None), ("TurnInfo", "EndOfTurn", 0),
        ("TurnInfo", "StartOfTurn", 1),
    ], kinds  # fmt: skip
    assert sent[1]["code"] == "BUSY" and sent[2]["transcript"] == "" and sent[2]["words"] == []


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["thresholds", "keyterms", "language_hints", "numerals", "other"]),
        st.recursive(
            st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(
                        ["eot_threshold", "eager_eot_threshold", "eot_timeout_ms", "x"]
                    ),
                    inner,
                )
            ),
            max_leaves=6,
        ),
    ),
    st.booleans(),
)
def test_any_configure_message_is_applied_or_refused(event: dict[str, Any], multi: bool) -> None:
    """Whatever JSON a Configure holds, it is read whole or refused with a SessionError
    (a list where a number goes raised TypeError: an internal error)."""
    from handler.faces.deepgram.flux_config import configure_message, current_thresholds

    try:
        changes = configure_message({"type": "Configure", **event}, multi)
    except SessionError as exc:
        assert exc.code.startswith("INVALID_"), exc.code
        return
    for name, value in changes.get("thresholds", {}).items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, value)
    assert set(current_thresholds(changes.get("thresholds", {}))) == {
        "eot_threshold", "eager_eot_threshold", "eot_timeout_ms"
    }  # fmt: skip


def test_the_thresholds_are_served_as_silences() -> None:
    """eot_threshold 0.5/0.7/0.9 end a turn after 300/500/700 ms of silence; 1.0 only after
    eot_timeout_ms (at most 10 s here); the eager silence is shorter, 160 ms at least."""
    from handler.faces.deepgram.flux_config import eager_silence_ms, silence_ms

    assert [silence_ms({"eot_threshold": t}) for t in (0.5, 0.7, 0.9)] == [300, 500, 700]
    assert silence_ms({"eot_threshold": 1.0}) == 5000
    assert silence_ms({"eot_threshold": 1.0, "eot_timeout_ms": 60000}) == 10_000
    assert silence_ms({"eot_threshold": 0.9, "eot_timeout_ms": 500}) == 500
    assert eager_silence_ms({}) is None
    assert eager_silence_ms({"eager_eot_threshold": 0.5}) == 300
    assert eager_silence_ms({"eager_eot_threshold": 0.3}) == 160
    assert eager_silence_ms({"eager_eot_threshold": 0.9, "eot_threshold": 0.7}) == 436


def test_pauses_cannot_queue_early_decodes() -> None:
    """An attacker's stutter (a pause past the eager silence, a word, again) voids each early
    decode as it starts: each started another decode of the whole turn, queued without
    bound. One early decode runs at a time now; the next pause after it ends starts one.
    (The decode is the one part replaced: it waits for the test, as a slow GPU would.)"""
    from handler.faces.deepgram.flux import FluxSession
    from handler.faces.realtime.buffer import LiveBuffer
    from handler.faces.realtime.item import LiveItem
    from handler.inference.live_vad import TurnDetector

    session = FluxSession.__new__(FluxSession)
    session.turn, session.early, session.early_task, session.tasks = (
        LiveItem("a", 0),
        {},
        None,
        set(),
    )
    session.options = {"thresholds": {"eager_eot_threshold": 0.5}}  # 300 ms
    session.audio, session.detector = LiveBuffer(), TurnDetector()
    session.config = type("Config", (), {"turns": None})()
    session.audio.add(np.zeros(10 * RATE, np.float32))
    started: list[int] = []
    release = asyncio.Event()

    async def decode(turn: Any, early: Any, samples: np.ndarray) -> dict[str, Any]:
        started.append(early.end_ms)
        await release.wait()
        return {"error": "released"}

    session._decode_early = decode  # type: ignore[method-assign]

    async def run() -> None:
        detector = session.detector
        detector.speaking = True
        for cycle in range(6):  # speech to 1 s, 2 s, ...: then 320 ms of silence each
            detector.position_ms, detector._silence_ms = 1000 * (cycle + 1), 0
            await session.after_audio()
            detector.position_ms += 320
            detector._silence_ms = 320
            await session.after_audio()
            await asyncio.sleep(0)
        assert len(started) == 1, started  # the first still runs: none queued behind it
        release.set()
        await asyncio.sleep(0.01)
        detector.position_ms, detector._silence_ms = 8000, 0
        await session.after_audio()
        detector.position_ms, detector._silence_ms = 8320, 320
        await session.after_audio()
        await asyncio.sleep(0)
        assert started == [1000, 8000], started
        release.set()
        await asyncio.gather(*session.tasks)

    asyncio.run(run())
