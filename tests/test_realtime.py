"""Live audio over OpenAI's Realtime transcription protocol.

Pure tier: the live decoder, the turn rules, the delta policy. Model tier: the streaming VAD
scores windows exactly as scoring the whole stream at once does. End to end: the real
``python -m handler serve`` on 127.0.0.1 with tiny.en, driven by the real ``openai`` SDK's
realtime client (sync and async) streaming real speech faster than real time (turn
detection and deltas depend on the audio, not on the clock), and a raw WebSocket client
for the protocol's edge cases.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from handler.audio.live import LiveDecoder, chunk_bytes
from handler.contract import SAMPLE_RATE
from handler.errors import Code, WorkerError
from handler.faces.realtime.item import LiveItem, delta_logprobs
from handler.inference.live_vad import WINDOW_MS, TurnDetector, TurnRules
from speech_assets.clips import JFK_TEXT, clips, long_clip, wer
from tests.test_http import Server

RATE_IN = 24000


def pcm24(samples16: np.ndarray) -> bytes:
    """16-kHz float samples as OpenAI's default input: 24-kHz 16-bit PCM."""
    t = np.arange(int(len(samples16) * 1.5)) / RATE_IN
    x = np.interp(t, np.arange(len(samples16)) / 16000, samples16)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), dtype=np.float32)


# --- pure -----------------------------------------------------------------------------------


def test_the_live_decoder_resamples_every_format_to_16_khz() -> None:
    pcm = pcm24(np.sin(np.arange(16000) / 10).astype(np.float32) * 0.3)
    dec = LiveDecoder("audio/pcm", 24000)
    # Odd-sized chunks: the half sample waits for the next chunk.
    out = np.concatenate([dec.decode(pcm[i : i + 4801]) for i in range(0, len(pcm), 4801)])
    assert abs(len(out) - 16000) < 200 and 0.2 < float(np.abs(out).max()) < 0.35
    mulaw = LiveDecoder("audio/pcmu").decode(bytes(range(256)) * 32)  # 1.024 s at 8 kHz
    assert abs(len(mulaw) - 16384) < 200
    assert len(LiveDecoder("audio/pcma").decode(b"\xd5" * 8000)) > 15000
    with pytest.raises(WorkerError):
        LiveDecoder("audio/opus")
    with pytest.raises(WorkerError):
        LiveDecoder("audio/pcmu", 16000)
    with pytest.raises(WorkerError) as info:
        chunk_bytes("not base64 !!", 1000)
    assert info.value.code is Code.INVALID_BASE64
    assert chunk_bytes(base64.b64encode(b"abc").decode(), 1000) == b"abc"
    with pytest.raises(WorkerError) as info:
        chunk_bytes("A" * 5000, 1000)
    assert info.value.code is Code.INPUT_TOO_LARGE


def test_turn_rules_start_and_stop_as_server_vad_says() -> None:
    det = TurnDetector(TurnRules(threshold=0.5, silence_duration_ms=320))
    probs = [0.1] * 10 + [0.9] * 20 + [0.1] * 5 + [0.9] * 5 + [0.1] * 12
    events = list(det.feed(np.array(probs)))
    # A 160-ms pause (5 windows) does not end the turn; 320 ms of silence does.
    assert events == [("started", 10 * WINDOW_MS), ("stopped", 40 * WINDOW_MS)]
    assert det.position_ms == len(probs) * WINDOW_MS and not det.speaking


def test_deltas_carry_only_words_two_decodes_agree_on_and_never_take_text_back() -> None:
    turn = LiveItem("item_1", 0)
    assert turn.agreed_delta("and so my fellow".split()) == ""  # one decode alone: wait
    assert turn.agreed_delta("and so my fellow Americans".split()) == "and so my fellow"
    assert turn.agreed_delta("and so am I fellow".split()) == ""  # disagreement: wait
    delta, transcript = turn.final("and so my fellow Americans ask".split())
    assert (delta, transcript) == (" Americans ask", "and so my fellow Americans ask")


def test_a_turns_deltas_add_up_to_its_transcript_when_the_final_decode_differs() -> None:
    """The probe's case: "that agent" sent, the final decode "That agent is already logged
    on." The transcript keeps what was sent; the last delta carries the rest."""
    turn = LiveItem("item_1", 0)
    sent = [turn.agreed_delta("that agent is".split()), turn.agreed_delta("that agent was".split())]
    assert sent == ["", "that agent"]
    assert "".join(sent) == "that agent"
    delta, transcript = turn.final("That agent is already logged on.".split())
    assert "".join(sent) + delta == transcript == "that agent is already logged on."
    # A word dropped or inserted by the final decode, punctuation moved: still one text.
    for final in ("That, agent already logged on.", "So that agent is logged on.", "", "that"):
        item = LiveItem("item_2", 0)
        first = item.agreed_delta("that agent is logged".split())
        last, text = item.final(final.split())
        assert first + last == text, final


