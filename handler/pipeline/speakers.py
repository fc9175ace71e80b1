"""A diarized job's extra steps: the known speakers' reference clips, fetched and bounded
like the job's own audio, and the diarizer run beside the transcription.

Called by the job step only for a job with ``diarize`` on a worker that loaded the
diarizer (WHISPER_DIARIZATION); the diarizer is handler.inference.speakers, and the turns
it finds are joined to the transcript by handler.output.speakers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.audio.read import read_audio
from handler.contract import SAMPLE_RATE
from handler.errors import Code, WorkerError
from handler.guard import Guard
from handler.schema import JobInput
from handler.schema_parts import KnownSpeaker
from handler.settings import Settings

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from handler.inference.speakers.diarizer import Diarizer
    from handler.pipeline.runtime import Call, Runtime

MIN_REFERENCE_S = 2.0
MAX_REFERENCE_S = 10.0
REFERENCE_SLACK_S = 0.25
"""Clips cut by hand run a little over or under; this much is forgiven either way."""
MIN_REFERENCE_SPEECH_S = 1.5
"""Speech a reference clip must hold (the VAD's): a voice is told apart on 1.5-s windows."""
MAX_REFERENCE_BYTES = 20 * 2**20
"""A reference clip's file: 10 s of audio in any sane format is far below this."""


def references(
    job: JobInput, settings: Settings, diarizer: Diarizer, call: Call
) -> dict[str, np.ndarray]:
    """name -> voice embedding of each known speaker's clip (2-10 s each)."""
    bounded = settings.model_copy(
        update={
            "max_download_bytes": min(settings.max_download_bytes, MAX_REFERENCE_BYTES),
            "max_inline_bytes": min(settings.max_inline_bytes, MAX_REFERENCE_BYTES),
            "max_audio_seconds": MAX_REFERENCE_S + REFERENCE_SLACK_S,
        }
    )
    t = time.perf_counter()
    out: dict[str, np.ndarray] = {}
    for i, known in enumerate(job.known_speakers or []):
        where = f"known_speakers[{i}]"
        samples = _reference_samples(known, bounded, call, where)
        regions = _speech_of(samples, where)
        out[known.name] = diarizer.clip_embedding(samples, regions)
    call.timings["references"] = time.perf_counter() - t
    return out


def _speech_of(samples: np.ndarray, where: str) -> list[tuple[int, int]]:
    """The clip's speech (the VAD's regions): a clip of silence, noise, a tone or music
    names no one (its embedding matched every voice alike)."""
    from handler.inference.speakers.windows import speech_regions

    regions = speech_regions(samples)
    speech = sum(b - a for a, b in regions) / SAMPLE_RATE
    if speech < MIN_REFERENCE_SPEECH_S:
        raise WorkerError(
            Code.INVALID_INPUT,
            f"{where}: {speech:.1f} s of speech heard; a reference clip is 2-10 s of the "
            f"speaker talking (at least {MIN_REFERENCE_SPEECH_S:g} s of speech)",
        )
    return regions


def _reference_samples(
    known: KnownSpeaker, settings: Settings, call: Call, where: str
) -> np.ndarray:
    try:
        audio = read_audio(
            settings, audio_base64=known.audio_base64, audio_url=known.audio_url, cancel=call.cancel
        )
    except WorkerError as exc:
        raise WorkerError(exc.code, f"{where}: {exc.message}", retryable=exc.retryable) from None
    problem = f"{where}: {audio.duration:.1f} s; a reference clip is 2-10 s"
    if audio.duration > MAX_REFERENCE_S + REFERENCE_SLACK_S:
        raise WorkerError(Code.AUDIO_TOO_LONG, problem)
    if audio.duration < MIN_REFERENCE_S - REFERENCE_SLACK_S:
        raise WorkerError(Code.INVALID_INPUT, problem)
    return audio.samples


class _Linked(threading.Event):
    """Set by itself, or when the job's own cancel event is."""

    def __init__(self, parent: threading.Event | None) -> None:
        super().__init__()
        self.parent = parent

    def is_set(self) -> bool:
        return super().is_set() or (self.parent is not None and self.parent.is_set())


def first(
    job: JobInput, worker: Runtime, call: Call, samples: np.ndarray, budget_s: float | None
) -> None:
    """Diarize before the transcription (``"language": "multi"`` cuts its parts at the
    speaker turns): ``call.diarization`` is set, and :func:`beside` then runs nothing."""
    with beside(job, worker, call, samples, budget_s, after=True):
        pass


@contextlib.contextmanager
def beside(
    job: JobInput,
    worker: Runtime,
    call: Call,
    samples: np.ndarray,
    budget_s: float | None,
    *,
    after: bool = False,
) -> Iterator[None]:
    """Diarize ``samples`` and store the result in ``call.diarization``: in a thread while
    the body (the transcription) runs, or after it (``after``, or the worker's
    ``diarize_beside`` switched off). A failed transcription stops it (or never starts
    it); its own failure (cancel, compute budget) fails the job. Already diarized
    (:func:`first`): nothing."""
    if not job.diarize or worker.diarizer is None or call.diarization is not None:
        yield
        return
    count = _count(job)
    stop = _Linked(call.cancel)
    guard = _guard(stop, budget_s)
    box: dict[str, Any] = {}
    diarizer = worker.diarizer

    def work() -> None:
        _diarize(box, job, diarizer, samples, count, guard, call.references)

    if after or not worker.diarize_beside:
        yield
        t = time.perf_counter()
        work()
        if "error" in box:
            raise box["error"]
        _store(call, box)
        call.timings["diarize"] = time.perf_counter() - t
        return

    thread = threading.Thread(target=work, name=f"diarize-{call.job_id}", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        if not ok:
            stop.set()
        t = time.perf_counter()
        thread.join()
        call.timings["diarize_wait"] = time.perf_counter() - t
    if "error" in box:
        raise box["error"]
    _store(call, box)
    done = box.get("result")
    call.timings["diarize"] = (
        done.seconds if done is not None else sum(box["windows"].timings.values())
    )


def _diarize(
    box: dict[str, Any],
    job: JobInput,
    diarizer: Diarizer,
    samples: np.ndarray,
    count: Any,
    guard: Guard,
    references: dict[str, np.ndarray],
) -> None:
    """The diarizer's work, its result (or error) in ``box``; a split job's piece embeds
    its windows only (``speaker_windows``: the whole clusters them)."""
    try:
        if job.speaker_windows:
            box["windows"] = diarizer.windows_of(samples, guard)
        else:
            box["result"] = diarizer.run(samples, count, guard, references)
    except BaseException as exc:  # handed to the job's thread
        box["error"] = exc


def _store(call: Call, box: dict[str, Any]) -> None:
    if "windows" in box:
        call.speaker_windows = box["windows"]
    else:
        call.diarization = box["result"]
        call.warnings += box["result"].warnings


def _guard(stop: threading.Event | None, budget_s: float | None) -> Guard:
    deadline = None if budget_s is None else time.monotonic() + budget_s
    return Guard(
        stop, deadline, Code.COMPUTE_BUDGET_EXCEEDED, "diarization used the job's compute budget"
    )


def _count(job: JobInput) -> Any:
    from handler.inference.speakers.clusters import SpeakerCount

    return SpeakerCount(
        job.num_speakers, job.min_speakers or 1, job.max_speakers or max(job.min_speakers or 1, 8)
    )


def from_pieces(
    job: JobInput,
    worker: Runtime,
    call: Call,
    samples: np.ndarray,
    pieces: list[tuple[int, Any]],
    budget_s: float | None,
) -> None:
    """A split job's speakers: the pieces' embedded windows (each at its start sample)
    clustered as one recording's, into ``call.diarization``. A piece that returned none
    (a worker of an older image) makes this worker embed the whole itself."""
    from handler.inference.speakers.windows import Windows

    diarizer = worker.diarizer
    assert diarizer is not None  # refused in the plan otherwise
    t = time.perf_counter()
    guard = _guard(call.cancel, budget_s)
    try:
        parts = [Windows.from_json(w, diarizer.embedding_size).shifted(a) for a, w in pieces]
        whole = Windows.joined(parts, diarizer.embedding_size)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning(
            "a piece's speaker windows are unusable (%s): embedding the whole here",
            type(exc).__name__,
        )
        whole = diarizer.windows_of(samples, guard, fine=False)
    call.diarization = diarizer.finish(samples, whole, _count(job), guard, call.references)
    call.warnings += call.diarization.warnings
    call.timings["diarize"] = time.perf_counter() - t
