"""A job's own thresholds, judged before any decoding is paid for: ``min_speech_ratio``
here (``min_language_probability`` needs a multilingual model: tests/test_multilingual.py),
what they do not combine with, and AssemblyAI's names for both through its SDK.

Real tiny.en on JFK's speech padded with silence; the AssemblyAI SDK against the real
``python -m handler serve`` on 127.0.0.1.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from faster_whisper import decode_audio

from handler.errors import Code
from handler.faces.assemblyai import request as aai_request
from handler.pipeline.job import run_job
from tests.helpers import DATA
from tests.media import write_wav
from tests.test_http import Server

RATE = 16000
KEY = "thresholds-test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> bytes:
    """JFK's 11 s then 33 s of silence: about a quarter of it speech."""
    jfk = decode_audio(str(DATA / "jfk.wav"))
    samples = np.concatenate([jfk, np.zeros(33 * RATE, np.float32)])
    return write_wav(tmp_path_factory.mktemp("pad") / "padded.wav", samples).read_bytes()


@pytest.mark.parametrize("batch_size", [1, 4])
def test_too_little_speech_fails_before_anything_is_decoded(worker, padded, batch_size) -> None:
    job = {"audio_base64": base64.b64encode(padded).decode(), "batch_size": batch_size}
    decoded: list[Any] = []
    failed = run_job({**job, "min_speech_ratio": 0.5}, worker, on_segment=decoded.append)
    assert failed["error_code"] == Code.TOO_LITTLE_SPEECH.value and not failed["retryable"]
    assert " s of speech in 44.0 s" in failed["error"], failed
    assert decoded == []  # the VAD ran, the decoder did not
    passed = run_job({**job, "min_speech_ratio": 0.1}, worker)
    assert "error" not in passed and "country" in passed["text"], passed
    # The VAD is what measures speech: a deployment whose default is off runs it for this.
    worker.settings = worker.settings.model_copy(update={"vad_default": False})
    again = run_job({**job, "min_speech_ratio": 0.5}, worker)
    assert again.get("error_code") == Code.TOO_LITTLE_SPEECH.value, again


@pytest.mark.parametrize(
    "extra, said",
    [
        ({"min_speech_ratio": 0.2, "vad_filter": False}, "VAD"),
        ({"min_speech_ratio": 0.2, "clip_timestamps": [1.0, 5.0]}, "clip_timestamps"),
        ({"min_speech_ratio": 0.2, "multichannel": True}, "multichannel"),
        ({"min_language_probability": 0.7, "language": "multi"}, "language multi"),
        ({"min_language_probability": 0.7, "split": 3}, "split"),
        ({"min_language_probability": 1.5}, "less than or equal to 1"),
        ({"min_speech_ratio": -0.1}, "greater than or equal to 0"),
    ],
)
def test_what_a_threshold_cannot_judge_is_refused_before_fetching(worker, extra, said) -> None:
    got = run_job({"audio_url": "https://example.invalid/a.wav", **extra}, worker)
    assert got["error_code"] == "INVALID_INPUT" and said in got["error"], got


def test_assemblyais_thresholds_are_the_jobs_own() -> None:
    job, echo = aai_request.job_for(
        {"audio_url": "u", "language_confidence_threshold": 0.7, "speech_threshold": 0.2}, []
    )
    assert job["min_language_probability"] == 0.7 and job["min_speech_ratio"] == 0.2
    assert echo["language_confidence_threshold"] == 0.7  # repeated back, as AssemblyAI does
    zero, _ = aai_request.job_for({"audio_url": "u", "speech_threshold": 0}, [])
    assert "min_speech_ratio" not in zero  # 0 is no threshold
    for bad, said in (
        ({"speech_threshold": 2}, "0 to 1"),
        ({"language_confidence_threshold": "high"}, "0 to 1"),
        ({"speech_threshold": 0.5, "multichannel": True}, "multichannel"),
        ({"speech_threshold": 0.5, "audio_start_from": 1000}, "audio_start_from"),
    ):
        with pytest.raises(aai_request.Refused, match=said):
            aai_request.job_for({"audio_url": "u", **bad}, [])


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server({"WHISPER_API_KEY": KEY, "WHISPER_MAX_CONCURRENCY": "2"})
    yield srv
    srv.stop()


@pytest.mark.e2e
def test_the_assemblyai_sdk_gets_a_transcript_failed_by_its_speech_threshold(
    server: Server, padded: bytes, tmp_path
) -> None:
    import assemblyai as aai

    path = tmp_path / "padded.wav"
    path.write_bytes(padded)
    saved = aai.settings.model_copy()
    try:
        aai.settings.base_url, aai.settings.api_key = server.url, KEY
        aai.settings.polling_interval = 0.2
        strict = aai.TranscriptionConfig(speech_threshold=0.5)
        failed = aai.Transcriber(config=strict).transcribe(str(path))
        assert failed.status == "error" and "speech" in (failed.error or ""), failed.error
        raw = requests.get(
            f"{server.url}/v2/transcript/{failed.id}", headers={"Authorization": KEY}, timeout=30
        ).json()
        assert raw["error_code"] == Code.TOO_LITTLE_SPEECH.value, raw
        lenient = aai.TranscriptionConfig(speech_threshold=0.1)
        done = aai.Transcriber(config=lenient).transcribe(str(path))
        assert done.status == "completed" and "country" in (done.text or ""), done.error
    finally:
        for name in ("base_url", "api_key", "polling_interval"):
            setattr(aai.settings, name, getattr(saved, name))