def test_a_deltas_logprobs_are_those_of_its_own_words() -> None:
    def decode(text: str, probs: list[float]) -> dict[str, Any]:
        words = [
            {"word": " " + w, "probability": p} for w, p in zip(text.split(), probs, strict=True)
        ]
        return {"text": text, "words": words}

    got = delta_logprobs(decode("and so my fellow", [0.9, 0.5, 1.0, 0.25]), 1, 3)
    assert [p["token"] for p in got or []] == [" so", " my"]
    assert [round(p["logprob"], 4) for p in got or []] == [round(math.log(0.5), 4), 0.0]
    last = delta_logprobs(decode("and so my fellow", [0.9, 0.5, 1.0, 0.25]), -1, 0)
    assert [p["token"] for p in last or []] == [" fellow"]
    # Timed words that are not the text's words one for one: nothing to pair, none sent.
    assert delta_logprobs({"text": "and so", "words": [{"word": " and so"}]}, 0, 1) is None
    assert delta_logprobs({"text": "and so"}, 0, 1) is None


@pytest.mark.model
def test_streaming_vad_scores_as_the_whole_stream_does(tiny_pool) -> None:  # noqa: ARG001
    from faster_whisper.vad import get_vad_model

    from handler.inference.live_vad import StreamVad

    audio = clips()[0].samples[: 512 * 60]
    whole = np.asarray(get_vad_model()(audio)).reshape(-1)
    vad = StreamVad()
    parts = [vad.push(audio[i : i + 1000]) for i in range(0, len(audio), 1000)]
    got = np.concatenate(parts)
    assert len(got) == len(whole)
    # All but the last window: the file VAD zeroes that one's final 64 samples.
    np.testing.assert_allclose(got[:-1], whole[:-1], atol=1e-5)


# --- end to end -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live() -> Iterator[Server]:
    srv = Server(
        {
            "WHISPER_MAX_CONCURRENCY": "2",
            "WHISPER_REALTIME_MAX_SESSIONS": "2",
            "WHISPER_REALTIME_IDLE_S": "5",
            "WHISPER_REALTIME_MAX_MESSAGE_BYTES": "65536",
            "WHISPER_WARMUP": "true",
        }
    )
    yield srv
    srv.stop()


SESSION = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": RATE_IN},
            "transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 600},
        }
    },
}
CHUNK = RATE_IN * 2 // 10  # 100 ms of PCM16
PACE_S = 0.025  # 4x real time


def feed(append: Any, pcm: bytes) -> None:
    for i in range(0, len(pcm), CHUNK):
        append(audio=base64.b64encode(pcm[i : i + CHUNK]).decode())
        time.sleep(PACE_S)


@pytest.mark.e2e
def test_the_openai_sdks_realtime_client_gets_turns_and_transcripts(live: Server) -> None:
    # JFK and three LibriVox readings, 1.5 s apart: a turn each at least, each transcribed.
    spoken = clips()[:4]
    audio = np.concatenate([silence(0.5)] + [x for c in spoken for x in (c.samples, silence(1.5))])
    client = live.client()
    transcripts: dict[str, str] = {}
    deltas: dict[str, str] = {}
    order: list[tuple[str, str]] = []
    # The last reading ends here; the server has heard it all once a turn stops past it
    # (a loaded CI run once settled on JFK's own three turns and the fourth, before the
    # server's VAD had reached the readings: the feeder was done, the server behind it).
    last_word_ms = 1000 * (len(audio) / SAMPLE_RATE - 1.5) - 1000
    heard_ms = 0.0
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session=SESSION)  # type: ignore[arg-type]
        feeder = threading.Thread(target=feed, args=(conn.input_audio_buffer.append, pcm24(audio)))
        feeder.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            ev = conn.recv()
            item = getattr(ev, "item_id", "") or ""
            order.append((ev.type, item))
            if ev.type == "input_audio_buffer.speech_stopped":
                heard_ms = max(heard_ms, float(ev.audio_end_ms))
            if ev.type == "conversation.item.input_audio_transcription.delta":
                deltas[item] = deltas.get(item, "") + ev.delta
            if ev.type == "conversation.item.input_audio_transcription.completed":
                transcripts[item] = ev.transcript
                assert ev.usage.type == "duration" and ev.usage.seconds > 0  # type: ignore[union-attr]
                # The turn's language (LiveKit's OpenAI plugin reads it): was missing.
                assert [x.code for x in ev.languages or []] == ["en"], ev
                # A turn's deltas add up to its transcript (OpenAI's behaviour).
                assert deltas.get(item, "") == ev.transcript, (deltas.get(item), ev.transcript)
            finished = (
                not feeder.is_alive()
                and heard_ms >= last_word_ms
                and len(transcripts) >= 4
                and _all_done(order)
            )
            if ev.type == "error" and ev.error.code == "idle_timeout" and finished:
                # The last transcript came while the trailing silence was still being sent
                # (a fast machine): nothing more to say, so the server closes the idle session.
                break
            assert ev.type != "error", ev
            if finished:
                break
        feeder.join()
    assert len(transcripts) >= 4, order
    for item in transcripts:  # each item: started, stopped, committed, then its transcript
        kinds = [k for k, i in order if i == item]
        assert (
            kinds.index("input_audio_buffer.speech_started")
            < kinds.index("input_audio_buffer.speech_stopped")
            < kinds.index("input_audio_buffer.committed")
            < kinds.index("conversation.item.input_audio_transcription.completed")
        )
    text = " ".join(
        transcripts[i]
        for i, _ in dict.fromkeys(
            (i, None) for k, i in order if k == "input_audio_buffer.committed"
        )
    )
    assert wer(" ".join(c.text for c in spoken), text) < 0.25, text


