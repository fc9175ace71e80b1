"""One way in for any audio a job carries (its own, or a known speaker's reference clip):
bytes given beside the input, base64 or a URL, written to a job folder that lives only
while it is fetched and decoded, then decoded with the caps of the settings given."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from handler.audio.decode import DecodedAudio, decode_audio
from handler.audio.seal import verify_file
from handler.audio.sources import JOB_DIR_PREFIX, decode_base64, fetch_to_file
from handler.settings import Settings


def read_audio(
    settings: Settings,
    *,
    data: bytes | None = None,
    audio_base64: str | None = None,
    audio_url: str | None = None,
    cancel: threading.Event | None = None,
    timings: dict[str, float] | None = None,
    sha256: str | None = None,
    split_channels: bool = False,
) -> DecodedAudio:
    """The audio of exactly one of ``data``, ``audio_base64`` or ``audio_url`` as 16-kHz
    samples; ``timings`` gets its ``fetch`` and ``decode`` seconds. ``sha256``: the bytes
    must have this digest (a sealed piece, handler.audio.seal); ``split_channels``: each
    channel decoded on its own (``DecodedAudio.channels``)."""
    with tempfile.TemporaryDirectory(prefix=JOB_DIR_PREFIX) as tmp:
        src = Path(tmp) / "audio"
        t = time.perf_counter()
        if data is not None:
            src.write_bytes(data)
        elif audio_base64 is not None:
            src.write_bytes(decode_base64(audio_base64, settings.max_inline_bytes))
        elif audio_url is not None:
            fetch_to_file(audio_url, src, settings, cancel=cancel)
        if sha256 is not None:
            verify_file(src, sha256)
        fetched = time.perf_counter()
        audio = decode_audio(src, settings, cancel=cancel, split_channels=split_channels)
        if timings is not None:
            timings["fetch"] = fetched - t
            timings["decode"] = time.perf_counter() - fetched
    return audio
