"""CUDA checks (gpu tier): skipped on machines without a GPU, run as-is on one.

`python -m pytest -m gpu tests/test_gpu.py` on a CUDA host checks the defaults a GPU
deployment gets (float16, the batched pipeline, two jobs on one device, the GPU_OOM path
is not hit by normal work) with the small tiny.en model from PyPI.
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from handler.faces.runpod_handlers import make_handlers
from handler.inference.models import cuda_device_count
from handler.pipeline.job import run_job
from handler.startup import start_worker
from speech_assets.clips import long_clip
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def gpu_worker():
    settings = make_settings(device="auto", num_workers=2, warmup="true")
    return start_worker(settings)


def test_auto_picks_cuda_float16(gpu_worker):
    assert gpu_worker.pool.device == "cuda" and gpu_worker.pool.compute == "float16"


def test_jfk_on_the_gpu(gpu_worker):
    result = run_job({"audio_base64": b64(DATA / "jfk.wav")}, gpu_worker)
    assert "error" not in result, result
    assert wer(JFK_TEXT, result["text"]) <= 0.05 and result["device"] == "cuda"


def test_batched_on_the_gpu(gpu_worker):
    clip = long_clip(120)
    job = {"audio_base64": base64.b64encode(clip.wav_bytes()).decode()}
    seq = run_job(job, gpu_worker)
    batched = run_job({**job, "batch_size": 16}, gpu_worker)
    assert "error" not in batched, batched
    assert wer(clip.text, batched["text"]) < wer(clip.text, seq["text"]) + 0.05


def test_two_jobs_share_one_device(gpu_worker):
    handler, _ = make_handlers(gpu_worker)
    job = {"id": "g", "input": {"audio_base64": b64(DATA / "jfk.mp3")}}

    async def both():
        return await asyncio.gather(handler(job), handler(job))

    for result in asyncio.run(both()):
        assert wer(JFK_TEXT, result["text"]) <= 0.05