def _all_done(order: list[tuple[str, str]]) -> bool:
    committed = {i for k, i in order if k == "input_audio_buffer.committed"}
    done = {i for k, i in order if k.startswith("conversation.item.input_audio_transcription.c")}
    return bool(committed) and committed <= done


@pytest.mark.e2e
def test_the_async_client_gets_deltas_before_a_long_turn_ends(live: Server) -> None:
    import openai

    # Three readings with 0.25-s pauses: about 16 s of speech. The VAD waits 1.5 s of silence
    # before it ends a turn, so the readings are one long turn (at 0.6 s its cuts left turns
    # of 3-7 s, too short for two interim decodes on a loaded CI machine: CI saw none).
    parts = []
    for c in clips()[1:4]:
        parts += [c.samples, silence(0.25)]
    audio = np.concatenate([silence(0.3), *parts, silence(2.5)])
    reference = " ".join(c.text for c in clips()[1:4])
    session = copy.deepcopy(SESSION)
    session["audio"]["input"]["turn_detection"]["silence_duration_ms"] = 1500

    async def run() -> tuple[list[dict[str, Any]], str]:
        client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        kinds: list[dict[str, Any]] = []
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session=session)  # type: ignore[arg-type]
            pcm = pcm24(audio)

            async def feeder() -> None:  # at real time, as a live microphone sends it
                start = asyncio.get_running_loop().time()
                for n, i in enumerate(range(0, len(pcm), CHUNK)):
                    await conn.input_audio_buffer.append(
                        audio=base64.b64encode(pcm[i : i + CHUNK]).decode()
                    )
                    # Paced by the clock, not by sleeps that add up on a busy machine.
                    wait = start + (n + 1) * 0.1 - asyncio.get_running_loop().time()
                    await asyncio.sleep(max(0.0, wait))

            task = asyncio.ensure_future(feeder())
            transcript = ""
            async with asyncio.timeout(180):
                async for ev in conn:
                    kinds.append(ev.model_dump(exclude_none=True))
                    if ev.type == "conversation.item.input_audio_transcription.completed":
                        transcript += " " + ev.transcript
                        if task.done():
                            break
            await task
        return kinds, transcript

    events, transcript = asyncio.run(run())
    starts = {
        e["item_id"]: (n, e["audio_start_ms"])
        for n, e in enumerate(events)
        if e["type"] == "input_audio_buffer.speech_started"
    }
    stops = [
        (e["audio_end_ms"] - starts[e["item_id"]][1], n, e)
        for n, e in enumerate(events)
        if e["type"] == "input_audio_buffer.speech_stopped"
    ]
    assert stops, [e["type"] for e in events]
    # Interim text arrived for a turn while it was still being spoken (before its
    # speech_stopped): it takes two interim decodes that agree, 2 s of speech apart, so
    # that turn was 4 s long at least. The one 16-s turn leaves a loaded machine 12 s of
    # speech to finish them in.
    early = [
        e["item_id"]
        for _length, n, e in stops
        if any(
            d["type"] == "conversation.item.input_audio_transcription.delta"
            and d["item_id"] == e["item_id"]
            for d in events[starts[e["item_id"]][0] : n]
        )
    ]
    summary = [(e["type"], e.get("item_id"), e.get("delta")) for e in events if "item_id" in e]
    assert early, summary
    assert wer(reference, transcript) < 0.25, transcript
    for done in (e for e in events if e["type"].endswith("transcription.completed")):
        sent = "".join(
            e["delta"]
            for e in events
            if e["type"].endswith("transcription.delta") and e["item_id"] == done["item_id"]
        )
        assert sent == done["transcript"], (sent, done["transcript"])


def raw(srv: Server, query: str = "?intent=transcription") -> Any:
    from websockets.sync.client import connect

    return connect(
        srv.url.replace("http", "ws") + "/v1/realtime" + query, open_timeout=30, max_size=None
    )


