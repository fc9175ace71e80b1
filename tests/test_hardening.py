"""Options that could exhaust a worker or fail deep inside the model are refused up front.

Each case below was found by a probe of the worker: it built a 100-million-entry
temperature list, ran for minutes, or came back INTERNAL/retryable after the audio was
fetched and decoded. Now each is INVALID_INPUT before any audio is fetched (a local
source counts its hits), or is simply accepted (null means "not set"). A property-based
test throws generated inputs at the real pipeline on the real model.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handler.errors import RETRYABLE, Code, WorkerError
from handler.pipeline.job import run_job
from handler.schema import parse_job_input
from speech_assets.clips import long_clip, wav_bytes
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wer
from tests.httpserver import LocalServer, respond

JFK_B64 = b64(DATA / "jfk.wav")

REFUSED = {
    "temperature_increment_on_fallback 1e-8": {"temperature_increment_on_fallback": 1e-8},
    "temperature_increment_on_fallback 1e-9": {"temperature_increment_on_fallback": 1e-9},
    # A subnormal step: its count of temperatures overflowed to INTERNAL (found by hypothesis).
    "temperature_increment_on_fallback 5e-324": {"temperature_increment_on_fallback": 5e-324},
    "clip_timestamps 100000 values": {"clip_timestamps": list(range(100_000))},
    "clip_timestamps 10000-entry string": {"clip_timestamps": ",".join(["1"] * 10_000)},
    "clip_timestamps garbage": {"clip_timestamps": "garbage"},
    "clip_timestamps nan": {"clip_timestamps": "nan"},
    "clip_timestamps Infinity": {"clip_timestamps": [float("inf")]},
    "clip_timestamps 1e308": {"clip_timestamps": [1e308]},
    "clip_timestamps out of order": {"clip_timestamps": [5, 1]},
    "suppress_tokens 10**18": {"suppress_tokens": [10**18]},
    "patience 1e-300": {"patience": 1e-300},
    "max_new_tokens 448": {"max_new_tokens": 448},
    "max_new_tokens 300 with a prompt": {"max_new_tokens": 300, "initial_prompt": "hello"},
    "prefix of 500 emoji": {"prefix": "\U0001f600" * 500},
}


# The token budget (max_new_tokens, prefix) needs the model's tokenizer: tested below only.
SCHEMA_REFUSED = [n for n in REFUSED if not n.startswith(("max_new_tokens", "prefix"))]


@pytest.mark.parametrize("name", SCHEMA_REFUSED)
def test_schema_bombs_are_refused_at_once(name: str) -> None:
    """Pure tier: the schema alone."""
    t = time.perf_counter()
    with pytest.raises(Exception) as info:
        parse_job_input({"audio_base64": JFK_B64, **REFUSED[name]}).transcribe_kwargs(
            vad_default=True
        )
    assert time.perf_counter() - t < 2.0
    assert getattr(info.value, "code", None) is Code.INVALID_INPUT, info.value


@pytest.fixture
def counting_source():
    with LocalServer() as srv:
        srv.route("/a.wav", lambda h: respond(h, 200, (DATA / "jfk.wav").read_bytes()))
        yield srv


@pytest.mark.model
@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_before_any_fetch(worker, counting_source: LocalServer, name: str) -> None:
    t = time.perf_counter()
    out = run_job({"audio_url": counting_source.url("/a.wav"), **REFUSED[name]}, worker)
    assert out.get("error_code") == "INVALID_INPUT", out
    assert out["retryable"] is False
    assert counting_source.hits.get("/a.wav", 0) == 0, "the audio was fetched first"
    assert time.perf_counter() - t < 5.0


NULLABLE = [
    "beam_size",
    "patience",
    "length_penalty",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "temperature",
    "prompt_reset_on_temperature",
    "max_initial_timestamp",
    "clip_timestamps",
    "prepend_punctuations",
    "append_punctuations",
    "language",
    "initial_prompt",
    "vad_parameters",
    "temperature_increment_on_fallback",
    "suppress_tokens",
    "best_of",
    "max_new_tokens",
]


@pytest.mark.model
def test_null_means_not_set(worker) -> None:
    job = {"audio_base64": JFK_B64, "word_timestamps": True, **dict.fromkeys(NULLABLE)}
    out = run_job(job, worker)
    assert "error" not in out, out
    assert wer(out["text"], JFK_TEXT) < 0.15


@pytest.mark.model
def test_a_prompt_within_budget_still_runs(worker) -> None:
    out = run_job({"audio_base64": JFK_B64, "max_new_tokens": 128, "prefix": "And so"}, worker)
    assert "error" not in out, out


# --- property: every generated input ends as a result or a documented, honest code -----

ONE_SECOND = base64.b64encode(
    wav_bytes(
        np.concatenate(
            [np.zeros(4000, np.float32), np.sin(np.arange(12000) / 8).astype(np.float32) * 0.1]
        )
    )
).decode()

ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
OPTIONS = [
    "beam_size",
    "best_of",
    "patience",
    "length_penalty",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "temperature",
    "compression_ratio_threshold",
    "log_prob_threshold",
    "no_speech_threshold",
    "condition_on_previous_text",
    "prompt_reset_on_temperature",
    "initial_prompt",
    "prefix",
    "suppress_blank",
    "suppress_tokens",
    "without_timestamps",
    "max_initial_timestamp",
    "word_timestamps",
    "vad_filter",
    "vad_parameters",
    "max_new_tokens",
    "chunk_length",
    "clip_timestamps",
    "hallucination_silence_threshold",
    "hotwords",
    "language",
    "language_detection_threshold",
    "language_detection_segments",
    "temperature_increment_on_fallback",
    "output",
    "task",
    "batch_size",
    "transcription",
]
PLAUSIBLE = {
    "beam_size": st.integers(-1, 25),
    "best_of": st.integers(-1, 25),
    "patience": st.floats(0, 12),
    "temperature": st.floats(-1, 2) | st.lists(st.floats(0, 1), max_size=25),
    "clip_timestamps": st.lists(st.floats(-1, 20), max_size=6) | st.text(max_size=20),
    "max_new_tokens": st.integers(0, 500),
    "suppress_tokens": st.lists(st.integers(-2, 60000), max_size=4),
    "temperature_increment_on_fallback": st.floats(0, 1.5),
    "language": st.sampled_from(["en", "xx", "de", ""]),
    "prefix": st.text(max_size=40),
    "initial_prompt": st.text(max_size=40),
    "chunk_length": st.integers(-1, 40),
    "output": st.lists(st.sampled_from(["text", "srt", "bogus"]), max_size=3),
    "length_penalty": st.floats(-1, 11),
    "repetition_penalty": st.floats(0, 11),
    "no_repeat_ngram_size": st.integers(-1, 21),
    "compression_ratio_threshold": st.floats(0, 5),
    "log_prob_threshold": st.floats(-5, 1e9),
    "no_speech_threshold": st.floats(-0.5, 1.5),
    "prompt_reset_on_temperature": st.floats(-0.5, 1.5),
    "max_initial_timestamp": st.floats(-1, 40),
    "hallucination_silence_threshold": st.floats(-1, 5),
    "hotwords": st.text(max_size=40),
    "language_detection_threshold": st.floats(-0.5, 1.5),
    "language_detection_segments": st.integers(-1, 120),
    "vad_parameters": st.fixed_dictionaries(
        {},
        optional={
            "threshold": st.floats(-0.5, 1.5),
            "min_silence_duration_ms": st.integers(-10, 70000),
            "speech_pad_ms": st.integers(-10, 20000),
        },
    ),
    "task": st.sampled_from(["transcribe", "translate", "x"]),
    "batch_size": st.integers(0, 130),
    "transcription": st.sampled_from(["plain_text", "srt", "vtt", "formatted_text", "x"]),
}
BOOLEAN_OPTIONS = {
    "condition_on_previous_text",
    "suppress_blank",
    "without_timestamps",
    "word_timestamps",
    "vad_filter",
}


@st.composite
def job_inputs(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(OPTIONS), max_size=4, unique=True))
    job: dict[str, Any] = {"audio_base64": ONE_SECOND, "beam_size": 1, "vad_filter": False}
    for name in names:
        plausible = st.booleans() if name in BOOLEAN_OPTIONS else PLAUSIBLE.get(name, ANY_JSON)
        # Mostly values of the right type (they reach the model), sometimes any JSON at all.
        job[name] = draw(ANY_JSON if draw(st.integers(0, 4)) == 0 else plausible)
    return job


@pytest.mark.model
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job=job_inputs())
def test_generated_inputs_never_end_internal(worker, job: dict[str, Any]) -> None:
    out = run_job(job, worker)
    if "error" in out:
        code = Code(out["error_code"])
        assert code is not Code.INTERNAL, (job, out)
        assert out["retryable"] is (code in RETRYABLE)
        assert "Traceback" not in out["error"]
    else:
        assert isinstance(out["text"], str)


# --- compute: cancel and the budget reach inside a 30-s window --------------------------

BOMB = {
    "beam_size": 20,
    "best_of": 20,
    "patience": 10,
    "compression_ratio_threshold": 1e-4,
    "temperature": [round(i * 0.05, 2) for i in range(20)],
}


@pytest.mark.model
def test_cancel_takes_effect_within_one_model_call_at_the_worst_settings(worker) -> None:
    """The probe: a cancel sent at 2 s took effect at 143 s. Now it is checked before every
    call into the model (one window at one temperature)."""
    import threading

    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    t = time.perf_counter()
    out = run_job({"audio_base64": JFK_B64, **BOMB}, worker, cancel=cancel)
    assert out["error_code"] == "CANCELLED", out
    assert time.perf_counter() - t < 15  # measured 1.9-4.7 s on a loaded 2-core machine


@pytest.mark.model
def test_a_job_past_its_compute_budget_fails_and_frees_the_slot(worker) -> None:
    from handler.pipeline.runtime import Runtime
    from tests.helpers import make_settings

    tight = Runtime(
        settings=make_settings(device="cpu", compute_budget_floor_s=2, compute_budget_factor=0),
        pool=worker.pool,
    )
    t = time.perf_counter()
    out = run_job({"audio_base64": JFK_B64, **BOMB}, tight)
    assert out["error_code"] == "COMPUTE_BUDGET_EXCEEDED" and out["retryable"] is False, out
    assert time.perf_counter() - t < 30
    # The slot is free again: an ordinary job on the same model instance runs (with a budget
    # a busy machine cannot overrun; 2 s is the bomb's, not a real job's).
    roomy = Runtime(settings=make_settings(device="cpu"), pool=worker.pool)
    assert wer(run_job({"audio_base64": JFK_B64}, roomy)["text"], JFK_TEXT) < 0.15


def test_sdk_result_post_is_where_the_worker_wraps_it() -> None:
    """Drift test for handler/faces/result_posts.py: the pinned runpod SDK posts every result
    through rp_http._transmit(session, url, data), looked up at call time."""
    import inspect

    from runpod.serverless.modules import rp_http

    from handler.faces.result_posts import persist_result_posts

    assert list(inspect.signature(rp_http._transmit).parameters) == [
        "client_session",
        "url",
        "job_data",
    ]
    assert "await _transmit(" in inspect.getsource(rp_http._handle_result)
    original = rp_http._transmit
    try:
        assert persist_result_posts(0) is False and rp_http._transmit is original
        assert persist_result_posts(5) is True and rp_http._transmit is not original
        wrapped = rp_http._transmit
        assert persist_result_posts(5) is True and rp_http._transmit is wrapped  # once
    finally:
        rp_http._transmit = original


def test_memory_budget_waits_refuses_and_frees() -> None:
    """Admission by memory. A job that fits once others finish waits (and can be
    cancelled while it waits); one that can never fit fails at once, not retryable."""
    from handler.inference.memory import MIB, MemoryBudget, job_bytes

    budget = MemoryBudget(200 * MIB)
    with pytest.raises(WorkerError) as info:
        with budget.reserve(201 * MIB):
            pass
    assert info.value.code is Code.MEMORY_BUDGET_EXCEEDED and info.value.retryable is False
    order: list[str] = []
    first = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with budget.reserve(150 * MIB):
            order.append("first in")
            first.set()
            release.wait(30)
        order.append("first out")

    t = threading.Thread(target=hold)
    t.start()
    assert first.wait(30)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(WorkerError) as info:
        with budget.reserve(100 * MIB, cancel):
            pass
    assert info.value.code is Code.CANCELLED  # waiting, then cancelled
    threading.Timer(0.3, release.set).start()
    with budget.reserve(100 * MIB):
        order.append("second in")
    t.join(30)
    assert order == ["first in", "first out", "second in"] and budget.used == 0
    assert job_bytes(3600) > job_bytes(60) > 64 * MIB


@pytest.mark.model
def test_a_job_over_the_memory_budget_fails_before_the_model(tiny_pool) -> None:
    from handler.pipeline.runtime import Runtime

    settings = make_settings(device="cpu", memory_budget_mb=70)  # jfk needs ~68 MiB; 60 s more
    worker = Runtime(settings=settings, pool=tiny_pool)
    ok = run_job({"audio_base64": b64(DATA / "jfk.wav")}, worker)
    assert "error" not in ok, ok
    long = {"audio_base64": base64.b64encode(long_clip(60).wav_bytes()).decode()}
    result = run_job(long, worker)
    assert result["error_code"] == "MEMORY_BUDGET_EXCEEDED" and result["retryable"] is False
    assert "WHISPER_MEMORY_BUDGET_MB" in result["error"]
