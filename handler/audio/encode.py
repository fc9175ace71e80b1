"""16-kHz samples back to a compact file: a piece of a split recording travels as FLAC.

Lossless, so a piece decodes to the very samples the worker cut (the transcript of a
piece is the transcript of those samples), and about half the size of 16-bit WAV, so a
few minutes of speech fit in one platform request inline.
"""

from __future__ import annotations

import io

import av
import numpy as np

RATE = 16000


def to_flac(samples: np.ndarray) -> bytes:
    """Mono 16-kHz float32 samples as a FLAC file (16-bit)."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=RATE)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = RATE
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
