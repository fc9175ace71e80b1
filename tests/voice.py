"""Voice-agent frameworks' STT services driven as their users run them, for the live faces
whose tests share them (Deepgram's, AssemblyAI's): Pipecat inside a real pipeline, LiveKit
Agents' stream outside an agent's job. Real speech, faster than real time; generous
deadlines, so that a loaded machine only makes them slower."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from speech_assets.clips import wer

RATE = 16000


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def until(ws: Any, kind: str, timeout: float = 120) -> list[dict[str, Any]]:
    """The JSON messages a live socket sends, up to the first of ``type`` ``kind``."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        got.append(message)
        if message["type"] == kind:
            return got
    raise AssertionError(f"no {kind} in {got}")


def pipecat_collector(
    finals: list[str],
    errors: list[str],
    interim: list[str] | None = None,
    frames: list[Any] | None = None,
) -> type:
    """A Pipecat processor that notes the final transcripts, errors (and interim text, and
    the final transcripts' frames) it sees and passes every frame on: put before the
    service (errors go up) and after it."""
    from pipecat.frames.frames import ErrorFrame, InterimTranscriptionFrame, TranscriptionFrame
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

    class Collect(FrameProcessor):
        async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TranscriptionFrame):
                finals.append(frame.text)
                if frames is not None:
                    frames.append(frame)
            elif isinstance(frame, InterimTranscriptionFrame) and interim is not None:
                interim.append(frame.text)
            elif isinstance(frame, ErrorFrame):
                errors.append(frame.error)
            await self.push_frame(frame, direction)

    return Collect


def pipecat_turns(
    make_stt: Callable[[], Any],
    connected: Callable[[Any], bool],
    spoken: list[Any],
    tail_s: float = 0.5,
    frames: list[Any] | None = None,
) -> tuple[list[str], list[str]]:
    """(Pipecat's final transcripts, its errors) for ``spoken``'s clips, each a turn between
    VAD start and stop frames (what its own VAD sends), with ``tail_s`` of silence after it;
    each turn waits until 80 % of the words spoken so far were heard. ``connected(stt)``
    says when the service's socket is open (the services name it differently); ``frames``
    gets the final transcripts' frames."""
    from pipecat.frames.frames import (
        EndFrame,
        InputAudioRawFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    finals: list[str] = []
    errors: list[str] = []
    Collect = pipecat_collector(finals, errors, frames=frames)

    async def talk() -> None:
        stt = make_stt()
        worker = PipelineWorker(
            Pipeline([Collect(), stt, Collect()]), params=PipelineParams(audio_in_sample_rate=RATE)
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not connected(stt) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert connected(stt), "Pipecat never connected"
        for n, clip in enumerate(spoken, 1):
            await worker.queue_frame(VADUserStartedSpeakingFrame())
            audio = pcm16(np.concatenate([clip.samples, np.zeros(int(tail_s * RATE), np.float32)]))
            for i in range(0, len(audio), 6400):  # 200 ms a frame, 4x real time
                await worker.queue_frame(InputAudioRawFrame(audio[i : i + 6400], RATE, 1))
                await asyncio.sleep(0.05)
            await worker.queue_frame(VADUserStoppedSpeakingFrame())
            heard_by = len(" ".join(c.text for c in spoken[:n]).split())
            deadline = loop.time() + 120
            while loop.time() < deadline and not errors:
                if len(" ".join(finals).split()) >= 0.8 * heard_by:
                    break
                await asyncio.sleep(0.1)
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)

    asyncio.run(asyncio.wait_for(talk(), 400))
    return finals, errors


def livekit_events(make_stt: Callable[[], Any], audio: np.ndarray, reference: str) -> list[Any]:
    """LiveKit's speech events for ``audio`` pushed as 20-ms frames (as its rooms deliver
    them) at 4x real time, until its final transcripts say ``reference`` (WER < 0.25)."""
    from livekit import rtc
    from livekit.agents import stt as agents_stt
    from livekit.agents.utils import http_context

    events: list[Any] = []

    def finals() -> str:
        kind = agents_stt.SpeechEventType.FINAL_TRANSCRIPT
        return " ".join(e.alternatives[0].text for e in events if e.type == kind)

    async def talk() -> None:
        async with http_context.open():  # LiveKit's way for scripts outside an agent's job
            stt = make_stt()
            stream = stt.stream()

            async def read() -> None:
                async for ev in stream:
                    events.append(ev)

            reader = asyncio.create_task(read())
            pcm = pcm16(audio)
            frame = RATE * 2 // 50  # 20 ms
            for i in range(0, len(pcm) - frame + 1, frame):
                stream.push_frame(rtc.AudioFrame(pcm[i : i + frame], RATE, 1, frame // 2))
                await asyncio.sleep(0.005)  # 4x real time
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 180
            while loop.time() < deadline and wer(reference, finals()) >= 0.25:
                await asyncio.sleep(0.1)
            await stream.aclose()
            reader.cancel()
            await stt.aclose()

    asyncio.run(asyncio.wait_for(talk(), 300))
    return events


def no_error_logged(logs: str) -> None:
    """A server log with no traceback and no ERROR line (the part a test produced)."""
    where = max(logs.find("Traceback"), logs.find(" ERROR "))
    assert where < 0, logs[max(0, where - 1000) : where + 3000]
