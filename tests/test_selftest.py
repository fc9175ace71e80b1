"""The speech self-test and the driver floor (handler.inference.selftest).

No GPU is here, so the two GPU-only conditions are substituted, and said so where they
are: the driver's reading comes from a folder laid out as ``/proc/driver/nvidia`` (its
real format), and "a model that answers empty" is the real tiny.en given a clip of
silence in place of the bundled speech (through WHISPER_SELF_TEST_CLIP), so the failure
path runs for real, through each face: the CLI's load, HTTP mode (/ready and /ping 503
with the reason, the server stays up and never serves), the queue worker under the real
runpod SDK loop (its fitness check reports the worker unhealthy to the emulator, with the
check's name and the reason, and the process exits 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import requests

from handler.inference import selftest
from handler.inference.models import ModelLoadError
from handler.settings import load_settings
from handler.startup import StartupTimes, prepare, start_worker
from runpod_emulator import Emulator
from tests.helpers import wait_for
from tests.test_http import ROOT, free_port

VERSION_550 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)


def fake_proc(tmp: Path, version_text: str, gpu: str = "NVIDIA L4") -> Path:
    """A folder laid out as /proc/driver/nvidia (no driver here: substituted)."""
    (tmp / "gpus" / "0000:00:03.0").mkdir(parents=True)
    (tmp / "version").write_text(version_text)
    (tmp / "gpus" / "0000:00:03.0" / "information").write_text(
        f"Model: \t\t {gpu}\nIRQ:   \t\t 40\nGPU UUID: \t GPU-0\n"
    )
    return tmp


def test_the_driver_is_read_and_one_below_the_floor_refused(tmp_path: Path) -> None:
    old = selftest.read_driver(fake_proc(tmp_path / "a", VERSION_550))
    assert old.version == "550.54.14" and old.gpus == ("NVIDIA L4",) and old.branch == 550
    sentence = selftest.driver_refusal(old)
    assert sentence is not None and "550.54.14" in sentence and "R570" in sentence
    new = VERSION_550.replace("550.54.14", "570.133.20")
    assert selftest.driver_refusal(selftest.read_driver(fake_proc(tmp_path / "b", new))) is None
    assert selftest.read_driver(tmp_path / "none") == selftest.Driver(None, ())
    assert selftest.driver_refusal(selftest.Driver(None, ())) is None
    # The sentence names the variant whose CTranslate2 runs on that driver.
    assert "WHISPER_IMAGE=cuda-r550" in sentence
    r535 = selftest.Driver("535.230.02", ("NVIDIA L4",))
    assert "WHISPER_IMAGE=cuda-r535" in (selftest.driver_refusal(r535) or "")
    assert "no image variant" in (selftest.driver_refusal(selftest.Driver("525.1", ())) or "")


def test_the_floor_follows_the_ctranslate2_the_image_carries() -> None:
    """CTranslate2's wheels: 4.5.0-4.6.0 built with CUDA 12.2, 4.6.1-4.6.2 with 12.4, 4.6.3 on
    with 12.8 (its build script at each tag); the installed one (4.8 here) needs R570."""
    assert selftest.cuda_floor("4.8.5") == ("12.8", 570) == selftest.cuda_floor()
    assert selftest.cuda_floor("4.6.3") == ("12.8", 570)
    assert selftest.cuda_floor("4.6.2") == ("12.4", 550)
    assert selftest.cuda_floor("4.6.0") == ("12.2", 535)
    on_r535 = selftest.Driver("535.230.02", ("NVIDIA L4",))
    assert selftest.driver_refusal(on_r535, ct2="4.6.0") is None
    assert selftest.driver_refusal(on_r535, ct2="4.6.2") is not None


def test_start_up_refuses_an_old_driver_in_one_sentence(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(selftest, "PROC", fake_proc(tmp_path, VERSION_550))
    with pytest.raises(ModelLoadError) as refused:
        prepare(StartupTimes(), load_settings({"WHISPER_DEVICE": "cuda"}))
    assert str(refused.value).startswith("the host's NVIDIA driver 550.54.14 (NVIDIA L4)")
    prepare(StartupTimes(), load_settings({"WHISPER_DEVICE": "cpu"}))  # the CPU: no check


def test_the_share_of_words_found() -> None:
    assert selftest.share_found(selftest.TEXT, "and so my fellow americans ask not") > 0.4
    assert selftest.share_found(selftest.TEXT, selftest.TEXT.upper()) == 1.0
    assert selftest.share_found(selftest.TEXT, "") == 0.0
    assert selftest.share_found("you you", "you") == 0.5


def silence(path: Path, seconds: float = 8.0) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(int(seconds * 16000), np.int16).tobytes())
    return path


def broken_env(tmp_path: Path) -> dict[str, str]:
    """A real model whose self-test hears nothing (silence for the speech clip)."""
    return {
        "WHISPER_SELF_TEST_CLIP": str(silence(tmp_path / "silence.wav")),
        "WHISPER_SELF_TEST_TEXT": selftest.TEXT,
    }


@pytest.mark.model
def test_a_real_model_passes_and_one_that_hears_nothing_never_serves(tmp_path: Path) -> None:
    times_ok = start_worker(load_settings({"WHISPER_DEVICE": "cpu"}))
    assert times_ok.pool.names == ["tiny.en"]
    with pytest.raises(selftest.SelfTestFailed) as failed:
        start_worker(load_settings({"WHISPER_DEVICE": "cpu", **broken_env(tmp_path)}))
    message = str(failed.value)
    assert "speech self-test failed: model tiny.en (instance 0)" in message
    assert "no NVIDIA driver" in message and "CTranslate2 4." in message
    assert "compute type int8" in message and "will not serve" in message
    with pytest.raises(Exception, match="go together"):
        load_settings({"WHISPER_SELF_TEST_CLIP": "x.wav"})


@pytest.mark.model
@pytest.mark.e2e
def test_http_mode_answers_503_with_the_reason_and_never_serves(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WHISPER_")},
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "WHISPER_DEVICE": "cpu",
        **broken_env(tmp_path),
    }
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "handler", "serve"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def failed() -> dict | None:  # (a Response is falsy when it is not 2xx)
            try:
                r = requests.get(f"{url}/ready", timeout=5)
            except requests.ConnectionError:
                return None
            return r.json() if r.status_code == 503 and r.json()["status"] == "failed" else None

        ready = wait_for(failed, 120, "/ready to say the self-test failed")
        assert "speech self-test failed" in ready["reason"]
        assert requests.get(f"{url}/ping", timeout=5).status_code == 503
        time.sleep(1)
        assert proc.poll() is None  # up, saying why, never serving
        answer = requests.post(f"{url}/v1/jobs", json={"input": {}}, timeout=30)
        assert answer.status_code == 503
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.model
@pytest.mark.e2e
def test_the_queue_worker_fails_the_platforms_fitness_check(tmp_path: Path) -> None:
    with Emulator(ping_interval_ms=1000, log_dir=str(tmp_path)).start() as emu:
        worker = emu.start_worker({"WHISPER_DEVICE": "cpu", **broken_env(tmp_path)})
        emu.wait_worker(worker, "stopped", 120)
        assert emu.exit_code(worker) == 1
        report = emu.state.workers[worker].unhealthy
        assert report is not None and report["check"] == "speech_self_test", report
        assert "speech self-test failed: model tiny.en" in report["reason"], report
        assert emu.state.health()["workers"]["unhealthy"] == 1
        assert emu.queue_length() == 0


@pytest.mark.model
def test_a_gpu_that_answers_empty_in_service_fails_the_job_retryably(monkeypatch) -> None:
    """No GPU here: the pool says "cuda" and the real model's segments lose their text
    after the real VAD and decode ran (the substitution); everything else is real."""
    import base64

    from handler.inference import transcribe
    from handler.pipeline.job import run_job
    from speech_assets.clips import long_clip, wav_bytes

    worker = start_worker(load_settings({"WHISPER_DEVICE": "cpu", "WHISPER_SELF_TEST": "false"}))
    clip = long_clip(45)
    job = {"audio_base64": base64.b64encode(wav_bytes(clip.samples)).decode()}
    fine = run_job(job, worker)
    assert fine["text"] and "error" not in fine

    def blanked(real):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            tr = real(*args, **kwargs)
            tr.segments = [{**seg, "text": " "} for seg in tr.segments]
            return tr

        return run

    monkeypatch.setattr(transcribe, "run", blanked(transcribe.run))
    monkeypatch.setattr(transcribe, "run_engine", blanked(transcribe.run_engine))
    on_cpu = run_job(job, worker)
    assert "error" not in on_cpu and on_cpu["text"] == ""  # the CPU: not a GPU fault
    monkeypatch.setattr(worker.pool, "device", "cuda")
    failed = run_job(job, worker)
    assert failed["error_code"] == "EMPTY_TRANSCRIPT" and failed["retryable"] is True, failed
    assert worker.refresh_wanted is True
    short = {"audio_base64": base64.b64encode(wav_bytes(long_clip(12).samples)).decode()}
    worker.refresh_wanted = False
    assert "error" not in run_job(short, worker)  # under 30 s of speech: may be music
