"""Small bad or odd media files, generated at test time (usually into ``tmp_path``).

Each helper writes one file and returns its path, so any test (decode, sources, end to
end) can build the same inputs without committing binaries. Files stay tiny: compressed
silence declares minutes in a few KB.
"""

from __future__ import annotations

import io
import pathlib
import random
import struct
import wave
import zlib

import av
import numpy as np


def write_bytes(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.write_bytes(data)
    return path


def png_bytes() -> bytes:
    """A valid 1x1 grey PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1x1, 8-bit greyscale
    pixels = zlib.compress(b"\x00\x80")  # filter byte + one pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


HTML_PAGE = b"<!doctype html><html><head><title>403</title></head><body>Denied</body></html>\n"
JSON_PAGE = b'{"error": "AccessDenied", "message": "Request has expired"}\n'


def write_wav(
    path: pathlib.Path, samples: np.ndarray | None = None, *, rate: int = 16000
) -> pathlib.Path:
    """16-bit mono WAV of ``samples`` (float in [-1, 1]); no samples gives a header alone."""
    pcm = (
        np.zeros(0, np.int16) if samples is None else (np.asarray(samples) * 32767).astype(np.int16)
    )
    return write_pcm(path, pcm.reshape(-1, 1), rate)


def write_pcm(path: pathlib.Path, pcm: np.ndarray, rate: int = 16000) -> pathlib.Path:
    """A 16-bit WAV of ``pcm`` (int16, a column per channel)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(pcm, np.int16).tobytes())
    return path


def write_tone_wav(path: pathlib.Path, seconds: float, *, rate: int = 16000) -> pathlib.Path:
    t = np.arange(round(seconds * rate)) / rate
    return write_wav(path, 0.5 * np.sin(2 * np.pi * 440.0 * t), rate=rate)


def write_bogus_header_wav(path: pathlib.Path, seconds: float, *, rate: int = 8000) -> pathlib.Path:
    """A WAV whose RIFF and data sizes say 0xFFFFFFFF (as a streaming writer leaves them)."""
    write_tone_wav(path, seconds, rate=rate)
    data = bytearray(path.read_bytes())
    data[4:8] = b"\xff\xff\xff\xff"
    pos = data.index(b"data")
    data[pos + 4 : pos + 8] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))
    return path


