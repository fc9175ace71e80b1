"""Voice-agent frameworks as their users run them, against ``/v1/realtime``.

The clients are the real packages from PyPI, configured the way their docs show, with only
the base URL pointed at the worker (``python -m handler serve`` on 127.0.0.1 with tiny.en):

- Pipecat's ``OpenAIRealtimeSTTService`` with its defaults (model ``gpt-realtime-whisper``,
  no server VAD: the pipeline's VAD frames commit each turn, 16-kHz audio upsampled by
  Pipecat to 24 kHz) plus ``noise_reduction``, inside a real Pipecat pipeline;
- LiveKit Agents' OpenAI plugin ``STT(use_realtime=True)`` in its two streaming modes:
  ``gpt-4o-transcribe`` with server VAD, and ``gpt-transcribe`` with ``languages``,
  ``keywords`` and ``noise_reduction_type``.

Both frameworks end the stream on any ``error`` event, so "no error, every turn transcribed"
is the contract. Each test sends real speech (JFK and LibriVox readings) as several turns,
faster than real time, and waits on the transcripts with generous deadlines.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from speech_assets.clips import clips, wer
from tests.test_http import Server
from tests.voice import pipecat_collector, pipecat_turns

pytestmark = pytest.mark.e2e

TURNS = 3


@pytest.fixture(scope="module")
def live() -> Iterator[Server]:
    srv = Server({"WHISPER_MAX_CONCURRENCY": "2", "WHISPER_REALTIME_MAX_SESSIONS": "2"})
    yield srv
    srv.stop()


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


async def wait_until(done: Any, seconds: float = 120) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not done() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


async def settled(count: Any, seconds: float, quiet: float = 3.0) -> None:
    """Wait until ``count()`` has not changed for ``quiet`` seconds (at most ``seconds``)."""
    loop = asyncio.get_running_loop()
    deadline, last, since = loop.time() + seconds, count(), loop.time()
    while loop.time() < deadline and loop.time() - since < quiet:
        await asyncio.sleep(0.1)
        if count() != last:
            last, since = count(), loop.time()


def heard(finals: list[str], spoken: list[Any]) -> bool:
    return wer(" ".join(c.text for c in spoken), " ".join(finals)) < 0.15


def assert_heard(finals: list[str], spoken: list[Any]) -> None:
    assert heard(finals, spoken), (" ".join(c.text for c in spoken), " ".join(finals))


def livekit_finals(events: list[Any]) -> list[str]:
    """LiveKit's final transcripts among its speech events."""
    from livekit.agents import stt as agents_stt

    final = agents_stt.SpeechEventType.FINAL_TRANSCRIPT
    return [e.alternatives[0].text for e in events if e.type == final]


def test_pipecats_file_stt_with_probability_metrics(live: Server) -> None:
    """Pipecat's OpenAISTTService (a file per turn of its VAD) with its default model,
    ``gpt-transcribe``, and ``include_prob_metrics=True``, which asks ``include[]=logprobs``:
    refused (400) before, so every turn ended in an ErrorFrame. A confidence is read from
    each turn's logprobs as Pipecat's ``extract_openai_gpt4o_probability`` means to (it sums
    the SDK's Logprob objects themselves, a TypeError against OpenAI's API too)."""
    pytest.importorskip("pipecat", reason="pip install '.[dev]' (pipecat-ai)")
    from pipecat.services.openai.stt import OpenAISTTService

    spoken = clips()[:2]
    frames: list[Any] = []
    finals, errors = pipecat_turns(
        lambda: OpenAISTTService(
            api_key="unused", base_url=live.url + "/v1", include_prob_metrics=True
        ),
        lambda _stt: True,  # no socket: a request per turn
        spoken,
        frames=frames,
    )
    assert errors == [], errors
    assert_heard(finals, spoken)
    logprobs = [[lp.logprob for lp in f.result.logprobs] for f in frames]
    confidences = [math.exp(sum(lps) / len(lps)) for lps in logprobs if lps]
    assert len(confidences) == len(frames) >= 1, logprobs
    assert all(0.3 < c <= 1.0 for c in confidences), confidences