def events_until(ws: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = json.loads(ws.recv(timeout=max(0.1, deadline - time.time())))
        seen.append(ev)
        if ev["type"] == kind:
            return seen
    raise AssertionError(f"no {kind} in {[e['type'] for e in seen]}")


@pytest.mark.e2e
def test_protocol_edge_cases_get_error_events_and_the_session_goes_on(live: Server) -> None:
    with raw(live) as ws:
        events_until(ws, "session.created")
        unknown_vad = {"audio": {"input": {"turn_detection": {"type": "magic_vad"}}}}
        cases = [
            ("{not json", "invalid_json"),
            ('["a list"]', "invalid_event"),
            ('{"type": "response.create"}', "unknown_event"),
            ('{"type": "input_audio_buffer.append", "audio": "!!"}', "invalid_base64"),
            ('{"type": "input_audio_buffer.commit"}', "input_audio_buffer_commit_empty"),
            ('{"type": "session.update", "session": {"type": "realtime"}}', "unsupported"),
            (json.dumps({"type": "session.update", "session": unknown_vad}), "invalid_value"),
        ]
        for bad, code in cases:
            ws.send(bad)
            ev = events_until(ws, "error")[-1]
            assert ev["error"]["code"] == code, (bad, ev)
        # Still served: a manual session (turn detection off), committed by the client.
        ws.send(
            json.dumps(
                {
                    "type": "transcription_session.update",
                    "session": {
                        "input_audio_format": "pcm16",
                        "turn_detection": None,
                        "input_audio_transcription": {"model": "whisper-1"},
                    },
                }
            )
        )
        assert (
            events_until(ws, "transcription_session.updated")[-1]["session"]["audio"]["input"][
                "turn_detection"
            ]
            is None
        )
        pcm = pcm24(clips()[0].samples)
        for i in range(0, len(pcm), CHUNK * 5):
            chunk = base64.b64encode(pcm[i : i + CHUNK * 5]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = events_until(ws, "conversation.item.input_audio_transcription.completed")[-1]
        assert wer(JFK_TEXT, done["transcript"]) < 0.2
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        events_until(ws, "input_audio_buffer.cleared")


@pytest.mark.e2e
def test_bounds_message_size_session_count_idle_and_intent(live: Server) -> None:
    from websockets.exceptions import ConnectionClosed

    with raw(live) as ws:  # a message over WHISPER_REALTIME_MAX_MESSAGE_BYTES: 1009
        events_until(ws, "session.created")
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 100_000}))
        with pytest.raises(ConnectionClosed) as closed:
            events_until(ws, "never")
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with raw(live) as a, raw(live) as b:  # two sessions allowed: the third is refused
        events_until(a, "session.created")
        events_until(b, "session.created")
        with raw(live) as c:
            assert events_until(c, "error")[-1]["error"]["code"] == "session_limit"
    with raw(live) as again:  # the closed ones freed their places
        events_until(again, "session.created")
        idle = events_until(again, "error", timeout=30)[-1]  # WHISPER_REALTIME_IDLE_S=5
        assert idle["error"]["code"] == "idle_timeout"
    with raw(live, "?intent=conversation") as conv:
        assert events_until(conv, "error")[-1]["error"]["code"] == "unsupported"
    text = live.logs()
    assert "Traceback" not in text


