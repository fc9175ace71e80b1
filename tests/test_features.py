"""Bounded-memory features, VAD and speech gathering (handler/inference/features.py and
transcribe.sequential_segments) give faster-whisper's own numbers and text, on real
speech, in a small fraction of the memory (3.8 GB of peak RSS per hour of audio).

Memory is measured with tracemalloc, which sees numpy's allocations: a peak in bytes, not
a time, so it is the same on a busy machine.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model

from handler.inference.features import BLOCK_FRAMES, BoundedFeatureExtractor, BoundedVad
from speech_assets.clips import long_clip

MIB = 2**20


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return long_clip(300).samples.astype(np.float32)  # 5 min of real speech and pauses


def _peak(fn, *args):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("cut", [0, 37, 159, 160, 161])
def test_features_equal_faster_whispers(speech, cut) -> None:
    audio = speech[: len(speech) - cut]
    want = FeatureExtractor(80)(audio)
    got = BoundedFeatureExtractor.like(FeatureExtractor(80))(audio)
    assert got.shape == want.shape and got.dtype == want.dtype
    # Each frame is computed the same way; BLAS may round one matrix product in the last bit.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_short_audio_is_faster_whispers_own_code(speech) -> None:
    audio = speech[: BLOCK_FRAMES * 160 - 160]
    want = FeatureExtractor(128)(audio)
    assert np.array_equal(BoundedFeatureExtractor.like(FeatureExtractor(128))(audio), want)


def test_features_transient_memory_is_bounded(speech) -> None:
    audio = np.tile(speech, 4)  # 20 min
    out_bytes = 80 * (len(audio) // 160 + 1) * 4  # float32, one frame per 10 ms
    _, theirs = _peak(FeatureExtractor(80), audio)
    got, ours = _peak(BoundedFeatureExtractor.like(FeatureExtractor(80)), audio)
    assert got.nbytes == out_bytes
    assert ours < out_bytes + 40 * MIB, f"{ours / MIB:.0f} MiB for {out_bytes / MIB:.0f} MiB out"
    assert theirs > 5 * ours  # what it replaces (about 1.3 GB here)


def test_vad_probabilities_equal_silero_model(speech) -> None:
    model = get_vad_model()
    model = getattr(model, "model", model)  # unwrapped, if installed already
    audio = np.pad(speech, (0, 512 - len(speech) % 512))
    want = model(audio.copy())  # it writes into its input
    got = BoundedVad(model)(audio)
    assert np.array_equal(got, want)


def test_vad_transient_memory_is_bounded(speech) -> None:
    model = get_vad_model()
    model = getattr(model, "model", model)
    audio = np.tile(speech, 4)
    audio = np.pad(audio, (0, 512 - len(audio) % 512))
    _, theirs = _peak(model, audio.copy())
    _, ours = _peak(BoundedVad(model), audio)
    assert ours < 40 * MIB and theirs > audio.nbytes, (ours / MIB, theirs / MIB)


def test_speech_timestamps_unchanged_by_the_installed_vad(speech) -> None:
    from handler.inference.features import install_bounded_vad

    before = get_speech_timestamps(speech, VadOptions())
    install_bounded_vad()
    install_bounded_vad()  # idempotent
    assert get_speech_timestamps(speech, VadOptions()) == before


@pytest.mark.model
def test_sequential_transcript_equals_faster_whisper(speech) -> None:
    """The worker's own speech gathering (one copy, linear time) against faster-whisper's
    vad_filter path: the same segments, times and words, on the same instance."""
    from faster_whisper import WhisperModel

    from handler.inference.models import packaged_model_path
    from handler.inference.transcribe import sequential_segments

    model = WhisperModel(packaged_model_path(), device="cpu", compute_type="int8", cpu_threads=2)
    # 3-s pauses between the clips: the VAD drops them, so the speech really is gathered.
    audio = long_clip(90, gap_seconds=3.0).samples.astype(np.float32)
    opts = {"vad_filter": True, "word_timestamps": True, "vad_parameters": {"threshold": 0.5}}

    def shape(segments):
        return [
            (s.start, s.end, s.text, [(w.start, w.end, w.word) for w in s.words]) for s in segments
        ]

    before = audio.copy()
    want, _ = model.transcribe(audio, **opts)
    got, _, spans = sequential_segments(model, audio, opts)
    assert spans  # the VAD spans it used: the dropped-speech check reads them
    want, got = shape(want), shape(got)
    assert want and got == want
    assert np.array_equal(audio, before)  # not consumed unless asked
    # Consumed: the speech is gathered inside the caller's buffer, the same transcript.
    mine = audio.copy()
    consumed, _, _ = sequential_segments(model, mine, opts, consume=True)
    assert shape(consumed) == want
    assert not np.array_equal(mine, before)  # it really was used as the gathering buffer
