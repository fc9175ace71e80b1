"""Bounded decoding of untrusted audio files into 16 kHz mono float32 samples.

Why PyAV: it bundles FFmpeg (no system install, the same decoders faster-whisper uses, so
samples match ``faster_whisper.decode_audio``), and it exposes the controls this module
needs and the library's own decoder does not use: a demuxer allowlist
(``format_whitelist``), a protocol allowlist (``protocol_whitelist=file``: a playlist or
manifest can never open a connection or another file), the container's declared
duration before any decoding, and packet-by-packet decoding so that samples, wall-clock
time, cancellation and corrupt packets are checked as we go.

Defaults come from :class:`handler.settings.Settings`: ``allowed_formats`` (common audio
containers; no playlists, manifests, images or concat), ``max_audio_seconds`` (4 h, checked
on the declared duration first, then on the samples counted while decoding, so memory
stays under ``max_audio_seconds * 16000 * 4`` bytes) and ``decode_timeout_s`` (300 s).
Messages never carry the file path or FFmpeg's own error text (which names the file and,
for playlists, URLs).
"""

from __future__ import annotations

import logging
import math
import os
import pathlib
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np

from handler.contract import MAX_CHANNELS, SAMPLE_RATE
from handler.errors import Code, WorkerError
from handler.guard import Guard
from handler.settings import Settings

# PyAV before 19 decoded a container's metadata strictly unless told to ignore errors (a
# tag that is not UTF-8 would fail the open); PyAV 19 dropped the argument and refuses it
# (TypeError), and it is what pip installs on Python 3.12, the image's Python (Ubuntu
# 24.04), while 3.11 stays on 18. Found by replaying the image in a chroot:
# every job of the image ended INTERNAL. Passed only where PyAV takes it.
_METADATA_ERRORS: dict[str, Any] = (
    {"metadata_errors": "ignore"} if int(av.__version__.split(".")[0]) < 19 else {}
)

log = logging.getLogger(__name__)


# Decoded audio shorter than its declared length by more than this (seconds, or fraction of
# the declared length, whichever is larger) gets a warning: a truncated or damaged file must
# not pass as a complete recording.
_SHORTFALL_S = 0.5
_SHORTFALL_FRACTION = 0.05
# Demuxer read errors tolerated (each one resumes reading after the bad spot) before we
# stop and keep what was decoded.
_MAX_DEMUX_ERRORS = 100
# First allocation when the container declares no duration (seconds of 16 kHz audio).
_INITIAL_SECONDS = 60.0
_GENERIC = "The file could not be read as audio (unsupported format or corrupt data)."


@dataclass
class DecodedAudio:
    samples: np.ndarray
    """float32, mono, 16 kHz, values in [-1, 1): the same samples as
    ``faster_whisper.decode_audio`` returns for the same file."""
    duration: float
    """Seconds of decoded audio: ``len(samples) / SAMPLE_RATE``."""
    declared_duration: float | None
    """Length the container declares (or FFmpeg estimates from its size), if any."""
    format_name: str
    """FFmpeg demuxer name, e.g. ``wav`` or ``mov,mp4,m4a,3gp,3g2,mj2``."""
    warnings: list[str] = field(default_factory=list)
    """Sentences for the client: skipped corrupt packets, decoded shorter than declared."""
    channels: list[np.ndarray] | None = None
    """Decoded with ``split_channels``: each channel's samples (16 kHz float32, as
    ``samples``, which is then the first of them); else None."""


def demuxer_whitelist(allowed_formats: list[str]) -> str:
    """Flatten setting entries (some are groups such as ``mov,mp4,m4a``) into FFmpeg's list."""
    names: list[str] = []
    for entry in allowed_formats:
        for name in entry.split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return ",".join(names)


