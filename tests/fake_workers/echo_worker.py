"""A real runpod SDK worker with a trivial handler, for testing the emulator.

FAKE_MODE=async (default): an async handler whose job input picks the behaviour:
{"sleep": s} waits, {"progress": p} posts a progress update first, {"error": "msg"}
returns an error result, {"raise": "msg"} raises, {"big": n} returns n bytes of text;
anything else is echoed back as {"echo": input}.
FAKE_MODE=gen: an async generator yielding {"i": k} for k < input["items"], with
return_aggregate_stream on. FAKE_CONCURRENCY=n: hold up to n jobs at once (the SDK
then asks with job-take-batch).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import runpod


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    job_input = job["input"]
    if "progress" in job_input:
        runpod.serverless.progress_update(job, job_input["progress"])
    if job_input.get("sleep"):
        await asyncio.sleep(float(job_input["sleep"]))
    if "error" in job_input:
        return {"error": job_input["error"], "detail": "from echo_worker"}
    if "raise" in job_input:
        raise RuntimeError(job_input["raise"])
    if "big" in job_input:
        return {"blob": "x" * int(job_input["big"])}
    return {"echo": job_input}


async def generator_handler(job: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for k in range(int(job["input"].get("items", 3))):
        await asyncio.sleep(float(job["input"].get("gap", 0.05)))
        yield {"i": k}


if __name__ == "__main__":
    if os.environ.get("FAKE_MODE") == "gen":
        runpod.serverless.start({"handler": generator_handler, "return_aggregate_stream": True})
    else:
        concurrency = int(os.environ.get("FAKE_CONCURRENCY", "1"))
        runpod.serverless.start(
            {"handler": handler, "concurrency_modifier": lambda current: concurrency}
        )
