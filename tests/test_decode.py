"""Bounded decoding (handler/audio/decode.py): real files, real PyAV, every bad-media case.

Bad inputs are generated into ``tmp_path`` by tests/media.py; the playlist cases run a
real HTTP server on 127.0.0.1 that must receive no request.
"""

from __future__ import annotations

import http.server
import io
import os
import pathlib
import threading
import time
import tracemalloc

import av
import faster_whisper
import numpy as np
import pytest

from handler.audio.decode import (
    SAMPLE_RATE,
    DecodedAudio,
    decode_audio,
    decode_bytes,
    demuxer_whitelist,
)
from handler.errors import Code, WorkerError
from handler.settings import Settings
from tests import media

DATA = pathlib.Path(__file__).parent / "data"
JFK_WAV = DATA / "jfk.wav"
JFK_MP3 = DATA / "jfk.mp3"
CAPPED = Settings(max_audio_seconds=60)


def refused(path: pathlib.Path, settings: Settings = CAPPED, **kw) -> WorkerError:
    with pytest.raises(WorkerError) as info:
        decode_audio(path, settings, **kw)
    err = info.value
    # Never FFmpeg's raw text, never the path (it names the job's temp file).
    assert str(path.parent) not in err.message and path.name not in err.message
    assert "Errno" not in err.message and "last error log" not in err.message
    return err


# --- good audio ------------------------------------------------------------------------


@pytest.mark.parametrize("path", [JFK_WAV, JFK_MP3], ids=["wav", "mp3"])
def test_jfk_matches_faster_whisper(path: pathlib.Path) -> None:
    reference = faster_whisper.decode_audio(str(path))
    got = decode_audio(path, Settings())
    assert isinstance(got, DecodedAudio)
    assert got.samples.dtype == np.float32 and got.samples.ndim == 1
    assert got.duration == pytest.approx(11.0, abs=0.05)
    assert got.duration == len(got.samples) / SAMPLE_RATE
    assert got.declared_duration == pytest.approx(11.0, abs=0.05)
    assert got.warnings == []
    np.testing.assert_array_equal(got.samples, reference)
    assert np.abs(got.samples).max() <= 1.0


def _stereo_resampled(tmp_path: pathlib.Path, fmt: str, codec: str, rate: int) -> pathlib.Path:
    """JFK at another rate, in stereo with different channels (L loud, R an echo)."""
    mono = faster_whisper.decode_audio(str(JFK_WAV))
    left = np.interp(np.arange(0, len(mono), SAMPLE_RATE / rate), np.arange(len(mono)), mono)
    right = np.roll(left, rate // 10) * 0.5
    pcm = (np.stack([left, right], axis=1) * 0.9 * 32767).astype(np.int16)
    path = tmp_path / f"stereo.{fmt}"
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo")
        for start in range(0, len(pcm), 1024):
            block = np.ascontiguousarray(pcm[start : start + 1024])
            frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format="s16", layout="stereo")
            frame.rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.mark.parametrize(
    "fmt,codec,rate",
    [("wav", "pcm_s16le", 8000), ("wav", "pcm_s16le", 48000), ("flac", "flac", 44100)],
)
def test_resampled_stereo_matches_faster_whisper_exactly(
    tmp_path: pathlib.Path, fmt: str, codec: str, rate: int
) -> None:
    # faster-whisper resamples through int16, where FFmpeg's downmix is (L+R)/2; a float
    # resampler gives (L+R)*0.707 and other rounding, and single transcripts flip.
    path = _stereo_resampled(tmp_path, fmt, codec, rate)
    reference = faster_whisper.decode_audio(str(path))
    got = decode_audio(path, Settings())
    np.testing.assert_array_equal(got.samples, reference)