def decode_bytes(
    data: bytes,
    settings: Settings,
    *,
    cancel: threading.Event | None = None,
    split_channels: bool = False,
) -> DecodedAudio:
    """Decode in-memory audio through a temporary file, deleted afterwards.

    A real file (rather than a Python file object) keeps one code path, lets FFmpeg seek
    without calling back into Python, and keeps ``protocol_whitelist`` meaningful.
    """
    fd, name = tempfile.mkstemp(prefix="whisper-in-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return decode_audio(
            pathlib.Path(name), settings, cancel=cancel, split_channels=split_channels
        )
    finally:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def decode_audio(
    path: pathlib.Path,
    settings: Settings,
    *,
    cancel: threading.Event | None = None,
    split_channels: bool = False,
) -> DecodedAudio:
    """Decode the first audio stream of ``path``, enforcing the limits in ``settings``;
    ``split_channels``: each channel apart (``DecodedAudio.channels``, ``MAX_CHANNELS`` at
    most; the length cap bounds their seconds added up). Raises :class:`WorkerError` with
    UNSUPPORTED_OR_CORRUPT_MEDIA, NO_AUDIO_STREAM, EMPTY_AUDIO, INVALID_INPUT (channels),
    CORRUPT_MEDIA, AUDIO_TOO_LONG, DECODE_TIMEOUT or CANCELLED."""
    started = time.monotonic()
    guard = Guard.within(
        settings.decode_timeout_s, cancel, Code.DECODE_TIMEOUT, _timeout_message(settings)
    )
    _require_regular_file(path)
    try:
        container = av.open(
            str(path),
            mode="r",
            container_options={
                "format_whitelist": demuxer_whitelist(settings.allowed_formats),
                # Only the one local file: no http, tcp, data, concat or subfile.
                "protocol_whitelist": "file",
            },
            **_METADATA_ERRORS,
            # FFmpeg's interrupt callback bounds one blocking open or read.
            timeout=settings.decode_timeout_s,
        )
    except av.error.ExitError:
        raise WorkerError(Code.DECODE_TIMEOUT, _timeout_message(settings)) from None
    except (av.FFmpegError, ValueError, UnicodeError, OSError) as exc:
        # Not allowlisted, not a known container, or unreadable; FFmpeg's text names the file.
        log.info("open refused: %s", type(exc).__name__)
        raise WorkerError(Code.UNSUPPORTED_OR_CORRUPT_MEDIA, _GENERIC) from None

    try:
        with container:
            result = _decode_container(container, settings, guard, split_channels)
    except WorkerError:
        raise
    except av.error.ExitError:
        raise WorkerError(Code.DECODE_TIMEOUT, _timeout_message(settings)) from None
    except (av.FFmpegError, ValueError, IndexError, UnicodeError, OverflowError) as exc:
        log.warning("decode failed: %s", type(exc).__name__)
        raise WorkerError(Code.UNSUPPORTED_OR_CORRUPT_MEDIA, _GENERIC) from None

    if result.format_name == "wav":
        result.warnings += _wav_length_warnings(path, result.duration)
    log.info(
        "decoded %.2fs of audio (%s) in %.3fs, %d warning(s)",
        result.duration,
        result.format_name,
        time.monotonic() - started,
        len(result.warnings),
    )
    return result