class _Pipe(io.RawIOBase):
    """A write-only, non-seekable sink: muxers cannot go back to write a duration."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b) -> int:  # noqa: ANN001 - buffer protocol object
        self.data += bytes(b)
        return len(b)


def encode_silence(
    fmt: str,
    codec: str,
    seconds: float,
    *,
    rate: int = 8000,
    piped: bool = False,
    layout: str = "mono",
) -> bytes:
    """Encode ``seconds`` of silence with PyAV (``layout``: its channels); ``piped`` writes
    as to a pipe."""
    sink: io.IOBase = _Pipe() if piped else io.BytesIO()
    with av.open(sink, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        sample_fmt = stream.codec_context.format.name
        done, total = 0, round(seconds * rate)
        while done < total:
            n = min(4096, total - done)
            frame = av.AudioFrame(format=sample_fmt, layout=layout, samples=n)
            for plane in frame.planes:
                plane.update(bytes(plane.buffer_size))
            frame.sample_rate = rate
            frame.pts = done
            for packet in stream.encode(frame):
                container.mux(packet)
            done += n
        for packet in stream.encode(None):
            container.mux(packet)
    return bytes(sink.data) if piped else sink.getvalue()


def write_long_flac(path: pathlib.Path, seconds: float = 120.0) -> pathlib.Path:
    """A FLAC of silence that declares (and holds) ``seconds``; 120 s is about 28 KB."""
    return write_bytes(path, encode_silence("flac", "flac", seconds))


def write_undeclared_mkv(path: pathlib.Path, seconds: float = 120.0) -> pathlib.Path:
    """FLAC silence in Matroska written as to a pipe: FFmpeg reports no duration at all."""
    return write_bytes(path, encode_silence("matroska", "flac", seconds, piped=True))


def write_video_only_mp4(path: pathlib.Path, frames: int = 5) -> pathlib.Path:
    """An MP4 with a few tiny MPEG-4 video frames and no audio stream."""
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            image = np.full((16, 16, 3), i * 40, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


def write_m3u8(path: pathlib.Path, segment_url: str) -> pathlib.Path:
    """An HLS playlist with one segment at ``segment_url``."""
    text = (
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n"
        f"#EXTINF:10.0,\n{segment_url}\n#EXT-X-ENDLIST\n"
    )
    path.write_text(text)
    return path


def write_ffconcat(path: pathlib.Path, *targets: str) -> pathlib.Path:
    """An ffconcat script listing ``targets`` (files or URLs)."""
    path.write_text("ffconcat version 1.0\n" + "".join(f"file '{t}'\n" for t in targets))
    return path


def write_dash_mpd(path: pathlib.Path, base_url: str) -> pathlib.Path:
    """A static DASH manifest whose one representation lives at ``base_url``."""
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" '
        'mediaPresentationDuration="PT10S" minBufferTime="PT1S" '
        'profiles="urn:mpeg:dash:profile:isoff-on-demand:2011">\n'
        '<Period><AdaptationSet mimeType="audio/mp4">'
        f'<Representation id="a" bandwidth="64000" codecs="mp4a.40.2">'
        f"<BaseURL>{base_url}</BaseURL></Representation>"
        "</AdaptationSet></Period></MPD>\n"
    )
    return path


def write_truncated(src: pathlib.Path, dst: pathlib.Path, fraction: float = 0.5) -> pathlib.Path:
    data = src.read_bytes()
    return write_bytes(dst, data[: int(len(data) * fraction)])


def write_bit_flipped(
    src: pathlib.Path, dst: pathlib.Path, *, flips: int = 200, skip: int = 1000, seed: int = 1
) -> pathlib.Path:
    """Copy ``src`` with ``flips`` random single-bit errors after the first ``skip`` bytes."""
    data = bytearray(src.read_bytes())
    rnd = random.Random(seed)
    for _ in range(flips):
        i = rnd.randrange(skip, len(data))
        data[i] ^= 1 << rnd.randrange(8)
    return write_bytes(dst, bytes(data))


def write_byte_smashed(
    src: pathlib.Path, dst: pathlib.Path, *, every: int, skip: int = 2000
) -> pathlib.Path:
    """Copy ``src`` with every ``every``-th byte after ``skip`` inverted: heavy damage."""
    data = bytearray(src.read_bytes())
    for i in range(skip, len(data), every):
        data[i] ^= 0xFF
    return write_bytes(dst, bytes(data))


_LIBRIVOX = pathlib.Path(__file__).parent / "data" / "librivox"
_CLIP = "sense_and_sensibility_01_austen_64kb-{}.wav"
CALL_TEXTS = (
    "he was not an ill disposed young man he might even have been made amiable himself",
    "unless to be rather cold hearted and rather selfish is to be ill disposed",
)
"""What each channel of :func:`write_call_wav` says (LibriVox's own transcripts)."""


def write_call_wav(path: pathlib.Path, *, rate: int = 16000, same: bool = False) -> pathlib.Path:
    """A two-channel call built from real speech: channel 0 speaks at 0 s and 9.3 s,
    channel 1 at 3.5 s in between (its words then come second); ``same``: channel 1
    repeats channel 0 (a mono call saved as stereo)."""

    def clip(name: str) -> np.ndarray:
        with wave.open(str(_LIBRIVOX / _CLIP.format(name))) as w:
            return np.frombuffer(w.readframes(w.getnframes()), np.int16)

    length = 13 * 16000
    left, right = np.zeros(length, np.int16), np.zeros(length, np.int16)
    for channel, name, at in ((left, "0880", 0.0), (right, "0890", 3.5), (left, "0930", 9.3)):
        pcm = clip(name)
        start = round(at * 16000)
        channel[start : start + len(pcm)] = pcm
    if same:
        right = left
    stereo = np.stack([left, right], axis=1)
    if rate != 16000:
        index = np.arange(round(length * rate / 16000)) * 16000 // rate
        stereo = stereo[index]
    return write_pcm(path, stereo, rate)