def test_decode_bytes_and_temp_file_removed(no_leaks: pathlib.Path) -> None:
    # no_leaks: tempfile points at a folder of this test's own (other test processes may
    # be writing whisper-in-* files in the shared one) and must be empty afterwards.
    got = decode_bytes(JFK_MP3.read_bytes(), Settings())
    assert got.format_name == "mp3"
    assert got.duration == pytest.approx(11.0, abs=0.05)
    with pytest.raises(WorkerError) as info:
        decode_bytes(b"", Settings())
    assert info.value.code is Code.UNSUPPORTED_OR_CORRUPT_MEDIA


def test_mp4_audio_passes_the_grouped_demuxer_name(tmp_path: pathlib.Path) -> None:
    path = media.write_bytes(tmp_path / "a.m4a", media.encode_silence("mp4", "aac", 2.0))
    got = decode_audio(path, Settings())
    assert got.format_name == "mov,mp4,m4a,3gp,3g2,mj2"
    assert got.duration == pytest.approx(2.0, abs=0.1)


def test_whitelist_is_flattened() -> None:
    assert demuxer_whitelist(["wav", "mov,mp4,m4a", " mp3 ", "wav"]) == "wav,mov,mp4,m4a,mp3"
    names = demuxer_whitelist(Settings().allowed_formats).split(",")
    assert "mov" in names and "webm" in names and "hls" not in names and "concat" not in names


def test_format_outside_the_allowlist_is_refused() -> None:
    err = refused(JFK_MP3, Settings(allowed_formats=["wav"]))
    assert err.code is Code.UNSUPPORTED_OR_CORRUPT_MEDIA


def test_sample_rate_change_mid_stream(tmp_path: pathlib.Path) -> None:
    # Two MP3s glued together (16 kHz then 44.1 kHz): the resampler is rebuilt, not refused.
    tail = media.encode_silence("mp3", "libmp3lame", 2.0, rate=44100)
    path = media.write_bytes(tmp_path / "glued.mp3", JFK_MP3.read_bytes() + tail)
    got = decode_audio(path, Settings())
    assert got.duration == pytest.approx(13.0, abs=0.3)


# --- not audio -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,data",
    [
        ("zero", b""),
        ("random", np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()),
        ("html", media.HTML_PAGE),
        ("json", media.JSON_PAGE),
        ("png", media.png_bytes()),
    ],
)
def test_not_media_is_unsupported(tmp_path: pathlib.Path, name: str, data: bytes) -> None:
    err = refused(media.write_bytes(tmp_path / f"{name}.wav", data))
    assert err.code is Code.UNSUPPORTED_OR_CORRUPT_MEDIA
    assert not err.retryable


def test_video_only_mp4_has_no_audio_stream(tmp_path: pathlib.Path) -> None:
    err = refused(media.write_video_only_mp4(tmp_path / "video.mp4"))
    assert err.code is Code.NO_AUDIO_STREAM


def test_header_only_wav_is_empty(tmp_path: pathlib.Path) -> None:
    err = refused(media.write_wav(tmp_path / "header.wav"))
    assert err.code is Code.EMPTY_AUDIO


def test_fifo_is_refused_without_blocking(tmp_path: pathlib.Path) -> None:
    # Opening a FIFO for reading blocks until a writer comes; FFmpeg's timeout cannot help.
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    errors: list[WorkerError] = []

    def run() -> None:
        try:
            decode_audio(fifo, CAPPED)
        except WorkerError as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "decode_audio blocked on a FIFO"
    assert [e.code for e in errors] == [Code.UNSUPPORTED_OR_CORRUPT_MEDIA]


# --- playlists and manifests: refused, and no connection is ever made ------------------


@pytest.fixture
def http_hits():
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            body = JFK_WAV.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def _manifests(tmp_path: pathlib.Path, base: str) -> list[pathlib.Path]:
    return [
        media.write_m3u8(tmp_path / "playlist.m3u8", f"{base}/seg.ts"),
        media.write_m3u8(tmp_path / "playlist.wav", f"{base}/seg.ts"),
        media.write_ffconcat(tmp_path / "concat.wav", f"{base}/a.wav"),
        media.write_ffconcat(tmp_path / "local.ffconcat", str(JFK_WAV)),
        media.write_dash_mpd(tmp_path / "manifest.mpd", f"{base}/a.mp4"),
        media.write_dash_mpd(tmp_path / "manifest.wav", f"{base}/a.mp4"),
    ]


