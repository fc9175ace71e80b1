"""A real runpod SDK worker that answers like the transcription worker, for client tests.

The "transcript" of inline audio is the file's bytes read as UTF-8 (of a URL: the URL),
so tests choose the text. Job input fields `fake_sleep` (seconds), `fake_progress`
(percents posted one by one, `fake_gap` seconds apart) and `fake_error` (an error code)
steer it; every other field comes back in `received`.

FAKE_MODE=async (default): an async handler, up to 4 jobs at once.
FAKE_MODE=gen: an async generator yielding one `{"segment": ...}` per word, `fake_gap`
seconds apart, then the full result, with return_aggregate_stream, as the worker does
with WHISPER_STREAM=true.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from typing import Any

import runpod


def _text(job_input: dict[str, Any]) -> str:
    if "audio_base64" in job_input:
        return base64.b64decode(job_input["audio_base64"]).decode("utf-8", "replace")
    return str(job_input.get("audio_url"))


def _segments(text: str) -> list[dict[str, Any]]:
    return [
        {"id": i, "start": float(i), "end": float(i + 1), "text": " " + word}
        for i, word in enumerate(text.split())
    ]


def _result(job_input: dict[str, Any], segments: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "text": "".join(s["text"] for s in segments).strip(),
        "language": "en",
        "received": {k: v for k, v in job_input.items() if k != "audio_base64"},
    }
    wanted = job_input.get("output") or ["text", "segments"]
    if "segments" in wanted:
        result["segments"] = segments
    if "srt" in wanted:
        result["srt"] = "".join(
            f"{s['id'] + 1}\n00:00:0{s['start']:.0f},000 --> 00:00:0{s['end']:.0f},000\n"
            f"{s['text'].strip()}\n\n"
            for s in segments
        )
    return result


def _error(job_input: dict[str, Any]) -> dict[str, Any]:
    return {"error": "fake failure", "error_code": job_input["fake_error"], "retryable": False}


async def _progress(job: dict[str, Any]) -> None:
    gap = float(job["input"].get("fake_gap", 0.2))
    for percent in job["input"].get("fake_progress", []):
        runpod.serverless.progress_update(job, {"progress": percent})
        await asyncio.sleep(gap)


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    job_input = job["input"]
    await _progress(job)
    if job_input.get("fake_sleep"):
        await asyncio.sleep(float(job_input["fake_sleep"]))
    if "fake_error" in job_input:
        return _error(job_input)
    return _result(job_input, _segments(_text(job_input)))


async def generator_handler(job: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    job_input = job["input"]
    gap = float(job_input.get("fake_gap", 0.2))
    if "fake_error" in job_input:
        # What the streaming worker yields: the SDK keeps only the string.
        yield {"error": f"{job_input['fake_error']}: fake failure"}
        return
    segments = _segments(_text(job_input))
    progress = list(job_input.get("fake_progress", []))
    for seg in segments:
        if progress:
            runpod.serverless.progress_update(job, {"progress": progress.pop(0)})
        await asyncio.sleep(gap)
        yield {"segment": seg}
    yield _result(job_input, segments)


if __name__ == "__main__":
    if os.environ.get("FAKE_MODE") == "gen":
        runpod.serverless.start(
            {
                "handler": generator_handler,
                "return_aggregate_stream": True,
                "concurrency_modifier": lambda _current: 4,
            }
        )
    else:
        runpod.serverless.start({"handler": handler, "concurrency_modifier": lambda _current: 4})
