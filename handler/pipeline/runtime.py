"""What every step of a job is handed: the worker's ``Runtime`` (built once at start-up),
one job's ``Call`` (its caller side, and what the steps gather for the answer) and its
``Plan`` (the model, options and languages chosen before any audio is fetched).

This module imports no step of the pipeline, so each step can import it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.audio.sources import JOB_DIR_PREFIX
from handler.inference import align, allocator, transcribe
from handler.inference.engine import Engine
from handler.inference.memory import MIB, MemoryBudget, auto_budget_bytes
from handler.inference.models import LoadedModel, ModelPool
from handler.schema import JobInput
from handler.settings import Settings

if TYPE_CHECKING:
    from handler.inference.speakers.diarizer import Diarizer
    from handler.inference.speakers.turns import Diarization
    from handler.inference.speakers.windows import Windows

log = logging.getLogger(__name__)


MIN_AUDIO_SECONDS = 0.1


ProgressCallback = Callable[[float], None]


@dataclass
class Runtime:
    """Everything a job needs, built once at start-up: the settings, the loaded models, the
    engine, the memory budget (a worker process's runtime, whichever face it serves)."""

    settings: Settings
    pool: ModelPool
    jobs_done: int = 0
    engine: Engine = field(default_factory=Engine)
    """Schedulers that batch windows of many jobs per model instance (batch_size > 1)."""
    memory: MemoryBudget | None = None
    """Admission by estimated memory (handler.inference.memory); built on first use."""
    refresh_wanted: bool = False
    """Set when the worker should be replaced (GPU OOM, job or memory budget reached)."""
    in_flight: int = 0
    """Jobs between run_job's start and end."""
    diarizer: Diarizer | None = None
    """The speaker diarizer (WHISPER_DIARIZATION), loaded beside the models; else None."""
    diarize_beside: bool = True
    """The diarizer runs in a thread beside the transcription (else after it). Beside on
    every device: on a GPU the CPU cores diarize while the GPU transcribes; on a 2-core CPU
    the two are level (``python -m bench diarization --wer 4`` times both ways)."""
    fan_out: FanOut | None = None
    """Runs a split job's pieces as jobs of the worker's own endpoint (the queue face sets
    it when the endpoint's key is in the environment); None: ``split`` is refused."""
    _aligner: align.Aligner | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def aligner(self) -> align.Aligner | None:
        """The forced aligner's decoders, shared by the jobs (None: not installed)."""
        with self._lock:
            if self._aligner is None and align.available():
                self._aligner = align.Aligner(self.settings.align_threads)
            return self._aligner

    def memory_budget(self) -> MemoryBudget:
        with self._lock:
            if self.memory is None:
                mb = self.settings.memory_budget_mb
                total = mb * MIB if mb else auto_budget_bytes(int(rss_mb() * MIB))
                self.memory = MemoryBudget(total)
            return self.memory

    def job_started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def job_finished(self, audio_seconds: float = 0.0) -> None:
        with self._lock:
            self.in_flight -= 1
            if audio_seconds >= allocator.RELEASE_AFTER_AUDIO_S and self.in_flight == 0:
                # The allocator keeps what jobs freed (handler.inference.allocator); a long job's
                # audio and features need not stay resident while the worker waits.
                allocator.release()
            self.jobs_done += 1
            limit = self.settings.refresh_after_jobs
            if limit and self.jobs_done >= limit:
                self.refresh_wanted = True
            if self.settings.max_rss_mb and rss_mb() > self.settings.max_rss_mb:
                self.refresh_wanted = True


def sweep_stale_job_dirs(settings: Settings) -> int:
    """Remove job folders a killed worker left behind (partial downloads); returns how many.

    A job's folder lives only while it fetches and decodes, so one older than both
    deadlines together cannot belong to a running job, even of another worker sharing
    this temporary folder.
    """
    import shutil

    limit = settings.download_timeout_s + settings.decode_timeout_s + 60
    now = time.time()
    removed = 0
    for path in Path(tempfile.gettempdir()).glob(JOB_DIR_PREFIX + "*"):
        try:
            if path.is_dir() and not path.is_symlink() and now - path.stat().st_mtime > limit:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    if removed:
        log.info("removed %d job folder(s) left by an earlier worker", removed)
    return removed


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Call:
    """One job's caller side, and what the pipeline gathers for its answer."""

    job_id: str = "-"
    cancel: threading.Event | None = None
    on_segment: transcribe.SegmentCallback | None = None
    on_progress: ProgressCallback | None = None
    audio: bytes | None = None
    """The file's bytes when they arrive beside the input (an HTTP upload, bounded there)."""
    samples: np.ndarray | None = None
    """Audio already decoded (16-kHz float32: a realtime session's turn)."""
    start: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    references: dict[str, np.ndarray] = field(default_factory=dict)
    """Known speakers' voice embeddings (a diarized job's ``known_speakers``)."""
    diarization: Diarization | None = None
    speaker_windows: Windows | None = None
    """A split job's piece (``speaker_windows``): its embedded windows, not its speakers."""
    pieces: list[dict[str, Any]] | None = None
    """A split job's pieces: where each is, its job, its tries and seconds."""
    word_alignment: dict[str, str] | None = None
    """How the words were timed, per language (``forced`` or ``whisper``); None: no words."""
    channels: list[dict[str, Any]] | None = None
    """A ``multichannel`` job: each channel's text and language (pipeline.channels)."""
    held_bytes: int = 0
    """Memory the job holds beside the audio it transcribes now (a ``multichannel`` job's
    channels waiting their turn), reserved with it."""


PieceDone = Callable[[int, dict[str, Any]], None]
"""Told once that piece i has ended, with its output, as soon as it has."""


FanOut = Callable[
    [
        list[dict[str, Any]],
        threading.Event | None,
        Callable[[int], dict[str, Any]] | None,
        PieceDone | None,
    ],
    list[dict[str, Any]],
]
"""Each piece's job input run on the platform (or, given a way to, piece i on this worker
when no other takes it), each ended piece told to the last argument; their outputs, job
ids and tries, in order."""


def compute_budget(settings: Settings, duration: float) -> float | None:
    """Seconds this job may spend in the model (None: unbounded)."""
    floor, factor = settings.compute_budget_floor_s, settings.compute_budget_factor
    return floor + factor * duration if floor or factor else None


@dataclass(frozen=True)
class Plan:
    """A job's decisions, made before any audio is fetched: what the model cannot do was
    refused while making it."""

    job: JobInput
    model: LoadedModel
    kwargs: dict[str, Any]
    """faster-whisper's keyword arguments for this job."""
    languages: list[str] | None
    """The languages detection may pick from (None: any)."""
    batch_size: int