def test_manifests_refused_without_connecting(tmp_path: pathlib.Path, http_hits) -> None:
    base, hits = http_hits
    for path in _manifests(tmp_path, base):
        err = refused(path)
        assert err.code is Code.UNSUPPORTED_OR_CORRUPT_MEDIA, path.name
        assert base not in err.message
    assert hits == []


@pytest.mark.skipif("hls" not in av.formats_available, reason="FFmpeg build without HLS")
def test_control_the_server_sees_an_unguarded_playlist(tmp_path: pathlib.Path, http_hits) -> None:
    # Negative control: FFmpeg with a permissive protocol list does connect, so the
    # empty hit list above means something.
    base, hits = http_hits
    path = media.write_m3u8(tmp_path / "playlist.m3u8", f"{base}/seg.ts")
    try:
        with av.open(str(path), container_options={"protocol_whitelist": "file,http,tcp"}):
            pass
    except av.FFmpegError:
        pass
    assert hits


# --- length caps -----------------------------------------------------------------------


def test_declared_too_long_refused_before_decoding(tmp_path: pathlib.Path) -> None:
    path = media.write_long_flac(tmp_path / "long.flac", 120.0)
    assert path.stat().st_size < 40_000
    started = time.monotonic()
    err = refused(path)
    elapsed = time.monotonic() - started
    assert err.code is Code.AUDIO_TOO_LONG
    assert "declares 120.0 s" in err.message  # the declared check, not the sample count
    assert elapsed < 1.0


