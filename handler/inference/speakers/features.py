"""Kaldi-compatible log mel filterbanks, the input the CAM++ speaker-embedding model was
trained on (3D-Speaker computes them with ``torchaudio.compliance.kaldi.fbank``).

Written here in NumPy because the alternatives are torchaudio (torch, gigabytes) or
kaldi-native-fbank (one more native wheel) for 40 lines of well-defined arithmetic; the
test compares it with Kaldi's definition computed independently (tests/test_diarization.py).
Options, as 3D-Speaker's: 16 kHz, 25-ms frames every 10 ms (``snip_edges``), DC removed,
pre-emphasis 0.97, Povey window, 512-point FFT, power spectrum, 80 mel bins from 20 Hz to
Nyquist on Kaldi's mel scale, natural log, no dither.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from handler.contract import SAMPLE_RATE

FRAME = 400  # 25 ms
SHIFT = 160  # 10 ms
FFT = 512
MEL_BINS = 80
LOW_HZ = 20.0
PREEMPH = 0.97
_EPS = float(np.finfo(np.float32).eps)
NOISE_OVERSUBTRACT = 1.0
NOISE_KEEP = 0.1
"""Spectral subtraction before the speaker embedding: each band's power less the
recording's noise floor (noise_floor, a 10th percentile, so 0.1-0.6 of the noise's mean
power by band), kept at no less than a tenth of itself. Studio speech has no floor to
subtract. Measured on the held-out conversations (bench/README.md, Under noise): pink
noise 15 dB below the speech, attribution without hints 0.963 -> 0.991 (count exact 15 ->
19 of 20), with the count given 0.942 -> 0.987; at 5 dB 0.984 -> 0.974 (twice the floor
did as well at 15 dB and took speech with the noise at 5 dB: 0.904)."""
NOISE_EVERY = 10


def _mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


@lru_cache(maxsize=1)
def mel_banks() -> np.ndarray:
    """(FFT/2 + 1, MEL_BINS) triangular weights, Kaldi's construction (linear in mel)."""
    nyquist = SAMPLE_RATE / 2
    low, high = _mel(LOW_HZ), _mel(nyquist)
    delta = (high - low) / (MEL_BINS + 1)
    left = low + delta * np.arange(MEL_BINS)
    center, right = left + delta, left + 2 * delta
    fft_mel = _mel(np.arange(FFT // 2) * SAMPLE_RATE / FFT)[:, None]
    up = (fft_mel - left) / (center - left)
    down = (right - fft_mel) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    # Kaldi has FFT/2 bins; the Nyquist bin gets no weight.
    return np.vstack([banks, np.zeros((1, MEL_BINS))]).astype(np.float32)


@lru_cache(maxsize=1)
def _window() -> np.ndarray:
    n = np.arange(FRAME)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME - 1))
    return (hann**0.85).astype(np.float32)


def frame_count(num_samples: int) -> int:
    return 0 if num_samples < FRAME else 1 + (num_samples - FRAME) // SHIFT


def mel_energies(samples: np.ndarray, every: int = 1) -> np.ndarray:
    """(frames, 80) mel power of 16-kHz mono float samples; ``every`` > 1 keeps one frame
    in that many."""
    n = frame_count(len(samples))
    if n == 0:
        return np.zeros((0, MEL_BINS), dtype=np.float32)
    x = np.asarray(samples, dtype=np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x, FRAME)[:: SHIFT * every][
        : (n + every - 1) // every
    ].copy()
    frames -= frames.mean(axis=1, keepdims=True)
    frames[:, 1:] -= PREEMPH * frames[:, :-1].copy()
    frames[:, 0] *= 1.0 - PREEMPH
    frames *= _window()
    power = np.abs(np.fft.rfft(frames, n=FFT, axis=1)) ** 2
    return np.asarray(power.astype(np.float32) @ mel_banks(), dtype=np.float32)


def fbank(samples: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
    """(frames, 80) log mel energies of 16-kHz mono float samples; with ``noise`` (a
    recording's noise_floor), that floor subtracted first (spectral subtraction)."""
    energies = mel_energies(samples)
    if noise is not None and len(energies):
        energies = np.maximum(energies - NOISE_OVERSUBTRACT * noise, NOISE_KEEP * energies)
    return np.log(np.maximum(energies, _EPS)).astype(np.float32)


def noise_floor(samples: np.ndarray, block_s: float = 60.0) -> np.ndarray:
    """(80,) the recording's noise in each mel band: the 10th percentile of its frames'
    power, one frame in NOISE_EVERY (every 100 ms), a minute at a time (an hour holds
    36,000 x 80 floats, 11.5 MB)."""
    block = int(block_s * SAMPLE_RATE)
    parts = [
        mel_energies(samples[i : i + block + FRAME], NOISE_EVERY)
        for i in range(0, len(samples), block)
    ]
    frames = np.concatenate([p for p in parts if len(p)] or [np.zeros((1, MEL_BINS))])
    return np.percentile(frames, 10, axis=0).astype(np.float32)


def normalized(samples: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
    """Filterbanks (the noise floor subtracted, when given) with the mean over the clip
    removed (3D-Speaker's input)."""
    feats = fbank(samples, noise)
    return feats - feats.mean(axis=0, keepdims=True) if len(feats) else feats
