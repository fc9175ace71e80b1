"""One job from input to result: validate, fetch, decode, transcribe, format, time it all.

This is the single code path behind the RunPod handler, the CLI and the tests. It is
synchronous (the async handler runs it in a thread) and never raises: every job ends in
exactly one result or one ``{"error", "error_code", "retryable"}`` body.
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from handler import diarization
from handler.audio.decode import SAMPLE_RATE, DecodedAudio, decode_audio
from handler.audio.encode import to_flac
from handler.audio.sources import JOB_DIR_PREFIX, decode_base64, fetch_to_file
from handler.contract import SEGMENT_FIELDS, Segment
from handler.errors import Code, WorkerError
from handler.inference import (
    allocator,
    checks,
    code_switch,
    language,
    pieces,
    threads,
    transcribe,
)
from handler.inference.engine import Engine
from handler.inference.memory import MIB, MemoryBudget, auto_budget_bytes, job_bytes
from handler.inference.models import LoadedModel, ModelPool
from handler.output import coverage, formats, speakers
from handler.output.cues import Layout
from handler.output.offload import PieceStore, deliver
from handler.schema import MAX_PIECES, JobInput, parse_job_input
from handler.settings import Settings

if TYPE_CHECKING:
    from handler.inference.diarize import Diarization, Diarizer, Windows

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
    fan_out: FanOut | None = None
    """Runs a split job's pieces as jobs of the worker's own endpoint (the queue face sets
    it when the endpoint's key is in the environment); None: ``split`` is refused."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
AUTO_PIECE_S = 240.0
"""``split: "auto"``: one piece per this much audio (4 min: a piece travels inline, FLAC)."""


def run_job(
    raw_input: Any,
    worker: Runtime,
    *,
    job_id: str = "-",
    cancel: threading.Event | None = None,
    on_segment: transcribe.SegmentCallback | None = None,
    on_progress: ProgressCallback | None = None,
    audio: bytes | None = None,
    samples: np.ndarray | None = None,
) -> dict[str, Any]:
    """Run one job; returns the output dict or an error dict, never raises.

    ``audio``: the file's bytes when they arrive beside the input (an HTTP upload, already
    bounded by the server); ``samples``: audio already decoded (16-kHz float32, a realtime
    turn). With either, the input carries no audio field.
    """
    call = Call(job_id, cancel, on_segment, on_progress, audio, samples)
    worker.job_started()
    try:
        result = _run(raw_input, worker, call)
    except WorkerError as exc:
        if exc.code is Code.GPU_OOM:
            worker.refresh_wanted = True
        elapsed = time.perf_counter() - call.start
        log.info("job %s failed: %s (%.2fs)", job_id, exc.code.value, elapsed)
        result = exc.to_result()
    except Exception:
        log.exception("job %s failed with an unexpected error", job_id)
        result = WorkerError(Code.INTERNAL, "internal error while processing the job").to_result()
    worker.job_finished(float(result.get("duration") or 0.0))
    return result


def _run(raw_input: Any, worker: Runtime, call: Call) -> dict[str, Any]:
    """The pipeline, step by step: each step is a function below, in this order."""
    job = parse_job_input(raw_input, audio_given=call.audio is not None or call.samples is not None)
    model, kwargs, languages = _plan(job, worker)
    if job.known_speakers and worker.diarizer is not None:
        call.references = diarization.references(job, worker.settings, worker.diarizer, call)
    audio = _fetch_and_decode(job, worker.settings, call)
    duration = audio.duration
    call.warnings += audio.warnings
    if duration < MIN_AUDIO_SECONDS:
        tr = _nothing_to_transcribe(job, call)
    elif (n := _pieces_wanted(job, duration)) > 1:
        tr = _split(job, model, kwargs, languages, audio, n, worker, call)
    else:
        tr = _transcribe(job, model, kwargs, languages, audio, worker, call)
    del audio  # its samples may be gigabytes: not kept while the result is shaped
    output = _answer(job, tr, duration, model, worker, call)
    _log_done(call, duration, model, _batch_size(job, worker.settings))
    return output


def _plan(job: JobInput, worker: Runtime) -> tuple[LoadedModel, dict[str, Any], list[str] | None]:
    """The model, the decoding options and the languages detection may pick; what the
    model cannot do is refused here, before any audio is fetched."""
    settings = worker.settings
    model = worker.pool.get(job.model)
    kwargs = job.transcribe_kwargs(vad_default=settings.vad_default)
    kwargs, languages = language.plan(
        model, kwargs, settings.language, settings.languages, job.languages
    )
    checks.check_request(model, kwargs)
    if job.split not in (None, 1) and worker.fan_out is None:
        raise WorkerError(
            Code.SPLIT_UNAVAILABLE,
            "split runs the pieces as jobs of this endpoint: the queue worker needs the "
            "endpoint's API key as RUNPOD_API_KEY in its environment (and RUNPOD_ENDPOINT_ID, "
            "which RunPod sets); HTTP mode and the command line cannot split",
        )
    if job.diarize:
        if worker.diarizer is None:
            raise WorkerError(
                Code.DIARIZATION_UNAVAILABLE,
                "this worker runs without speaker diarization: deploy the image built with "
                "DIARIZATION=true and set WHISPER_DIARIZATION=true",
            )
        kwargs["word_timestamps"] = True  # segments are split at the words' speakers
    return model, kwargs, languages


def _fetch_and_decode(job: JobInput, settings: Settings, call: Call) -> DecodedAudio:
    """The job's audio as 16-kHz samples; its file lives only inside this step."""
    if call.samples is not None:
        seconds = len(call.samples) / SAMPLE_RATE
        if seconds > settings.max_audio_seconds:
            raise WorkerError(Code.AUDIO_TOO_LONG, f"{seconds:.0f} s of audio is over the cap")
        call.timings["fetch"] = call.timings["decode"] = 0.0
        return DecodedAudio(call.samples, seconds, None, "live")
    with tempfile.TemporaryDirectory(prefix=JOB_DIR_PREFIX) as tmp:
        src = Path(tmp) / "audio"
        t = time.perf_counter()
        if call.audio is not None:
            src.write_bytes(call.audio)
        elif job.audio_base64 is not None:
            src.write_bytes(decode_base64(job.audio_base64, settings.max_inline_bytes))
        elif job.audio_url is not None:
            fetch_to_file(job.audio_url, src, settings, cancel=call.cancel)
        call.timings["fetch"] = time.perf_counter() - t
        t = time.perf_counter()
        audio = decode_audio(src, settings, cancel=call.cancel)
        call.timings["decode"] = time.perf_counter() - t
    return audio


def _nothing_to_transcribe(job: JobInput, call: Call) -> transcribe.Transcript:
    call.warnings.append(f"audio is shorter than {MIN_AUDIO_SECONDS} s; nothing was transcribed")
    call.timings["queue_model"] = 0.0
    call.timings["transcribe"] = 0.0
    return transcribe.Transcript([], job.language or "", 0.0, 0.0)


def _batch_size(job: JobInput, settings: Settings) -> int:
    return job.batch_size or settings.batch_size


def _transcribe(
    job: JobInput,
    model: LoadedModel,
    kwargs: dict[str, Any],
    languages: list[str] | None,
    audio: DecodedAudio,
    worker: Runtime,
    call: Call,
) -> transcribe.Transcript:
    """Through the engine (batched with other jobs) or alone, within the memory budget."""
    settings, duration = worker.settings, audio.duration
    batch_size = _batch_size(job, settings)
    blocker = transcribe.batch_blocker(kwargs, duration) if batch_size > 1 else None
    if blocker and (job.batch_size or 1) > 1:
        # Only a job that asked for a batch is told; the deployment's default is silent.
        call.warnings.append(f"ran sequentially instead of batched: {blocker}")
    options: dict[str, Any] = {
        "cancel": call.cancel,
        "on_segment": _segment_sink(call, duration, settings.progress_interval_s),
        "languages": languages,
        "budget_s": _compute_budget(settings, duration),
    }
    multi = kwargs.get("language") == code_switch.MULTI
    if multi and job.diarize and not job.speaker_windows:
        options["breaks"] = _speaker_breaks(job, worker, call, audio, options["budget_s"])
    t = time.perf_counter()
    with worker.memory_budget().reserve(job_bytes(duration), call.cancel,
                                        what=f"{duration:.0f} s of audio"), \
            diarization.beside(job, worker, call, audio.samples, options["budget_s"]):  # fmt: skip
        memory_wait = time.perf_counter() - t
        if batch_size > 1 and blocker is None:
            # the engine shares instances: no exclusive wait
            call.timings["queue_model"] = memory_wait
            tr = _through_engine(worker, model, audio.samples, kwargs, batch_size, options)
            call.timings["batch_wait"] = tr.batch_wait or 0.0
        else:
            with worker.pool.acquire(model, call.cancel) as (instance, waited):
                call.timings["queue_model"] = memory_wait + waited
                if multi:
                    tr = transcribe.run_by_parts(instance, audio.samples, kwargs,
                                                 functools.partial(transcribe.run, instance),
                                                 **options)  # fmt: skip
                else:
                    # Nothing reads the samples after this: the speech is gathered in them.
                    tr = transcribe.run(instance, audio.samples, kwargs,
                                        consume_audio=not job.diarize, **options)  # fmt: skip
    call.timings["transcribe"] = tr.seconds
    call.warnings += tr.warnings
    if tr.speech and (dropped := coverage.warning(tr.speech, tr.segments, multi)):
        call.warnings.append(dropped)
    if doubt := checks.english_only_doubt(model, tr.segments):
        call.warnings.append(doubt)
    return tr


def _pieces_wanted(job: JobInput, duration: float) -> int:
    if job.split in (None, 1):
        return 1
    return pieces.count(job.split, duration, AUTO_PIECE_S, MAX_PIECES)


def _split(
    job: JobInput,
    model: LoadedModel,
    kwargs: dict[str, Any],
    languages: list[str] | None,
    audio: DecodedAudio,
    n: int,
    worker: Runtime,
    call: Call,
) -> transcribe.Transcript:
    """The recording cut at silences into n pieces, run as jobs of the endpoint by
    ``worker.fan_out``, stitched back on the recording's time line."""
    t = time.perf_counter()
    samples = audio.samples
    child = _piece_input(job, kwargs)
    detected = _one_language(model, kwargs, languages, samples, worker, call)
    if detected is not None:
        child["language"] = detected[0]
    spans = pieces.speech(samples, kwargs)
    bounds = list(pairwise([0, *pieces.cut_points(samples, n, kwargs, spans), len(samples)]))
    # A piece in which the VAD hears no speech would transcribe nothing: it is no job.
    quiet = [bool(kwargs.get("vad_filter", True)) and not pieces.heard(spans, a, b)
             for a, b in bounds]  # fmt: skip
    stitch = _Stitch(bounds, call, audio.duration)
    results = _run_pieces(child, samples, bounds, quiet, worker, call, stitch, t)
    if job.diarize:
        # Each piece embedded its speech windows; the whole clusters them all at once, so
        # "A" is one person throughout and a count holds for the whole (bench/README.md).
        windows = [r["output"].get("speaker_windows") for r in results]
        found = [(a, w) for (a, _), w in zip(bounds, windows, strict=True)]
        budget = _compute_budget(worker.settings, audio.duration)
        diarization.from_pieces(job, worker, call, samples, found, budget)
    # The language of most of the speech: a piece without any reports "en" (faster-whisper's
    # answer when the VAD leaves nothing), so the pieces are weighed by what they heard.
    heard: dict[str, list[tuple[float, float]]] = {}  # language: [(speech s, p)] a piece
    call.pieces = []
    for i, ((a, b), res) in enumerate(zip(bounds, results, strict=True)):
        out = res["output"]
        speech = sum(float(s["end"]) - float(s["start"]) for s in out.get("segments") or [])
        heard.setdefault(out.get("language") or "", []).append(
            (speech, float(out.get("language_probability") or 0.0)))  # fmt: skip
        call.warnings += [f"piece {i + 1}: {w}" for w in out.get("warnings") or []]
        call.pieces.append({"piece": i + 1, "start": round(a / SAMPLE_RATE, 3),
                            "end": round(b / SAMPLE_RATE, 3), "speech": not quiet[i],
                            "job_id": None if res.get("here") else res["job_id"],
                            "ran_here": bool(res.get("here")), "tries": res["tries"],
                            "seconds": (out.get("timings") or {}).get("total")})  # fmt: skip
    # Without speech anywhere: the first piece's (max keeps the first of equals).
    main = max(heard, key=lambda k: sum(speech for speech, _ in heard[k]))
    p = max(heard[main])[1] if detected is None else detected[1]
    call.timings["transcribe"] = time.perf_counter() - t - call.timings["split"]
    return transcribe.Transcript(stitch.segments, main, p, time.perf_counter() - t)


def _one_language(
    model: LoadedModel,
    kwargs: dict[str, Any],
    languages: list[str] | None,
    samples: np.ndarray,
    worker: Runtime,
    call: Call,
) -> tuple[str, float] | None:
    """The language unsplit would detect, for every piece, when the job set none: a piece
    left to detect its own was wrong where it was mostly music (1 of 118 pieces of the
    split-language bench; the whole recordings 0 of 30). None: the job set one, asked
    for one per part (``multi``), the model is English-only, or no speech was heard."""
    if "language" in kwargs or not model.multilingual:
        call.timings["queue_model"] = 0.0
        return None
    with worker.pool.acquire(model, call.cancel) as (instance, waited):
        call.timings["queue_model"] = waited
        if languages:
            lang = language.detect_among(instance, samples, languages, kwargs)
            return lang, 1.0
        return language.as_sequential(instance, samples, kwargs)


def _run_pieces(
    child: dict[str, Any],
    samples: np.ndarray,
    bounds: list[tuple[int, int]],
    quiet: list[bool],
    worker: Runtime,
    call: Call,
    stitch: _Stitch,
    t: float,
) -> list[dict[str, Any]]:
    """Each piece's output, job id and tries, in order: those with speech as jobs of the
    endpoint (``worker.fan_out``), each told to ``stitch`` as it ends; one without any
    ends here at once, empty (no worker started and billed for silence or music)."""
    assert worker.fan_out is not None  # refused in _plan otherwise
    sent = [i for i, q in enumerate(quiet) if not q]
    results: dict[int, dict[str, Any]] = {
        i: {"output": _quiet_output(child), "job_id": None, "tries": 0}
        for i, q in enumerate(quiet) if q
    }  # fmt: skip
    for i, res in results.items():
        stitch.done(i, res["output"])

    def run_here(j: int) -> dict[str, Any]:
        a, b = bounds[sent[j]]
        return run_job(child, worker, job_id=f"{call.job_id}/{sent[j] + 1}", cancel=call.cancel,
                       samples=samples[a:b])  # fmt: skip

    with PieceStore(worker.settings) as store:
        inputs = _piece_inputs(child, samples, [bounds[i] for i in sent], store, worker.settings)
        call.timings["split"] = time.perf_counter() - t
        ended = lambda j, output: stitch.done(sent[j], output)  # noqa: E731
        ran = worker.fan_out(inputs, call.cancel, run_here, ended) if inputs else []
    for i, res in zip(sent, ran, strict=True):
        results[i] = res
        if i not in stitch.outputs:  # a fan-out that tells only at the end
            stitch.done(i, res["output"])
    return [results[i] for i in range(len(bounds))]


def _quiet_output(child: dict[str, Any]) -> dict[str, Any]:
    """What a piece without speech would have answered: nothing heard, no speaker windows."""
    out: dict[str, Any] = {"segments": [], "language": "", "language_probability": 0.0,
                           "timings": {"total": 0.0}}  # fmt: skip
    if child.get("speaker_windows"):
        out["speaker_windows"] = {"regions": [], "spans": [], "fine": [], "emb": "",
                                  "fine_emb": ""}  # fmt: skip
    return out


class _Stitch:
    """A split job's pieces put back on the recording's time line as they end: a piece's
    segments go to the caller's stream as soon as every piece before it has ended (in
    time order, numbered once, as unsplit streams them), and the job's progress moves with
    the audio of the pieces ended, whatever their order."""

    def __init__(self, bounds: list[tuple[int, int]], call: Call, duration: float) -> None:
        self.bounds, self.call, self.duration = bounds, call, duration
        self.outputs: dict[int, dict[str, Any]] = {}
        self.segments: list[Segment] = []
        self.next = 0

    def done(self, i: int, output: dict[str, Any]) -> None:
        self.outputs[i] = output
        while self.next in self.outputs:
            offset = self.bounds[self.next][0] / SAMPLE_RATE
            for seg in self.outputs[self.next].get("segments") or []:
                item = _piece_segment(seg, offset, len(self.segments) + 1)
                self.segments.append(item)
                if self.call.on_segment is not None:
                    self.call.on_segment(item)
            self.next += 1
        if self.call.on_progress is not None and self.duration > 0:
            ended = sum(b - a for k, (a, b) in enumerate(self.bounds) if k in self.outputs)
            self.call.on_progress(round(min(100.0, 100.0 * ended / SAMPLE_RATE / self.duration), 1))


def _piece_inputs(
    child: dict[str, Any],
    samples: np.ndarray,
    bounds: list[tuple[int, int]],
    store: PieceStore,
    settings: Settings,
) -> list[dict[str, Any]]:
    """Each piece's job input: its audio as FLAC, inline when its base64 fits a request
    (``piece_inline_bytes``), else an s3:// object of the piece bucket. The pieces are
    encoded (and uploaded) side by side: nothing starts before the last is ready."""

    def one(i: int) -> dict[str, Any]:
        a, b = bounds[i]
        flac = to_flac(samples[a:b])
        if len(flac) * 4 / 3 <= settings.piece_inline_bytes:
            return {**child, "audio_base64": base64.b64encode(flac).decode()}
        return {**child, "audio_url": store.put(i, flac, len(bounds))}

    cores = min(len(bounds), threads.usable_cpus())
    with ThreadPoolExecutor(max(1, cores), thread_name_prefix="piece") as pool:
        return list(pool.map(one, range(len(bounds))))


def _piece_input(job: JobInput, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The job's own options for each piece, asking for what stitching needs."""
    child = job.model_dump(exclude_unset=True, exclude={"audio_base64", "audio_url", "split",
                                                         "output", "batch_size"})  # fmt: skip
    child = {k: v for k, v in child.items() if v is not None}
    child["output"] = ["segments"]
    if kwargs.get("word_timestamps"):
        child["word_timestamps"] = True
        child["output"].append("words")
    if job.batch_size:
        child["batch_size"] = job.batch_size
    # The pieces embed their speech windows; the speakers are found on the whole (_split).
    for name in ("num_speakers", "min_speakers", "max_speakers", "known_speakers",
                 "speaker_embeddings"):  # fmt: skip
        child.pop(name, None)
    if job.diarize:
        child["speaker_windows"] = True
    return child


def _piece_segment(seg: dict[str, Any], offset: float, number: int) -> Segment:
    """A piece's returned segment as one of the whole recording's."""
    item: dict[str, Any] = {k: seg[k] for k in SEGMENT_FIELDS if k in seg}
    item["id"] = number
    item["start"] = round(float(seg["start"]) + offset, 3)
    item["end"] = round(float(seg["end"]) + offset, 3)
    words = seg.get("words")
    item["words"] = (
        [{**w, "start": round(w["start"] + offset, 3), "end": round(w["end"] + offset, 3)}
         for w in words] if words else None
    )  # fmt: skip
    if "language" in seg:
        item["language"] = seg["language"]
    if "speaker" in seg:
        item["speaker"] = seg["speaker"]
    return item  # type: ignore[return-value]


def _through_engine(
    worker: Runtime,
    model: LoadedModel,
    samples: np.ndarray,
    kwargs: dict[str, Any],
    batch_size: int,
    options: dict[str, Any],
) -> transcribe.Transcript:
    """The engine's path: the whole job, or with ``"language": "multi"`` part by part."""
    if kwargs.get("language") != code_switch.MULTI:
        return transcribe.run_engine(worker.engine, model, samples, kwargs,
                                     batch_size=batch_size, **options)  # fmt: skip
    instance, _ = worker.engine.scheduler_for(model.instances)
    part = functools.partial(transcribe.run_engine, worker.engine, model)
    return transcribe.run_by_parts(instance, samples, kwargs, part, batch_size=batch_size,
                                   **options)  # fmt: skip


def _speaker_breaks(
    job: JobInput, worker: Runtime, call: Call, audio: DecodedAudio, budget_s: float | None
) -> list[float]:
    """``"language": "multi"`` with diarize: a part per speaker turn too, so the turns come
    first and the parts are cut at them (diarization.beside then has nothing left to do)."""
    diarization.first(job, worker, call, audio.samples, budget_s)
    assert call.diarization is not None
    turns = call.diarization.turns
    return sorted({t.start for t in turns} | {t.end for t in turns})


def _compute_budget(settings: Settings, duration: float) -> float | None:
    """Seconds this job may spend in the model (None: unbounded)."""
    floor, factor = settings.compute_budget_floor_s, settings.compute_budget_factor
    return floor + factor * duration if floor or factor else None


def _segment_sink(call: Call, duration: float, interval: float) -> transcribe.SegmentCallback:
    """Each decoded segment to the caller's stream, and progress every ``interval`` s."""
    progress = _progress_reporter(duration, interval, call.on_progress)

    def each_segment(seg: Segment) -> None:
        if call.on_segment is not None:
            call.on_segment(seg)
        if progress is not None:
            progress(seg["end"])

    return each_segment


def _answer(
    job: JobInput,
    tr: transcribe.Transcript,
    duration: float,
    model: LoadedModel,
    worker: Runtime,
    call: Call,
) -> dict[str, Any]:
    """The output object, timed, offloaded to S3 when too large for the platform."""
    t = time.perf_counter()
    output = _shape(job, tr, duration, model.spec.name, worker.pool.device, call)
    call.timings["format"] = time.perf_counter() - t
    call.timings["total"] = time.perf_counter() - call.start
    output["timings"] = {k: round(v, 4) for k, v in call.timings.items()}
    if tr.batch_sizes is not None:
        output["batch_sizes"] = tr.batch_sizes
    return deliver(output, worker.settings, call.job_id)


def _log_done(call: Call, duration: float, model: LoadedModel, batch_size: int) -> None:
    timings = call.timings
    log.info(
        "job %s done: %.1fs audio in %.2fs (transcribe %.2fs, RTF %.3f, model %s, batch %d)",
        call.job_id,
        duration,
        timings["total"],
        timings["transcribe"],
        timings["transcribe"] / duration if duration else 0.0,
        model.spec.name,
        batch_size,
    )


def _progress_reporter(
    duration: float, interval: float, on_progress: ProgressCallback | None
) -> Callable[[float], None] | None:
    if on_progress is None:
        return None
    last = [time.monotonic()]

    def report(position: float) -> None:
        now = time.monotonic()
        if now - last[0] >= interval:
            last[0] = now
            on_progress(round(min(100.0, 100.0 * position / duration), 1))

    return report


def _shape(
    job: JobInput,
    tr: transcribe.Transcript,
    duration: float,
    model_name: str,
    device: str,
    call: Call,
) -> dict[str, Any]:
    task, warnings, segments = job.effective_task, call.warnings, tr.segments
    turns = call.diarization.turns if call.diarization is not None else []
    if job.diarize:
        segments = speakers.attribute(segments, turns)
    rendered = formats.render(
        list(job.output),
        segments,
        language=tr.language,
        duration=duration,
        task=task,
        layout=job.layout,
        turns=turns,
    )
    out: dict[str, Any] = {
        "text": formats.to_text(segments),
        "language": tr.language or None,
        "language_probability": round(tr.language_probability, 4),
        "duration": round(duration, 3),
        **rendered,
        "model": model_name,
        "device": device,
    }
    if job.diarize:
        out["speakers"] = speakers.summary(turns)
        if job.speaker_embeddings and call.diarization is not None:
            out["speaker_embeddings"] = call.diarization.centroids
        if job.speaker_windows and call.speaker_windows is not None:
            out["speaker_windows"] = call.speaker_windows.to_json()
    if call.pieces is not None:
        out["pieces"] = call.pieces
    if warnings:
        out["warnings"] = warnings
    if job.legacy:
        out.update(_legacy_keys(job, segments, tr.language))
    return out


def _legacy_format(kind: str, segments: list[Segment], layout: Layout | None = None) -> str:
    if kind == "srt":
        return formats.to_srt(segments, layout=layout)
    if kind == "vtt":
        return formats.to_vtt(segments, layout=layout)
    sep = "\n" if kind == "formatted_text" else " "
    return sep.join(s["text"].strip() for s in segments)


def _legacy_keys(job: JobInput, segments: list[Segment], language: str) -> dict[str, Any]:
    """The official worker's output keys, so its clients keep working unchanged."""
    keys: dict[str, Any] = {
        "transcription": _legacy_format(job.transcription or "plain_text", segments, job.layout),
        "detected_language": language or None,
        "segments": formats.segments_public(segments, include_words=False),
        "translation": None,  # that worker always sends the key
    }
    if job.translate:
        # One translate pass: its text is the translation (the official worker ran two).
        keys["translation"] = _legacy_format(job.translation or "plain_text", segments, job.layout)
    if job.word_timestamps:
        keys["word_timestamps"] = [
            {"word": w["word"], "start": w["start"], "end": w["end"]}
            for w in formats.words(segments)
        ]
    return keys
