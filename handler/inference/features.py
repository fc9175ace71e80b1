"""Log-mel features of long audio in bounded memory, equal to faster-whisper's own.

``WhisperModel.transcribe`` computes the features of the whole file in one go:
faster-whisper's ``FeatureExtractor`` copies the waveform twice (``astype``, ``pad``),
reflect-pads it, windows every frame (400 floats per 10 ms), takes their FFT and the
magnitudes. For an hour of audio that is about 3 GB at once, which is most of the
3.8 GB-per-hour peak the hardening issue measured. The result itself is small: 80 (or 128)
floats per 10 ms, 115 MB per hour.

:class:`BoundedFeatureExtractor` computes the same frames a block at a time (the STFT
frames are independent; only the final clamp to ``max - 8`` needs the whole file, and it
is applied once at the end), so the transient is about 35 MB whatever the length. It is a
subclass that defers to faster-whisper's own code below ``BLOCK_FRAMES`` frames, and is
installed on every loaded model (``handler.inference.models``). tests/test_features.py checks the
output against faster-whisper's on real speech, and pins the private pieces used.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor

BLOCK_FRAMES = 3000
"""Frames (10 ms each) computed at once: 30 s, about 35 MB of transient arrays."""


def _per_thread(name: str, index: int) -> Any:
    """A field of the extractor kept per thread, defaulting to ``_defaults[index]``."""

    def get(self: BoundedFeatureExtractor) -> int:
        return getattr(self._local, name, self._defaults[index])

    def put(self: BoundedFeatureExtractor, value: int) -> None:
        setattr(self._local, name, value)

    return property(get, put)


class BoundedFeatureExtractor(FeatureExtractor):
    """Also: a job's ``chunk_length`` stays that job's.

    faster-whisper's extractor stores ``chunk_length`` as ``n_samples``/``nb_max_frames``
    on itself, the one extractor of a model instance that every job shares, and keeps it
    for the calls that pass none: one job with ``chunk_length: 5`` made every later job
    on the worker decode in 5-s windows (found when the generated-input test ran before
    the transcript tests). Here both are per thread (a job's features and its decode run
    in its own thread) and a call without ``chunk_length`` restores the model's default.
    """

    _defaults: tuple[int, int]
    _local: threading.local

    @classmethod
    def like(cls, other: FeatureExtractor) -> BoundedFeatureExtractor:
        new = cls.__new__(cls)
        state = dict(other.__dict__)
        defaults = (int(state.pop("n_samples")), int(state.pop("nb_max_frames")))
        new.__dict__.update(state)
        new._defaults = defaults
        new._local = threading.local()
        return new

    n_samples = _per_thread("n_samples", 0)
    nb_max_frames = _per_thread("nb_max_frames", 1)

    def __call__(self, waveform: np.ndarray, padding: int = 160, chunk_length: Any = None):
        if chunk_length is None:  # this call's own default, not the last job's value
            self.n_samples, self.nb_max_frames = self._defaults
        hop = self.hop_length
        if len(waveform) + padding <= BLOCK_FRAMES * hop:
            return super().__call__(waveform, padding=padding, chunk_length=chunk_length)
        if chunk_length is not None:
            self.n_samples = chunk_length * self.sampling_rate
            self.nb_max_frames = self.n_samples // self.hop_length
        signal = _Padded(np.asarray(waveform), padding, self.n_fft // 2)
        # As FeatureExtractor.stft: 1 + (length - n_fft) // hop frames; __call__ drops the last.
        n_frames = (signal.length - self.n_fft) // hop  # = 1 + (...) - 1
        window = np.hanning(self.n_fft + 1)[:-1].astype("float32")
        out = np.empty((self.mel_filters.shape[0], n_frames), dtype=np.float32)
        for f0 in range(0, n_frames, BLOCK_FRAMES):
            f1 = min(n_frames, f0 + BLOCK_FRAMES)
            block = signal.slice(f0 * hop, (f1 - 1) * hop + self.n_fft)
            frames = np.lib.stride_tricks.as_strided(
                block, (f1 - f0, self.n_fft), (hop * block.strides[0], block.strides[0])
            )
            stft = np.fft.rfft(frames * window, n=self.n_fft, axis=-1).astype("complex64")
            magnitudes = np.abs(stft.T) ** 2
            mel = self.mel_filters @ magnitudes
            out[:, f0:f1] = np.log10(np.clip(mel, a_min=1e-10, a_max=None))
        np.maximum(out, out.max() - 8.0, out=out)
        out += 4.0
        out /= 4.0
        return out


class _Padded:
    """The waveform as FeatureExtractor sees it (float32, ``padding`` zeros appended, then
    reflect-padded by ``edge`` on both sides), read a slice at a time without copying it."""

    def __init__(self, waveform: np.ndarray, padding: int, edge: int) -> None:
        self.w = waveform
        self.padding = padding
        self.edge = edge
        self.inner = len(waveform) + padding
        self.length = self.inner + 2 * edge

    def _inner(self, lo: int, hi: int) -> np.ndarray:
        """Samples lo..hi of waveform + zeros (0 <= lo <= hi <= inner), float32."""
        n = len(self.w)
        part = self.w[min(lo, n) : min(hi, n)].astype(np.float32)
        if hi > n:
            part = np.concatenate([part, np.zeros(hi - max(lo, n), np.float32)])
        return part

    def slice(self, lo: int, hi: int) -> np.ndarray:
        """Samples lo..hi of the reflect-padded signal."""
        e, inner = self.edge, self.inner
        parts = []
        if lo < e:  # numpy "reflect": x[e], ..., x[1] before x[0]
            left = self._inner(1, e + 1)[::-1]
            parts.append(left[lo : min(hi, e)])
        a, b = max(lo, e) - e, min(hi, e + inner) - e
        if b > a:
            parts.append(self._inner(a, b))
        if hi > e + inner:  # after x[-1]: x[-2], x[-3], ...
            right = self._inner(inner - e - 1, inner - 1)[::-1]
            parts.append(right[max(lo, e + inner) - e - inner : hi - e - inner])
        return np.ascontiguousarray(np.concatenate(parts)) if len(parts) > 1 else parts[0].copy()


class BoundedVad:
    """faster-whisper's Silero VAD model, fed a batch at a time.

    ``SileroVADModel.__call__`` builds a (windows, 576) copy of the whole audio (each
    512-sample window with the 64 samples before it) before running the network on it
    10 000 windows at a time: about 1.1 times the PCM again, for an hour 260 MB. This
    builds each batch's rows from the audio as it goes, 2 000 windows at a time (the
    network's state is carried from batch to batch, so the boundaries do not change the
    numbers: tests/test_features.py compares), with the same quirk (the last window's final
    64 samples are zeroed), so the probabilities are the same numbers in a fraction of the
    memory: a constant ~30 MB of activations and no copy of the whole audio.
    """

    BATCH = 2_000

    def __init__(self, model: Any) -> None:
        self.model = model
        self.session = model.session

    def __call__(
        self, audio: np.ndarray, num_samples: int = 512, context_size_samples: int = 64
    ) -> np.ndarray:
        assert audio.ndim == 1 and audio.shape[0] % num_samples == 0
        ns, cs = num_samples, context_size_samples
        n = audio.shape[0] // ns
        h = np.zeros((1, 1, 128), dtype="float32")
        c = np.zeros((1, 1, 128), dtype="float32")
        outputs = []
        for i in range(0, n, self.BATCH):
            j = min(n, i + self.BATCH)
            rows = audio[i * ns : j * ns].astype(np.float32).reshape(-1, ns)
            if j == n:
                rows[-1, -cs:] = 0  # as SileroVADModel: its context view writes into the audio
            batch = np.empty((j - i, cs + ns), dtype=np.float32)
            batch[:, cs:] = rows
            batch[1:, :cs] = rows[:-1, -cs:]
            batch[0, :cs] = 0 if i == 0 else audio[i * ns - cs : i * ns]
            output, h, c = self.session.run(None, {"input": batch, "h": h, "c": c})
            outputs.append(output)
        return np.concatenate(outputs, axis=0)


def install_bounded_vad() -> None:
    """Make faster-whisper's get_speech_timestamps use :class:`BoundedVad` (idempotent)."""
    from faster_whisper import vad

    current = vad.get_vad_model
    if getattr(current, "_bounded", False):
        return

    @functools.cache
    def get_vad_model() -> BoundedVad:
        return BoundedVad(current())  # current is lru-cached: one model, one wrapper

    get_vad_model._bounded = True  # type: ignore[attr-defined]
    vad.get_vad_model = get_vad_model
