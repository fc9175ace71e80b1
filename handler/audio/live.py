"""Live audio in: the chunks a realtime session appends, decoded as they arrive.

OpenAI's Realtime input formats: ``audio/pcm`` (16-bit little-endian mono, 24 kHz unless
the session says otherwise), ``audio/pcmu`` and ``audio/pcma`` (G.711 mu-law and A-law, 8
kHz). Each chunk is base64 (strict: a chunk that is not base64 is refused, not guessed
at), decoded by FFmpeg's PCM decoders and resampled to 16-kHz float32 by one stateful
FFmpeg resampler per session (PyAV, as the file path uses), so chunk edges leave no
clicks and no drift.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import av
import numpy as np

from handler.contract import SAMPLE_RATE
from handler.errors import Code, WorkerError

FORMATS = {
    "audio/pcm": ("pcm_s16le", 24000),
    "audio/pcmu": ("pcm_mulaw", 8000),
    "audio/pcma": ("pcm_alaw", 8000),
}
"""Format type -> (FFmpeg decoder, default rate)."""
LEGACY_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
"""The older transcription_session shape's names."""
ALLOWED_PCM_RATES = (8000, 16000, 24000, 44100, 48000)


def chunk_bytes(b64: object, limit: int) -> bytes:
    """One appended chunk's bytes; INVALID_BASE64 or INPUT_TOO_LARGE otherwise."""
    if not isinstance(b64, str):
        raise WorkerError(Code.INVALID_INPUT, "audio: a base64 string")
    if len(b64) > limit * 4 // 3 + 4:
        raise WorkerError(Code.INPUT_TOO_LARGE, f"one chunk is over {limit} bytes")
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise WorkerError(Code.INVALID_BASE64, "audio: not base64") from None


class LiveDecoder:
    """Chunks of one format in, 16-kHz float32 samples out (stateful: one per session)."""

    def __init__(self, fmt: str = "audio/pcm", rate: int | None = None) -> None:
        if fmt not in FORMATS:
            raise WorkerError(
                Code.INVALID_INPUT, f"audio format {fmt!r}: one of {', '.join(FORMATS)}"
            )
        codec, default_rate = FORMATS[fmt]
        rate = rate or default_rate
        if fmt == "audio/pcm" and rate not in ALLOWED_PCM_RATES:
            raise WorkerError(Code.INVALID_INPUT, f"rate {rate}: one of {ALLOWED_PCM_RATES}")
        if fmt != "audio/pcm" and rate != default_rate:
            raise WorkerError(Code.INVALID_INPUT, f"{fmt} is {default_rate} Hz")
        self.format, self.rate = fmt, rate
        self._bytes_per_sample = 2 if codec == "pcm_s16le" else 1
        context: Any = av.CodecContext.create(codec, "r")  # an AudioCodecContext
        context.sample_rate = rate
        context.layout = "mono"
        self._codec = context
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        self._carry = b""

    def decode(self, data: bytes) -> np.ndarray:
        """The 16-kHz samples of ``data`` (a half sample is kept for the next chunk)."""
        data = self._carry + data
        whole = len(data) - len(data) % self._bytes_per_sample
        self._carry = data[whole:]
        if not whole:
            return np.empty(0, dtype=np.float32)
        out = []
        for frame in self._codec.decode(av.Packet(data[:whole])):
            for resampled in self._resampler.resample(frame):
                out.append(resampled.to_ndarray().reshape(-1))
        return np.concatenate(out).astype(np.float32) if out else np.empty(0, np.float32)