@pytest.mark.e2e
def test_turns_committed_faster_than_transcribed_are_all_answered(live: Server) -> None:
    """Backpressure, not a queue without bound: past 4 turns awaiting transcripts the
    session stops reading until one is done; every committed turn still gets its answer."""
    chunk = base64.b64encode(pcm24(clips()[0].samples[:12800])).decode()  # 0.8 s, < 64 KiB
    with raw(live) as ws:
        events_until(ws, "session.created")
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "transcription",
                        "audio": {"input": {"turn_detection": None}},
                    },
                }
            )
        )
        events_until(ws, "session.updated")
        for _ in range(7):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        seen: list[dict[str, Any]] = []
        while sum(e["type"].endswith("transcription.completed") for e in seen) < 7:
            seen += events_until(ws, "conversation.item.input_audio_transcription.completed")
    committed = [e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed"]
    done = [e["item_id"] for e in seen if e["type"].endswith("transcription.completed")]
    assert len(committed) == 7 and done == committed  # answered in the order committed
    assert not [e for e in seen if e["type"] == "error"]


@pytest.mark.e2e
def test_a_short_turn_after_a_long_one_is_answered_after_it(live: Server) -> None:
    """Turns decode side by side, but transcripts go out in the order the turns were
    committed: LiveKit and Pipecat append finals as they arrive, so a short turn answered
    before the long one before it would put the user's words out of order."""
    long_turn = pcm24(long_clip(20).samples)
    short_turn = pcm24(clips()[0].samples[:16000])  # 1 s
    step = 30_000  # bytes of PCM a message (base64 stays under the 64 KiB message cap)
    with raw(live) as ws:
        events_until(ws, "session.created")
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "transcription",
                        "audio": {"input": {"turn_detection": None}},
                    },
                }
            )
        )
        events_until(ws, "session.updated")
        for pcm in (long_turn, short_turn):
            for i in range(0, len(pcm), step):
                chunk = base64.b64encode(pcm[i : i + step]).decode()
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        seen: list[dict[str, Any]] = []
        while sum(e["type"].endswith("transcription.completed") for e in seen) < 2:
            seen += events_until(ws, "conversation.item.input_audio_transcription.completed")
    committed = [e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed"]
    done = [e["item_id"] for e in seen if e["type"].endswith("transcription.completed")]
    assert len(committed) == 2 and done == committed


@pytest.mark.e2e
def test_a_session_waiting_for_its_transcript_is_not_idle() -> None:
    """A client that commits a long turn and waits for its transcript sends nothing
    meanwhile: the session was closed as idle (``no event for too long``) when the
    transcription took longer than WHISPER_REALTIME_IDLE_S (seen under load with the 5-s
    limit of the test above). It is not idle while its turns are being transcribed; once
    they are answered, the limit applies again."""
    srv = Server({"WHISPER_REALTIME_IDLE_S": "0.5", "WHISPER_WARMUP": "true"})
    try:
        with raw(srv) as ws:
            events_until(ws, "session.created")
            manual = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
            ws.send(json.dumps({"type": "session.update", "session": manual}))
            events_until(ws, "session.updated")
            pcm = pcm24(long_clip(20).samples)  # more than 0.5 s to transcribe, here
            for i in range(0, len(pcm), 30_000):
                chunk = base64.b64encode(pcm[i : i + 30_000]).decode()
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            done = events_until(ws, "conversation.item.input_audio_transcription.completed")
            assert wer(long_clip(20).text, done[-1]["transcript"]) < 0.3
            idle = events_until(ws, "error")[-1]  # nothing waits now: idle again
            assert idle["error"]["code"] == "idle_timeout", idle
    finally:
        srv.stop()


# --- what voice-agent clients and an attacker send ------------------------------------------


def _update(ws: Any, session: dict[str, Any], kind: str = "session.update") -> dict[str, Any]:
    """Send one update; its answer: session.updated (or the older shape's) or an error."""
    ws.send(json.dumps({"type": kind, "session": session}))
    while True:
        ev = json.loads(ws.recv(timeout=60))
        if ev["type"] in ("error", "session.updated", "transcription_session.updated"):
            return ev


def test_every_transcription_model_the_openai_sdk_names_is_the_default_model() -> None:
    """The model names come from the real client: the openai SDK's own type for a live
    session's transcription model (Pipecat sends gpt-realtime-whisper, LiveKit whisper-1
    or gpt-4o-transcribe), and the HTTP face's audio model type."""
    import typing

    from openai.types.audio_model import AudioModel
    from openai.types.realtime.audio_transcription import AudioTranscription

    from handler.faces.openai_api import resolve_model

    live = typing.get_args(AudioTranscription.model_fields["model"].annotation)
    names = {a for t in live for a in typing.get_args(t) if isinstance(a, str)}
    names |= set(typing.get_args(AudioModel))
    assert {"gpt-realtime-whisper", "whisper-1", "gpt-4o-transcribe"} <= names
    for name in sorted(names):
        assert resolve_model(name, ["tiny.en"]) is None, name
    with pytest.raises(WorkerError):
        resolve_model("nova-3", ["tiny.en"])


@pytest.mark.e2e
def test_options_voice_agent_clients_send_are_served_not_errors(live: Server) -> None:
    """Pipecat's OpenAIRealtimeSTTService (model gpt-realtime-whisper, noise_reduction) and
    LiveKit's streaming STT (languages ["en"], keywords []): one update each, answered by
    session.updated saying what is applied; an error event would end their streams."""
    with raw(live) as ws:
        events_until(ws, "session.created")
        pipecat = {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "noise_reduction": {"type": "near_field"},
                    "transcription": {"model": "gpt-realtime-whisper", "delay": "low"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                }
            },
            "include": ["item.input_audio_transcription.logprobs"],
        }
        ev = _update(ws, pipecat)
        assert ev["type"] == "session.updated", ev
        audio_in = ev["session"]["audio"]["input"]
        assert audio_in["noise_reduction"] is None  # accepted, none applied: said so
        assert audio_in["transcription"]["model"] == "gpt-realtime-whisper"
        assert audio_in["turn_detection"]["silence_duration_ms"] == 500
        livekit = {
            "type": "transcription",
            "audio": {
                "input": {
                    "noise_reduction": None,
                    "transcription": {
                        "model": "gpt-4o-transcribe",
                        "languages": ["en"],
                        "keywords": [],
                    },
                    "turn_detection": {"type": "semantic_vad", "eagerness": "high"},
                }
            },
        }
        ev = _update(ws, livekit)
        assert ev["type"] == "session.updated", ev
        t = ev["session"]["audio"]["input"]["transcription"]
        assert t["language"] == "en" and t["languages"] == ["en"]
        assert ev["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        ev = _update(ws, {"audio": {"input": {"transcription": {"keywords": ["Kubernetes"]}}}})
        assert ev["session"]["audio"]["input"]["transcription"]["keywords"] == ["Kubernetes"]
        far = {"audio": {"input": {"noise_reduction": {"type": "far_field"}}}}
        assert _update(ws, far)["type"] == "session.updated"
    assert "Traceback" not in live.logs()


@pytest.mark.e2e
def test_a_refused_update_changes_nothing_and_a_rate_change_rebuilds_the_decoder(
    live: Server,
) -> None:
    """The probe: a rate change beside a bad field was half-applied (the rate changed, the
    decoder did not), then the same valid update was "no change": 13 s of 16-kHz audio was
    decoded as 24 kHz and words were lost."""
    manual = {"turn_detection": None, "transcription": {"model": "whisper-1", "language": "en"}}
    with raw(live) as ws:
        events_until(ws, "session.created")
        assert _update(ws, {"audio": {"input": manual}})["type"] == "session.updated"
        bad = {
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "turn_detection": {"threshold": 5},
                }
            }
        }
        ev = _update(ws, bad)
        assert ev["type"] == "error" and "threshold" in ev["error"]["message"], ev
        ev = _update(ws, {"audio": {"input": {}}})
        assert ev["session"]["audio"]["input"]["format"]["rate"] == 24000  # unchanged
        assert ev["session"]["audio"]["input"]["turn_detection"] is None  # kept from before
        good = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}
        assert _update(ws, good)["session"]["audio"]["input"]["format"]["rate"] == 16000
        jfk = clips()[0].samples
        pcm16 = (np.clip(jfk, -1, 1) * 32767).astype("<i2").tobytes()
        for i in range(0, len(pcm16), 32000):
            chunk = base64.b64encode(pcm16[i : i + 32000]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = events_until(ws, "conversation.item.input_audio_transcription.completed")[-1]
        assert done["usage"]["seconds"] == pytest.approx(len(jfk) / 16000, abs=0.2)
        assert wer(JFK_TEXT, done["transcript"]) < 0.2, done["transcript"]


@pytest.mark.e2e
def test_an_update_in_the_middle_of_a_turn_keeps_the_turn(live: Server) -> None:
    """A ``session.update`` that changes the language or the prompt (LiveKit's OpenAI plugin
    sends one from ``update_options``) dropped the audio held and the turn under way: its
    speech_started had gone out and no transcript ever came, and the rest of the sentence
    came back alone. Now, the format and server VAD unchanged, the turn goes on: one
    transcript with all of JFK's words."""
    jfk = clips()[0].samples
    half = int(5.2 * SAMPLE_RATE)  # mid-sentence ("...ask not what your country")
    with raw(live) as ws:
        events_until(ws, "session.created")
        one_turn = copy.deepcopy(SESSION)  # JFK's pauses are under 1.2 s: one turn
        one_turn["audio"]["input"]["turn_detection"]["silence_duration_ms"] = 1200
        assert _update(ws, one_turn)["type"] == "session.updated"
        pcm = pcm24(np.concatenate([silence(0.5), jfk[:half]]))
        for i in range(0, len(pcm), CHUNK):
            chunk = base64.b64encode(pcm[i : i + CHUNK]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        changed = copy.deepcopy(one_turn)
        changed["audio"]["input"]["transcription"]["prompt"] = "President Kennedy's inaugural."
        changed["audio"]["input"]["turn_detection"]["silence_duration_ms"] = 1100
        ws.send(json.dumps({"type": "session.update", "session": changed}))
        seen = events_until(ws, "session.updated")
        assert (
            seen[-1]["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 1100
        )
        pcm = pcm24(np.concatenate([jfk[half:], silence(1.5)]))
        for i in range(0, len(pcm), CHUNK):
            chunk = base64.b64encode(pcm[i : i + CHUNK]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        seen += events_until(ws, "conversation.item.input_audio_transcription.completed")
    started = [e for e in seen if e["type"] == "input_audio_buffer.speech_started"]
    done = seen[-1]
    assert len(started) == 1 and started[0]["item_id"] == done["item_id"], seen
    assert wer(JFK_TEXT, done["transcript"]) < 0.2, done["transcript"]


@pytest.mark.e2e
def test_a_turn_keeps_the_silence_that_ended_it(live: Server) -> None:
    """Whisper needs to hear a sentence finish: a turn cut at the end of its speech was
    transcribed at 7.5 % WER on the live bench against 4.3 % with the silence after it
    (bench/README.md), and since a turn was made to end where VAD heard it end (so that one
    message of seconds could hold several turns) it was cut there again. It keeps the
    silence that ended it now, up to a second: JFK's turn is its speech, the 300-ms prefix
    and the second of silence that ended it."""
    jfk = clips()[0].samples
    one_turn = copy.deepcopy(SESSION)
    one_turn["audio"]["input"]["turn_detection"]["silence_duration_ms"] = 1200
    with raw(live) as ws:
        events_until(ws, "session.created")
        assert _update(ws, one_turn)["type"] == "session.updated"
        pcm = pcm24(np.concatenate([silence(0.5), jfk, silence(2.0)]))
        for i in range(0, len(pcm), 4 * CHUNK):  # 400 ms a message
            chunk = base64.b64encode(pcm[i : i + 4 * CHUNK]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        seen = events_until(ws, "conversation.item.input_audio_transcription.completed")
    started = next(e for e in seen if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e["type"] == "input_audio_buffer.speech_stopped")
    speech_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
    heard_ms = 1000 * seen[-1]["usage"]["seconds"]
    assert heard_ms >= speech_ms + 300 + 1000 - 40, (heard_ms, speech_ms)
    assert wer(JFK_TEXT, seen[-1]["transcript"]) < 0.2, seen[-1]["transcript"]


@pytest.mark.e2e
def test_wrong_shapes_and_unknown_languages_are_invalid_requests_naming_the_field(
    live: Server,
) -> None:
    cases = [
        ({"audio": {"input": {"format": ["audio/pcm"]}}}, "session.audio.input.format"),
        ({"audio": "pcm"}, "session.audio"),
        ({"audio": {"input": {"transcription": "whisper-1"}}}, "transcription"),
        ({"audio": {"input": {"transcription": {"language": "zz"}}}}, "language"),
        ({"audio": {"input": {"transcription": {"languages": ["en", "zz"]}}}}, "languages"),
        ({"audio": {"input": {"transcription": {"keywords": "one"}}}}, "keywords"),
        ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}, "noise_reduction"),
        ({"audio": {"input": {"turn_detection": ["server_vad"]}}}, "turn_detection"),
    ]
    with raw(live) as ws:
        events_until(ws, "session.created")
        for session, field in cases:
            ev = _update(ws, session)
            assert ev["type"] == "error", (session, ev)
            assert ev["error"]["type"] == "invalid_request_error", ev
            assert field in ev["error"]["message"], (field, ev)
        for legacy in ({"input_audio_transcription": "x"}, {"input_audio_format": 7}):
            ev = _update(ws, legacy, "transcription_session.update")
            assert ev["error"]["type"] == "invalid_request_error", ev
        # The session still serves: a valid update after all of them.
        assert _update(ws, {"audio": {"input": {}}})["type"] == "session.updated"
    assert "Traceback" not in live.logs() and "an event failed" not in live.logs()


@pytest.mark.e2e
def test_a_deeply_nested_event_is_refused_with_an_error_and_a_close_code(live: Server) -> None:
    from websockets.exceptions import ConnectionClosed

    with raw(live) as ws:
        events_until(ws, "session.created")
        # 60 kB, under this server's message cap (the probe's was 400 kB under the default)
        ws.send("[" * 30_000 + "]" * 30_000)
        ev = json.loads(ws.recv(timeout=30))
        assert ev["type"] == "error" and ev["error"]["code"] == "invalid_event", ev
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "nested" in live.logs()
    with raw(live) as ws:  # the server goes on
        events_until(ws, "session.created")


def completed_events(conn: Any, audio: np.ndarray, deltas: list | None = None) -> list[Any]:
    """The completed transcripts of ``audio`` (16 kHz) fed to a connection of the openai
    SDK's realtime client as 24-kHz PCM, until the feeding is over and one has come (and
    the delta events into ``deltas``, where given)."""
    completed: list[Any] = []
    feeder = threading.Thread(target=feed, args=(conn.input_audio_buffer.append, pcm24(audio)))
    feeder.start()
    deadline = time.time() + 120
    while time.time() < deadline and not (completed and not feeder.is_alive()):
        ev = conn.recv()
        if ev.type == "conversation.item.input_audio_transcription.completed":
            completed.append(ev)
        elif ev.type == "conversation.item.input_audio_transcription.delta" and deltas is not None:
            deltas.append(ev)
        assert ev.type != "error" or ev.error.code == "idle_timeout", ev
    feeder.join()
    return completed


@pytest.mark.e2e
def test_a_session_with_word_alignment_gets_timed_words_in_each_transcript(live: Server) -> None:
    """Our extension of the session: ``transcription.word_alignment`` makes each completed
    transcript carry its words, timed (by the forced aligner) on the session's clock."""
    jfk = clips()[0]
    audio = np.concatenate([silence(0.5), jfk.samples, silence(1.5)])
    session = copy.deepcopy(SESSION)
    session["audio"]["input"]["transcription"]["word_alignment"] = "forced"  # type: ignore[index]
    client = live.client()
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(
            session={**session, "audio": {"input": {"transcription": {"word_alignment": "best"}}}}
        )  # type: ignore[arg-type]
        refused = conn.recv()
        assert refused.type == "error" and "word_alignment" in refused.error.message
        conn.session.update(session=session)  # type: ignore[arg-type]
        updated = conn.recv().model_dump()
        assert updated["session"]["audio"]["input"]["transcription"]["word_alignment"] == "forced"
        completed = [ev.model_dump() for ev in completed_events(conn, audio)]
    assert completed
    spoken = [w for c in completed for w in c["words"]]
    assert all(c["word_alignment"] == "forced" for c in completed)
    assert " ".join(w["word"] for w in spoken) == " ".join(c["transcript"] for c in completed)
    starts = [w["start"] for w in spoken]
    assert starts == sorted(starts) and all(w["start"] <= w["end"] for w in spoken)
    # JFK's first word begins 0.29 s into the clip, which starts 0.5 s into the stream.
    assert 0.6 <= spoken[0]["start"] <= 1.0, spoken[:3]
    assert spoken[-1]["end"] <= len(audio) / 16000


def test_timed_words_are_written_as_the_transcript_writes_them() -> None:
    item = LiveItem("item_1", 2000)
    item.agreed_delta("that agent".split())
    item.agreed_delta("that agent is".split())
    _, text = item.final("That agent is already logged on.".split())
    timed = [
        {"word": " " + w, "start": 0.1 * i, "end": 0.1 * i + 0.05}
        for i, w in enumerate("That agent is already logged on.".split())
    ]
    out = item.timed_words({"words": timed, "word_alignment": "forced"})
    assert " ".join(w["word"] for w in out["words"]) == text
    assert out["words"][0] == {"word": "that", "start": 2.0, "end": 2.05}


class NaiveBuffer:
    """The live buffer as it was (a concatenation per append): the reference."""

    def __init__(self) -> None:
        self.samples = np.empty(0, dtype=np.float32)
        self.start_ms = self.received_ms = 0

    def add(self, samples: np.ndarray) -> None:
        self.samples = np.concatenate([self.samples, samples])
        self.received_ms += len(samples) * 1000 // 16000

    def between(self, from_ms: int, to_ms: int) -> np.ndarray:
        a = max(0, (from_ms - self.start_ms) * 16)
        return self.samples[a : max(a, (to_ms - self.start_ms) * 16)]

    def take(self, from_ms: int, to_ms: int) -> np.ndarray:
        out = self.between(from_ms, to_ms).copy()
        self.samples = self.samples[max(0, (to_ms - self.start_ms) * 16) :]
        self.start_ms = to_ms
        return out

    def keep_last(self, keep_s: float) -> None:
        keep = int(keep_s * 16000)
        if len(self.samples) > 2 * keep:
            cut = len(self.samples) - keep
            self.samples = self.samples[cut:]
            self.start_ms += cut * 1000 // 16000

    def clear(self) -> None:
        self.samples = np.empty(0, dtype=np.float32)
        self.start_ms = self.received_ms


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 9000)),
            st.tuples(st.just("take"), st.integers(0, 100)),
            st.tuples(st.just("keep"), st.integers(0, 100)),
            st.tuples(st.just("clear"), st.just(0)),
        ),
        max_size=60,
    )
)
def test_the_live_buffer_holds_what_a_concatenation_would(ops: list[tuple[str, int]]) -> None:
    from handler.faces.realtime.buffer import LiveBuffer

    live, ref, counter = LiveBuffer(), NaiveBuffer(), 0
    for op, n in ops:
        if op == "add":
            chunk = np.arange(counter, counter + n, dtype=np.float32)
            counter += n
            live.add(chunk)
            ref.add(chunk)
        elif op == "take":  # a commit: up to n % of what was received since the start
            to_ms = ref.start_ms + (ref.received_ms - ref.start_ms) * n // 100
            assert np.array_equal(live.take(ref.start_ms, to_ms), ref.take(ref.start_ms, to_ms))
        elif op == "keep":
            live.keep_last(n / 100)
            ref.keep_last(n / 100)
        else:
            live.clear()
            ref.clear()
        assert (live.start_ms, live.received_ms, len(live)) == (
            ref.start_ms,
            ref.received_ms,
            len(ref.samples),
        )
        assert np.array_equal(live.samples, ref.samples)
        ends = (ref.start_ms, ref.received_ms)
        assert np.array_equal(live.between(*ends), ref.between(*ends))