def test_pipecat_realtime_stt_with_its_defaults(live: Server) -> None:
    pytest.importorskip("pipecat", reason="pip install '.[dev]' (pipecat-ai)")
    from pipecat.frames.frames import (
        EndFrame,
        InputAudioRawFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService
    from pipecat.workers.runner import WorkerRunner

    finals: list[str] = []
    interim: list[str] = []
    errors: list[str] = []

    Collect = pipecat_collector(finals, errors, interim)

    async def talk(srv: Server) -> None:
        stt = OpenAIRealtimeSTTService(
            api_key="unused",
            base_url=srv.url.replace("http", "ws") + "/v1/realtime",
            settings=OpenAIRealtimeSTTService.Settings(noise_reduction="near_field"),
        )
        worker = PipelineWorker(
            Pipeline([Collect(), stt, Collect()]), params=PipelineParams(audio_in_sample_rate=16000)
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        connected = asyncio.Event()

        @stt.event_handler("on_connected")
        async def on_connected(_service: Any) -> None:
            connected.set()

        running = asyncio.create_task(runner.run())
        await asyncio.wait_for(connected.wait(), 60)
        for turn, clip in enumerate(spoken):
            await worker.queue_frame(VADUserStartedSpeakingFrame())
            audio = pcm16(np.concatenate([clip.samples, np.zeros(8000, np.float32)]))
            for i in range(0, len(audio), 6400):  # 200 ms a frame, 4x real time
                await worker.queue_frame(InputAudioRawFrame(audio[i : i + 6400], 16000, 1))
                await asyncio.sleep(0.05)
            await worker.queue_frame(VADUserStoppedSpeakingFrame())
            await wait_until(lambda n=turn: len(finals) > n or bool(errors))
            interims_of_turn.append(list(interim))
            interim.clear()
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)

    spoken = clips()[:TURNS]
    interims_of_turn: list[list[str]] = []
    before = len(live.logs())
    asyncio.run(talk(live))
    assert errors == [], errors
    assert len(finals) == TURNS, finals
    assert_heard(finals, spoken)
    # Pipecat shows interim frames as deltas: they add up to the turn's final text.
    for pieces, final in zip(interims_of_turn, finals, strict=True):
        assert pieces and "".join(pieces) == final, (pieces, final)
    assert "Traceback" not in live.logs()[before:]


async def livekit_turns(srv: Server, spoken: list[Any], **options: Any) -> list[Any]:
    from livekit import rtc
    from livekit.agents.utils import http_context
    from livekit.plugins import openai as lk_openai

    events: list[Any] = []
    # Outside an agent's job the plugin's HTTP session comes from this (LiveKit's way for
    # scripts and tests); a job's worker binds one itself.
    async with http_context.open():
        stt = lk_openai.STT(
            use_realtime=True, base_url=srv.url + "/v1", api_key="unused", **options
        )
        stream = stt.stream()

        async def read() -> None:
            async for ev in stream:
                events.append(ev)

        reader = asyncio.create_task(read())
        gap = np.zeros(24000, np.float32)  # 1.5 s: the server's VAD ends the turn
        audio = pcm16(np.concatenate([x for c in spoken for x in (c.samples, gap)]))
        frame = 16000 * 2 // 50  # 20 ms, as LiveKit's rooms deliver it
        for i in range(0, len(audio) - frame + 1, frame):
            stream.push_frame(rtc.AudioFrame(audio[i : i + frame], 16000, 1, frame // 2))
            await asyncio.sleep(0.005)  # 4x real time

        # Every turn answered (under load a turn's final can come more than the settling
        # quiet after the one before: a 3-s lull once ended the wait a turn early), then
        # nothing more in flight.
        await wait_until(lambda: heard(livekit_finals(events), spoken), 180)
        await settled(lambda: len(events), 120)
        await stream.aclose()
        reader.cancel()
        await stt.aclose()
    return events


@pytest.mark.parametrize(
    "options",
    [
        {"model": "gpt-4o-transcribe", "language": "en"},
        {
            "model": "gpt-transcribe",
            "language": ["en"],
            "keywords": ["Americans"],
            "noise_reduction_type": "far_field",
        },
    ],
    ids=["gpt-4o-transcribe-server-vad", "gpt-transcribe-languages-keywords-noise"],
)
def test_livekit_openai_plugin_streams_every_turn(live: Server, options: dict[str, Any]) -> None:
    pytest.importorskip("livekit.plugins.openai", reason="pip install '.[dev]' (livekit-agents)")
    from livekit.agents import stt as agents_stt

    spoken = clips()[:TURNS]
    before = len(live.logs())
    events = asyncio.run(livekit_turns(live, spoken, **options))
    kinds = [e.type for e in events]
    final = livekit_finals(events)
    assert agents_stt.SpeechEventType.INTERIM_TRANSCRIPT in kinds, kinds
    # LiveKit's server VAD (350-ms silence) may cut a reading into phrases: the words count.
    assert len(final) >= TURNS, final
    assert_heard(final, spoken)
    assert all(e.alternatives[0].language == "en" for e in events if e.alternatives)
    logs = live.logs()[before:]
    assert "Traceback" not in logs and " ERROR " not in logs, logs[-2000:]