def _wav_length_warnings(path: pathlib.Path, decoded: float) -> list[str]:
    """A WAV's own header against its bytes: FFmpeg estimates a truncated WAV's length from
    the file size (so the declared-duration check cannot see the cut), and stops at the end
    of a data chunk that declares less than the file holds. Either way the transcript would
    be silently short."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(65536)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return []
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RF64") or head[8:12] != b"WAVE":
        return []
    pos, byte_rate, data_at, data_size = 12, 0, 0, 0
    while pos + 8 <= len(head):
        cid, csize = head[pos : pos + 4], struct.unpack("<I", head[pos + 4 : pos + 8])[0]
        if cid == b"fmt " and pos + 20 <= len(head):
            byte_rate = struct.unpack("<I", head[pos + 16 : pos + 20])[0]
        if cid == b"data":
            data_at, data_size = pos + 8, csize
            break
        pos += 8 + csize + (csize & 1)
    if not byte_rate or not data_at or data_size in (0, 0xFFFFFFFF):
        return []  # a streamed WAV (size unknown) or no header we understand
    declared = data_size / byte_rate
    present = (size - data_at) / byte_rate
    slack = max(_SHORTFALL_S, _SHORTFALL_FRACTION * declared)
    if declared - present > slack:
        return [
            f"The WAV header declares {declared:.1f} s but the file holds {present:.1f} s: "
            "the file is truncated."
        ]
    if present - declared > slack and present - decoded > slack:
        return [
            f"The WAV header declares {declared:.1f} s of audio but the file holds "
            f"{present:.1f} s; only the declared part was decoded."
        ]
    return []


def _require_regular_file(path: pathlib.Path) -> None:
    # A FIFO or device would block in read() where FFmpeg's timeout cannot reach.
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise WorkerError(Code.UNSUPPORTED_OR_CORRUPT_MEDIA, _GENERIC) from None
    if not stat.S_ISREG(mode):
        raise WorkerError(Code.UNSUPPORTED_OR_CORRUPT_MEDIA, _GENERIC)


def _timeout_message(settings: Settings) -> str:
    return f"Decoding the audio took longer than {settings.decode_timeout_s:g} s."


def _too_long_message(settings: Settings, declared: float | None, width: int = 1) -> str:
    limit = f"{settings.max_audio_seconds:g} s"
    if width > 1:
        return (
            f"The audio's {width} channels add up to more than the limit of {limit} "
            "(each channel is transcribed on its own)."
        )
    if declared is not None:
        return f"The audio declares {declared:.1f} s, longer than the limit of {limit}."
    return f"The audio is longer than the limit of {limit}."


def _declared_duration(
    container: av.container.InputContainer, stream: av.AudioStream
) -> float | None:
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return container.duration / av.time_base
    return None


@dataclass
class _Tally:
    """What the stages counted, for the verdict on a damaged stream."""

    good_packets: int = 0
    bad_packets: int = 0
    corrupt_frames: int = 0
    demux_errors: int = 0
    seconds_in: float = 0.0

    @property
    def skipped(self) -> int:
        return self.bad_packets + self.demux_errors


def _decode_container(
    container: av.container.InputContainer, settings: Settings, guard: Guard, split: bool
) -> DecodedAudio:
    """The stages, in order: stream and declared length, packets, frames, length bound,
    resampling, collection into bounded buffers (one per channel when ``split``), verdict."""
    stream, declared, width = _audio_stream(container, settings, split)
    tally = _Tally()
    frames = _frames(_packets(container, stream, guard, tally), tally)
    layout, rows = _layout(stream, width)
    chunks = _resampled(_bounded(frames, settings, tally, width), layout, rows)
    if rows > width:
        chunks = (chunk.mean(axis=0, keepdims=True) for chunk in chunks)
    channels = _collect(chunks, settings, declared, width)
    samples = channels[0]
    warnings = _verdict(samples, tally, declared)
    return DecodedAudio(
        samples=samples,
        duration=len(samples) / SAMPLE_RATE,
        declared_duration=declared,
        format_name=container.format.name,
        warnings=warnings,
        channels=channels if split else None,
    )


def _audio_stream(
    container: av.container.InputContainer, settings: Settings, split: bool
) -> tuple[av.AudioStream, float | None, int]:
    """The first audio stream, its declared length, and how many channels the length cap
    counts (its channels when ``split``, else 1: they are mixed down)."""
    if not container.streams.audio:
        raise WorkerError(Code.NO_AUDIO_STREAM, "The file has no audio stream.")
    stream = container.streams.audio[0]
    width = max(1, len(stream.layout.channels)) if split else 1
    if width > MAX_CHANNELS:
        raise WorkerError(
            Code.INVALID_INPUT,
            f"The audio has {width} channels; multichannel transcribes {MAX_CHANNELS} at most "
            "(leave multichannel off to mix them down to one).",
        )
    declared = _declared_duration(container, stream)
    # Refuse on the declared length before decoding a single packet: a few KB of FLAC can
    # declare (and really contain) hours of silence.
    if declared is not None and declared * width > settings.max_audio_seconds:
        raise WorkerError(Code.AUDIO_TOO_LONG, _too_long_message(settings, declared, width))
    return stream, declared, width


def _layout(stream: av.AudioStream, width: int) -> tuple[str, int]:
    """The layout to resample to, and its channels: ``mono`` (FFmpeg's own downmix, as
    faster-whisper's), or the stream's own (``width`` channels kept apart). Channels that
    have no names beyond two are kept apart too and averaged here: FFmpeg guesses a
    surround layout for 3 to 8 of them (dropping the one it takes for LFE, weighting the
    rest) and has none beyond 8 (12 or 16 microphones came out silent, 9 or 17 refused)."""
    channels = stream.layout.channels
    unnamed = len(channels) > 2 and all(c.name == "NONE" for c in channels)
    if width > 1 or unnamed:
        return stream.layout.name, len(channels)
    return "mono", 1


def _packets(
    container: av.container.InputContainer,
    stream: av.AudioStream,
    guard: Guard,
    tally: _Tally,
) -> Iterator[av.Packet]:
    """Demuxed packets; a demuxer error resumes reading after the bad data, a bounded
    number of times."""
    while tally.demux_errors < _MAX_DEMUX_ERRORS:
        packets = container.demux(stream)
        while True:
            guard.check()
            try:
                packet = next(packets)
            except StopIteration:
                return
            except av.error.ExitError:
                raise
            except av.FFmpegError:
                tally.demux_errors += 1  # the generator is spent; a fresh demux() resumes
                break
            yield packet


def _frames(packets: Iterator[av.Packet], tally: _Tally) -> Iterator[av.AudioFrame]:
    """Decoded frames; a packet that does not decode is counted and skipped."""
    for packet in packets:
        try:
            frames = packet.decode()
        except av.error.ExitError:
            raise
        except av.FFmpegError:
            tally.bad_packets += 1
            continue
        if packet.size:
            tally.good_packets += 1
        for frame in frames:
            if frame.is_corrupt:
                tally.corrupt_frames += 1
            if isinstance(frame, av.AudioFrame):  # demux(stream) yields the audio stream only
                yield frame


def _bounded(
    frames: Iterator[av.AudioFrame], settings: Settings, tally: _Tally, width: int
) -> Iterator[av.AudioFrame]:
    """Frames until the input passes the length cap, counted before resampling: one frame
    at a tiny declared sample rate would otherwise expand to a huge buffer in the resampler.
    ``width`` channels kept apart count ``width`` times."""
    for frame in frames:
        tally.seconds_in += width * frame.samples / frame.sample_rate
        if tally.seconds_in > settings.max_audio_seconds + 0.01:
            raise WorkerError(Code.AUDIO_TOO_LONG, _too_long_message(settings, None, width))
        yield frame


def _resampled(frames: Iterator[av.AudioFrame], layout: str, width: int) -> Iterator[np.ndarray]:
    """16 kHz float32 chunks, shaped (channels, samples): ``mono``, resampled exactly as
    ``faster_whisper.decode_audio`` does, or each channel of the stream's ``layout`` on its
    own row (``width`` of them; a frame in another layout is mixed into it).

    Through signed 16-bit, as faster-whisper does, so that a user comparing the two gets the
    same samples: FFmpeg normalises the downmix matrix for integer output (stereo becomes
    (L+R)/2; float output would give (L+R)*0.707, 3 dB louder, and can clip).
    """
    resampler: av.AudioResampler | None = None
    key: tuple[str, str, int] | None = None
    for frame in frames:
        frame_key = (frame.format.name, frame.layout.name, frame.sample_rate)
        if resampler is None or frame_key != key:
            # A mid-stream change of rate or layout (concatenated MP3s, damaged headers)
            # needs a new resampler; flush the old one first.
            if resampler is not None:
                yield from _pcm(resampler.resample(None), width)
            # Packed, then split here: PyAV 18 crashes (SIGSEGV) reading 8 or more planes.
            resampler = av.AudioResampler(format="s16", layout=layout, rate=SAMPLE_RATE)
            key = frame_key
        frame.pts = None  # timestamps of damaged streams jump; the samples are all we need
        yield from _pcm(resampler.resample(frame), width)
    if resampler is not None:
        yield from _pcm(resampler.resample(None), width)


def _pcm(frames: list[av.AudioFrame], width: int) -> Iterator[np.ndarray]:
    for out in frames:
        yield out.to_ndarray().reshape(-1, width).T.astype(np.float32) / 32768.0


def _collect(
    chunks: Iterator[np.ndarray], settings: Settings, declared: float | None, width: int
) -> list[np.ndarray]:
    """Each row of the chunks into its channel's buffer; together at most the length cap."""
    max_samples = math.ceil(settings.max_audio_seconds * SAMPLE_RATE / width)
    expected = declared if declared is not None else _INITIAL_SECONDS
    initial = math.ceil(expected * SAMPLE_RATE) + SAMPLE_RATE
    buffers = [_SampleBuffer(initial, max_samples) for _ in range(width)]
    for chunk in chunks:  # ``width`` rows each: the resampler's layout, or their mean
        if not all(b.append(row) for b, row in zip(buffers, chunk, strict=True)):
            raise WorkerError(Code.AUDIO_TOO_LONG, _too_long_message(settings, None, width))
    return [b.finish() for b in buffers]


def _verdict(samples: np.ndarray, tally: _Tally, declared: float | None) -> list[str]:
    """Refuse a stream that is mostly damage; warn about skipped data and a short decode."""
    skipped = tally.skipped
    if len(samples) == 0:
        if skipped or tally.corrupt_frames:
            raise WorkerError(Code.CORRUPT_MEDIA, "The audio stream is corrupt: nothing decoded.")
        raise WorkerError(Code.EMPTY_AUDIO, "The file contains no audio samples.")
    if skipped > tally.good_packets:
        raise WorkerError(
            Code.CORRUPT_MEDIA,
            f"The audio stream is corrupt: {skipped} of {skipped + tally.good_packets} packets "
            "could not be decoded.",
        )
    warnings: list[str] = []
    if skipped:
        warnings.append(f"Skipped {skipped} corrupt or undecodable packet(s) of the audio stream.")
    if tally.corrupt_frames:
        warnings.append(f"{tally.corrupt_frames} decoded frame(s) were flagged as corrupt.")
    duration = len(samples) / SAMPLE_RATE
    if declared is not None and declared - duration > max(
        _SHORTFALL_S, _SHORTFALL_FRACTION * declared
    ):
        warnings.append(
            f"Decoded {duration:.1f} s of a declared {declared:.1f} s: "
            "the file may be truncated or damaged."
        )
    return warnings


class _SampleBuffer:
    """A float32 buffer that grows by doubling up to a hard limit.

    ``ndarray.resize`` reallocates in place (large blocks are moved with mremap, not
    copied), so growing does not hold two copies; nothing like a list of frames builds up.
    """

    def __init__(self, initial: int, limit: int) -> None:
        # A little slack over the cap for the resampler's flush and rounding.
        self._hard_limit = limit + SAMPLE_RATE // 10
        self._buf = np.empty(max(1, min(initial, self._hard_limit)), dtype=np.float32)
        self._n = 0

    def append(self, chunk: np.ndarray) -> bool:
        """Append ``chunk``; False (nothing appended) when it would pass the limit."""
        end = self._n + len(chunk)
        if end > self._hard_limit:
            return False
        if end > len(self._buf):
            size = min(self._hard_limit, max(end, 2 * len(self._buf)))
            self._buf.resize(size, refcheck=False)
        self._buf[self._n : end] = chunk
        self._n = end
        return True

    def finish(self) -> np.ndarray:
        """The samples, with the unused tail given back."""
        if self._n < len(self._buf):
            self._buf.resize(max(1, self._n), refcheck=False)
        return self._buf[: self._n]
