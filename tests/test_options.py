"""Decoding defaults come from faster-whisper itself (fw_batch restated 21 of them).

Model tier: the batched decoder's options for a job that set nothing must equal
``WhisperModel.transcribe``'s own defaults, read from its signature; one option the job
sets must be the only one that changes.
"""

from __future__ import annotations

import inspect

import pytest
from faster_whisper import WhisperModel

from handler.inference import fw_batch
from handler.inference.options import DEFAULTS, opt, temperatures, vad_options
from tests.test_engine import audio_of

pytestmark = pytest.mark.model

SHARED = (
    "beam_size",
    "best_of",
    "patience",
    "length_penalty",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "log_prob_threshold",
    "no_speech_threshold",
    "compression_ratio_threshold",
    "suppress_blank",
    "prepend_punctuations",
    "append_punctuations",
    "max_new_tokens",
    "hotwords",
    "word_timestamps",
    "without_timestamps",
    "initial_prompt",
)


def test_defaults_are_the_signatures() -> None:
    params = inspect.signature(WhisperModel.transcribe).parameters
    assert DEFAULTS == {k: p.default for k, p in params.items() if p.default is not p.empty}
    assert opt({}, "beam_size") == params["beam_size"].default
    assert opt({"beam_size": 2}, "beam_size") == 2
    assert temperatures({}) == [float(t) for t in params["temperature"].default]
    assert temperatures({"temperature": 0.3}) == [0.3]
    assert vad_options({"vad_parameters": {"threshold": 0.7}}, speech_pad_ms=10).speech_pad_ms == 10
    with pytest.raises(KeyError):
        opt({}, "not_an_option")


def test_the_batched_decoders_options_are_the_librarys_for_a_job_that_set_none(worker) -> None:
    inst = worker.pool.get(None).instances[0]
    samples = audio_of("jfk.wav")
    plain = fw_batch.prepare(inst, samples, {"vad_filter": True}).options
    for name in SHARED:
        assert getattr(plain, name) == DEFAULTS[name], name
    assert plain.temperatures == temperatures({})[:1]
    tuned = fw_batch.prepare(inst, samples, {"vad_filter": True, "patience": 2.0}).options
    changed = [n for n in SHARED if getattr(tuned, n) != getattr(plain, n)]
    assert changed == ["patience"]