def test_undeclared_stream_stopped_at_cap_with_bounded_memory(tmp_path: pathlib.Path) -> None:
    path = media.write_undeclared_mkv(tmp_path / "stream.mkv", 600.0)
    with av.open(str(path)) as container:
        assert container.duration is None
    cap = Settings(max_audio_seconds=30)
    tracemalloc.start()
    try:
        err = refused(path, cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.code is Code.AUDIO_TOO_LONG
    assert "declares" not in err.message
    cap_bytes = 30 * SAMPLE_RATE * 4
    # 600 s would be 38 MB; the buffer never grows past the cap (plus a little slack).
    assert peak < cap_bytes * 1.5, peak


def test_undeclared_stream_under_cap_decodes(tmp_path: pathlib.Path) -> None:
    got = decode_audio(media.write_undeclared_mkv(tmp_path / "stream.mkv", 20.0), CAPPED)
    assert got.declared_duration is None
    assert got.duration == pytest.approx(20.0, abs=0.1)


def test_bogus_wav_header_sizes(tmp_path: pathlib.Path) -> None:
    path = media.write_bogus_header_wav(tmp_path / "bogus.wav", 3.0)
    got = decode_audio(path, CAPPED)
    assert got.duration == pytest.approx(3.0, abs=0.05)
    err = refused(path, Settings(max_audio_seconds=1))
    assert err.code is Code.AUDIO_TOO_LONG


# --- time and cancellation -------------------------------------------------------------


def test_decode_timeout(tmp_path: pathlib.Path) -> None:
    path = media.write_undeclared_mkv(tmp_path / "stream.mkv", 600.0)
    err = refused(path, Settings(decode_timeout_s=0.02))
    assert err.code is Code.DECODE_TIMEOUT


class CancelAfter(threading.Event):
    """A real Event that sets itself after being checked ``n`` times (mid-decode)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks = n

    def is_set(self) -> bool:
        self.checks -= 1
        if self.checks <= 0:
            self.set()
        return super().is_set()


def test_cancel_before_and_during_decode() -> None:
    already = threading.Event()
    already.set()
    assert refused(JFK_WAV, cancel=already).code is Code.CANCELLED
    during = CancelAfter(20)
    assert refused(JFK_MP3, cancel=during).code is Code.CANCELLED
    assert during.checks <= 0


# --- damaged files ---------------------------------------------------------------------


def test_truncated_mp3_warns(tmp_path: pathlib.Path) -> None:
    got = decode_audio(media.write_truncated(JFK_MP3, tmp_path / "half.mp3", 0.5), CAPPED)
    assert got.duration == pytest.approx(5.5, abs=0.3)
    assert any("declared 11.0 s" in w for w in got.warnings), got.warnings


def test_bit_flipped_mp3_warns(tmp_path: pathlib.Path) -> None:
    got = decode_audio(media.write_bit_flipped(JFK_MP3, tmp_path / "flipped.mp3"), CAPPED)
    assert got.warnings, "a damaged file decoded without a warning"
    assert any("corrupt" in w for w in got.warnings)


def test_badly_damaged_mp3_is_corrupt(tmp_path: pathlib.Path) -> None:
    path = media.write_byte_smashed(JFK_MP3, tmp_path / "smashed.mp3", every=5)
    assert refused(path).code is Code.CORRUPT_MEDIA


# --- tiny inputs: samples come back, the caller decides -------------------------------


@pytest.mark.parametrize("seconds,expected", [(1 / 16000, 1), (0.01, 160)])
def test_tiny_audio_decodes(tmp_path: pathlib.Path, seconds: float, expected: int) -> None:
    got = decode_audio(media.write_tone_wav(tmp_path / "tiny.wav", seconds), CAPPED)
    assert len(got.samples) == expected
    assert got.samples.dtype == np.float32


@pytest.mark.parametrize("seed", range(10))
def test_a_truncated_wav_always_warns(tmp_path: pathlib.Path, seed: int) -> None:
    """10 of 10 random cuts of a WAV used to decode silently short."""
    data = JFK_WAV.read_bytes()
    cut = int(np.random.default_rng(seed).uniform(0.1, 0.9) * len(data))
    path = media.write_bytes(tmp_path / "cut.wav", data[:cut])
    got = decode_audio(path, Settings())
    assert any("truncated" in w for w in got.warnings), (cut, got.warnings)


def test_a_wav_whose_data_chunk_declares_less_than_it_holds_warns(tmp_path: pathlib.Path) -> None:
    import struct

    data = bytearray(JFK_WAV.read_bytes())
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 32000)  # 1 s of the 11 s
    got = decode_audio(media.write_bytes(tmp_path / "short.wav", bytes(data)), Settings())
    assert got.duration == pytest.approx(1.0, abs=0.05)
    assert any("only the declared part" in w for w in got.warnings), got.warnings


def test_a_tag_that_is_not_utf8_does_not_refuse_the_audio(tmp_path: pathlib.Path) -> None:
    # PyAV < 19 fails the open on such a tag unless told metadata_errors="ignore"; PyAV 19
    # (what Python 3.12, the image's Python, installs) refuses that argument with a
    # TypeError and decodes the tag with surrogateescape. Either way the audio decodes.
    buf = io.BytesIO()
    tone = (np.sin(np.arange(16000) / 5) * 8000).astype(np.int16)[None, :]
    with av.open(buf, "w", format="flac") as out:
        out.metadata["title"] = "XXXXXXXX"
        stream = out.add_stream("flac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(tone, format="s16", layout="mono")
        frame.rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    data = buf.getvalue()
    assert data.count(b"XXXXXXXX") == 1
    path = tmp_path / "latin1-tag.flac"
    path.write_bytes(data.replace(b"XXXXXXXX", b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28"))
    got = decode_audio(path, Settings())
    assert abs(got.duration - 1.0) < 0.01 and float(np.abs(got.samples).max()) > 0.1