def test_a_long_turn_in_20_ms_chunks_is_not_copied_at_every_append() -> None:
    """Each append concatenated the whole turn held, on the event loop every session
    shares: a 120-s turn in 20-ms chunks (as LiveKit sends) copied 23 GB, growing with the
    square of the turn. Now the buffer grows by doubling: a few copies."""
    from handler.faces.realtime.buffer import LiveBuffer

    live, chunk, copies = LiveBuffer(), np.zeros(320, np.float32), 0
    held = live.samples
    for _ in range(120 * 50):
        live.add(chunk)
        if not np.shares_memory(held, live.samples):  # moved: what was held was copied
            copies += 1
        held = live.samples
    assert len(live) == 120 * 16000
    assert copies < 20, copies


@pytest.mark.e2e
def test_logprobs_in_each_completed_transcript_when_included(live: Server) -> None:
    """The probe: ``include: ["item.input_audio_transcription.logprobs"]`` (Pipecat's
    realtime service sends it) was accepted and answered with no logprobs and
    ``include: null``. Now each completed transcript carries them, one per word, through
    the openai SDK's own event type, and each delta those of its words (they were on the
    completed event alone: a client that reads a delta's confidence got none)."""
    jfk = clips()[0]
    audio = np.concatenate([silence(0.5), jfk.samples, silence(1.5)])
    session = {**copy.deepcopy(SESSION), "include": ["item.input_audio_transcription.logprobs"]}
    with live.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session=session)  # type: ignore[arg-type]
        updated = conn.recv().model_dump()
        assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]
        deltas: list[Any] = []
        completed = completed_events(conn, audio, deltas)
    assert completed and all(c.logprobs for c in completed)
    assert deltas and all(d.logprobs for d in deltas), deltas
    for d in deltas:
        assert len(d.logprobs) == len(d.delta.split()), d
        assert wer(d.delta, "".join(lp.token for lp in d.logprobs)) < 0.2, d
    for c in completed:
        said = "".join(lp.token for lp in c.logprobs)
        assert wer(c.transcript, said) < 0.2, (c.transcript, said)
        assert all(lp.logprob <= 0 for lp in c.logprobs)
    assert "words" not in completed[0].model_dump()  # timed words only with word_alignment
