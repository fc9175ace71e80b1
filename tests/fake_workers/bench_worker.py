"""A real runpod SDK worker that stands in for the transcription worker in bench tests.

It logs a ``handler.startup: startup {...}`` line with epoch marks like the real worker
(after sleeping FAKE_STARTUP_S, split in three), then answers each job after sleeping
FAKE_RTF x the audio's duration (a 16 kHz WAV in ``audio_base64``; ``{"sleep": s}``
sleeps s instead), with the real worker's ``duration``, ``timings`` and ``text`` keys.
Input that is not a WAV fails with the worker's error shape (``error_code``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import sys
import time
import wave
from typing import Any

STARTED = time.time()

import runpod  # noqa: E402  (imported after the start mark on purpose, like the real worker)


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    job_input = job["input"]
    if "sleep" in job_input:
        duration = float(job_input["sleep"])
        work = duration
    else:
        try:
            with wave.open(io.BytesIO(base64.b64decode(job_input["audio_base64"]))) as w:
                duration = w.getnframes() / w.getframerate()
        except (KeyError, ValueError, EOFError, wave.Error):
            return {"error": "not audio", "error_code": "DECODE_FAILED", "retryable": False}
        work = duration * float(os.environ.get("FAKE_RTF", "0.05"))
    fetched = time.perf_counter()
    await asyncio.sleep(work)
    done = time.perf_counter()
    timings = {
        "fetch": fetched - start,
        "decode": 0.0,
        "queue_model": 0.0,
        "transcribe": done - fetched,
        "format": 0.0,
    }
    timings["total"] = time.perf_counter() - start
    return {"text": "fake transcript", "duration": round(duration, 3), "timings": timings}


def log_startup() -> None:
    part = float(os.environ.get("FAKE_STARTUP_S", "0")) / 3
    marks = {"process_start": STARTED}
    for name in ("imports_done", "model_loaded", "warmup_done"):
        time.sleep(part)
        marks[name] = time.time()
    marks["ready"] = time.time()
    data = {"process_start": STARTED, "marks": marks}
    print(
        f"0000-00-00 INFO handler.startup: startup {json.dumps(data)}", file=sys.stderr, flush=True
    )


if __name__ == "__main__":
    log_startup()
    concurrency = int(os.environ.get("FAKE_CONCURRENCY", "1"))
    runpod.serverless.start(
        {"handler": handler, "concurrency_modifier": lambda current: concurrency}
    )
