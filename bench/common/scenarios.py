"""Arrival schedules for the harness: Offline, Server (Poisson) and trace replay.

A schedule is a list of :class:`Arrival`: when (seconds after the start of the run) a
query is handed to the platform, and the query itself (real speech from
:mod:`speech_assets.clips`, sent inline as ``audio_base64``). LoadGen's terms: Offline hands
every query over at once; Server hands them over at Poisson-distributed times.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speech_assets.clips import Clip, clips, long_clip

SCENARIOS = ("offline", "server", "trace")


@dataclass(frozen=True)
class Query:
    """One transcription request: its job input and what a right answer looks like."""

    name: str
    audio: bytes = field(repr=False)
    audio_seconds: float
    reference: str | None
    options: tuple[tuple[str, Any], ...] = ()

    def job_input(self) -> dict[str, Any]:
        return {"audio_base64": base64.b64encode(self.audio).decode(), **dict(self.options)}


@dataclass(frozen=True)
class Arrival:
    offset_s: float
    query: Query


def clip_query(clip: Clip, options: dict[str, Any] | None = None) -> Query:
    return Query(
        clip.name, clip.wav_bytes(), clip.seconds, clip.text, tuple(sorted((options or {}).items()))
    )


def query_pool(long_seconds: float = 0.0, options: dict[str, Any] | None = None) -> list[Query]:
    """The real clips (JFK and LibriVox, about 36 s), plus one long concatenation if asked."""
    pool = [clip_query(c, options) for c in clips()]
    if long_seconds > 0:
        pool.append(clip_query(long_clip(long_seconds), options))
    return pool


def pick(pool: list[Query], n: int, seed: int) -> list[Query]:
    """n queries cycling through a seeded shuffle of the pool (each used evenly)."""
    if not pool:
        raise ValueError("empty query pool")
    order = list(pool)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(n)]


def offline(queries: list[Query]) -> list[Arrival]:
    """Every query at once."""
    return [Arrival(0.0, q) for q in queries]


def server(queries: list[Query], rate: float, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` queries per second; the first at time 0."""
    if rate <= 0:
        raise ValueError("rate must be positive (queries per second)")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i, q in enumerate(queries):
        if i:
            t += rng.expovariate(rate)
        out.append(Arrival(t, q))
    return out


def read_trace(path: str | Path, options: dict[str, Any] | None = None) -> list[Arrival]:
    """Replay a trace file: one ``timestamp,audio_file`` per line.

    Timestamps are seconds (absolute or relative; the first becomes 0); audio files are
    WAV/MP3/... paths, relative to the trace file's folder. Blank lines and lines starting
    with ``#`` are skipped. A ``<name>.txt`` next to an audio file is its reference text.
    """
    path = Path(path)
    rows: list[tuple[float, Path]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        stamp, sep, name = line.partition(",")
        if not sep or not name.strip():
            raise ValueError(f"{path.name}:{n}: expected 'timestamp,audio_file'")
        try:
            t = float(stamp)
        except ValueError:
            raise ValueError(f"{path.name}:{n}: timestamp {stamp!r} is not a number") from None
        audio = Path(name.strip())
        rows.append((t, audio if audio.is_absolute() else path.parent / audio))
    if not rows:
        raise ValueError(f"{path.name}: no arrivals")
    t0 = min(t for t, _ in rows)
    cache: dict[Path, Query] = {}
    out = []
    for t, audio in sorted(rows, key=lambda r: r[0]):
        if audio not in cache:
            cache[audio] = file_query(audio, options)
        out.append(Arrival(t - t0, cache[audio]))
    return out


def file_query(audio: Path, options: dict[str, Any] | None = None) -> Query:
    """A query for an audio file; its duration is measured by decoding it with PyAV."""
    data = audio.read_bytes()
    ref = audio.with_suffix(".txt")
    return Query(
        audio.name,
        data,
        _duration(audio),
        ref.read_text().strip() if ref.exists() else None,
        tuple(sorted((options or {}).items())),
    )


def _duration(audio: Path) -> float:
    if audio.suffix.lower() == ".wav":
        import wave

        try:
            with wave.open(str(audio)) as w:
                return w.getnframes() / w.getframerate()
        except wave.Error:
            pass  # not plain PCM: let PyAV read it
    import av

    with av.open(str(audio)) as container:
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration or 0) / 1_000_000


def build(
    name: str,
    *,
    jobs: int,
    rate: float | None = None,
    seed: int = 0,
    trace: str | Path | None = None,
    long_seconds: float = 0.0,
    options: dict[str, Any] | None = None,
) -> list[Arrival]:
    """The schedule of a named scenario (see :data:`SCENARIOS`)."""
    if name == "trace":
        if trace is None:
            raise ValueError("the trace scenario needs a trace file")
        return read_trace(trace, options)
    queries = pick(query_pool(long_seconds, options), jobs, seed)
    if name == "offline":
        return offline(queries)
    if name == "server":
        if rate is None:
            raise ValueError("the server scenario needs a rate (queries per second)")
        return server(queries, rate, seed)
    raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
