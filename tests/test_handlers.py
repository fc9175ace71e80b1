"""The async RunPod handlers on the real model, driven by asyncio directly (no platform)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from handler.faces.runpod_handlers import make_handlers
from handler.pipeline.runtime import Runtime
from speech_assets.clips import long_clip
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wer

pytestmark = pytest.mark.model


def test_plain_handler_returns_the_result(worker):
    handler, _ = make_handlers(worker)
    result = asyncio.run(
        handler({"id": "local_test", "input": {"audio_base64": b64(DATA / "jfk.wav")}})
    )
    assert wer(JFK_TEXT, result["text"]) <= 0.05
    assert "refresh_worker" not in result


def test_stream_handler_yields_segments_then_the_full_result(worker):
    _, stream = make_handlers(worker)
    clip = long_clip(30)

    async def collect():
        job = {
            "id": "local_test",
            "input": {"audio_base64": base64.b64encode(clip.wav_bytes()).decode()},
        }
        return [item async for item in stream(job)]

    items = asyncio.run(collect())
    partial, final = items[:-1], items[-1]
    assert len(partial) >= 2 and all(set(i) == {"segment"} for i in partial)
    joined = " ".join(i["segment"]["text"].strip() for i in partial)
    assert joined == final["text"]
    assert final["segments"] and final["timings"]["total"] > 0


def test_a_multichannel_jobs_streamed_segments_say_their_channel(worker, tmp_path):
    from tests.media import write_call_wav

    _, stream = make_handlers(worker)
    job = {"audio_base64": b64(write_call_wav(tmp_path / "call.wav")), "multichannel": True}

    async def collect():
        return [item async for item in stream({"id": "local_test", "input": job})]

    items = asyncio.run(collect())
    partial, final = items[:-1], items[-1]
    assert sorted(i["segment"]["channel"] for i in partial) == [0, 0, 1], partial
    assert [s["channel"] for s in final["segments"]] == [0, 1, 0]


def test_stream_handler_error_carries_the_code(worker):
    _, stream = make_handlers(worker)

    async def collect():
        return [i async for i in stream({"id": "x", "input": {"audio_base64": "%%%"}})]

    items = asyncio.run(collect())
    assert items == [{"error": items[0]["error"]}]
    assert items[0]["error"].startswith("INVALID_BASE64: ")


def test_cancel_stops_decoding_and_frees_the_model(tiny_pool, no_leaks, caplog):
    caplog.set_level("INFO")
    w = Runtime(settings=make_settings(device="cpu"), pool=tiny_pool)
    handler, _ = make_handlers(w)
    model = tiny_pool.get(None)
    slots_before = model.slots.qsize()
    # Sequential and five minutes long: still decoding when the cancel comes at 1.5 s on a
    # fast machine too (batched, two minutes were done in 1.5 s on an idle one).
    clip = long_clip(300)
    job = {
        "id": "j",
        "input": {"audio_base64": base64.b64encode(clip.wav_bytes()).decode(), "batch_size": 1},
    }

    async def run_and_cancel():
        task = asyncio.create_task(handler(job))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the thread notices at the next segment; wait for it to end the job
        for _ in range(150):
            if w.jobs_done:
                break
            await asyncio.sleep(0.1)

    asyncio.run(run_and_cancel())
    assert model.slots.qsize() == slots_before
    assert w.jobs_done == 1
    assert "job j failed: CANCELLED" in caplog.text  # stopped, not run to the end


def test_refresh_after_n_jobs(tiny_pool):
    w = Runtime(settings=make_settings(device="cpu", refresh_after_jobs=2), pool=tiny_pool)
    handler, _ = make_handlers(w)
    job = {"id": "j", "input": {"audio_base64": b64(DATA / "jfk.mp3")}}
    first = asyncio.run(handler(job))
    second = asyncio.run(handler(job))
    assert "refresh_worker" not in first and second["refresh_worker"] is True


def test_refresh_when_memory_grows_past_the_bound(tiny_pool):
    w = Runtime(settings=make_settings(device="cpu", max_rss_mb=1), pool=tiny_pool)
    handler, _ = make_handlers(w)
    result = asyncio.run(handler({"id": "j", "input": {"audio_base64": b64(DATA / "jfk.mp3")}}))
    assert result["refresh_worker"] is True


@pytest.mark.parametrize("batch_size", [1, 8])
def test_gpu_oom_is_retryable_and_refreshes_the_worker(tiny_pool, monkeypatch, batch_size):
    """No GPU here: the CUDA out-of-memory error is raised by a stand-in for the model call
    (the sequential transcribe, or the engine's batched decode), with CTranslate2's real
    message text. Everything around it is real."""
    from handler.inference import fw_batch

    w = Runtime(settings=make_settings(device="cpu", batch_size=batch_size), pool=tiny_pool)
    model = tiny_pool.get(None)
    instance = model.slots.get()
    model.slots.put(instance)

    def oom(*_a, **_k):
        raise RuntimeError("CUDA failed with error out of memory")

    monkeypatch.setattr(type(instance), "transcribe", oom)
    monkeypatch.setattr(fw_batch, "decode_batch", oom)
    handler, _ = make_handlers(w)
    result = asyncio.run(handler({"id": "j", "input": {"audio_base64": b64(DATA / "jfk.mp3")}}))
    assert result["error_code"] == "GPU_OOM" and result["retryable"] is True
    assert result["refresh_worker"] is True
