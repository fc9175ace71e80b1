"""One job from input to result: parse, plan, fetch + decode, transcribe (or split), answer.

The single code path behind the RunPod handler, HTTP mode, live turns, the CLI and the
tests. It is synchronous (the faces run it in a thread) and never raises: every job ends in
exactly one result or one ``{"error", "error_code", "retryable"}`` body.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from handler.audio import seal
from handler.audio.decode import DecodedAudio
from handler.audio.read import read_audio
from handler.contract import SAMPLE_RATE, Segment
from handler.errors import Code, WorkerError
from handler.inference import checks, code_switch, language, pieces, transcribe
from handler.inference.memory import job_bytes
from handler.inference.models import LoadedModel
from handler.output import coverage
from handler.pipeline import answer, channels, repeats, speakers, split, words
from handler.pipeline.runtime import (
    MIN_AUDIO_SECONDS,
    Call,
    Plan,
    ProgressCallback,
    Runtime,
    compute_budget,
)
from handler.schema import MAX_PIECES, JobInput, parse_job_input
from handler.settings import Settings

log = logging.getLogger(__name__)


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
        if exc.code in (Code.GPU_OOM, Code.EMPTY_TRANSCRIPT):
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
    plan = _plan(job, worker)
    if job.profanity_filter or job.redact:
        call.on_segment = answer.masked_stream(plan, call.on_segment)
    if job.known_speakers and worker.diarizer is not None:
        call.references = speakers.references(job, worker.settings, worker.diarizer, call)
    audio = _fetch_and_decode(plan, worker.settings, call)
    duration = audio.duration
    call.warnings += audio.warnings
    if duration < MIN_AUDIO_SECONDS:
        tr = _nothing_to_transcribe(plan, call)
    elif (n := _pieces_wanted(plan, duration)) > 1:
        tr = split.run(plan, audio, n, worker, call, run_here=run_job)
        words.after_split(plan, tr, worker, call)
    elif audio.channels is not None:
        tr = channels.run(plan, audio, worker, call, _one_channel)
    else:
        tr = _one_channel(plan, audio, worker, call)
    del audio  # its samples may be gigabytes: not kept while the result is shaped
    if job.profanity_filter:
        answer.mask_profanity(plan, tr, call)
    if job.redact:
        answer.redact_numbers(tr, call)
    output = answer.answer(plan, tr, duration, worker, call)
    answer.log_done(call, duration, plan)
    return output


def _plan(job: JobInput, worker: Runtime) -> Plan:
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
    if job.min_speech_ratio is not None:
        kwargs["vad_filter"] = True  # the share of speech is the VAD's (schema: not off)
    if job.multichannel:
        # The channels' segments are merged by their start: a segment's times come from its
        # words (a VAD-gathered window can put Whisper's own segment start in a pause).
        kwargs["word_timestamps"] = True
    plan = Plan(job, model, kwargs, languages, job.batch_size or settings.batch_size)
    if words.method(plan, worker) != "whisper":
        kwargs["word_timestamps"] = True  # the aligner times the recognised words
    return plan


def _fetch_and_decode(plan: Plan, settings: Settings, call: Call) -> DecodedAudio:
    """The job's audio as 16-kHz samples; its file lives only inside this step."""
    if call.samples is not None:
        seconds = len(call.samples) / SAMPLE_RATE
        if seconds > settings.max_audio_seconds:
            raise WorkerError(Code.AUDIO_TOO_LONG, f"{seconds:.0f} s of audio is over the cap")
        call.timings["fetch"] = call.timings["decode"] = 0.0
        return DecodedAudio(call.samples, seconds, None, "live")
    job = plan.job
    sealed = None
    if job.audio_url is not None and seal.in_piece_bucket(job.audio_url, settings):
        sealed = seal.check(job.audio_url, job.piece, settings)
    return read_audio(
        settings,
        data=call.audio,
        audio_base64=job.audio_base64,
        audio_url=job.audio_url,
        cancel=call.cancel,
        timings=call.timings,
        sha256=sealed,
        split_channels=bool(job.multichannel),
    )


def _one_channel(
    plan: Plan, audio: DecodedAudio, worker: Runtime, call: Call
) -> transcribe.Transcript:
    """Transcribed, its loops mended, its words aligned."""
    tr = _transcribe(plan, audio, worker, call)
    repeats.fix(plan, tr, audio.samples, worker, call)
    budget = compute_budget(worker.settings, audio.duration)
    words.run(plan, tr, audio.samples, worker, call, budget)
    return tr


def _nothing_to_transcribe(plan: Plan, call: Call) -> transcribe.Transcript:
    call.warnings.append(f"audio is shorter than {MIN_AUDIO_SECONDS} s; nothing was transcribed")
    call.timings["queue_model"] = 0.0
    call.timings["transcribe"] = 0.0
    # A language the job named is the answer; "multi" is an option, never a language.
    lang = plan.kwargs.get("language") or ""
    return transcribe.Transcript([], "" if lang == code_switch.MULTI else lang, 0.0, 0.0)


def _transcribe(
    plan: Plan, audio: DecodedAudio, worker: Runtime, call: Call
) -> transcribe.Transcript:
    """Through the engine (batched with other jobs) or alone, within the memory budget."""
    job, model, kwargs, batch_size = plan.job, plan.model, plan.kwargs, plan.batch_size
    settings, duration = worker.settings, audio.duration
    blocker = transcribe.batch_blocker(kwargs, duration) if batch_size > 1 else None
    if blocker and (job.batch_size or 1) > 1:
        # Only a job that asked for a batch is told; the deployment's default is silent.
        call.warnings.append(f"ran sequentially instead of batched: {blocker}")
    options = _options(plan, settings, call, duration)
    multi = kwargs.get("language") == code_switch.MULTI
    if multi and job.diarize and not job.speaker_windows:
        options["breaks"] = _speaker_breaks(job, worker, call, audio, options["budget_s"])
    t = time.perf_counter()
    with (
        worker.memory_budget().reserve(
            job_bytes(duration) + call.held_bytes, call.cancel, what=_what(duration, call)
        ),
        speakers.beside(job, worker, call, audio.samples, options["budget_s"]),
    ):
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
                    tr = transcribe.run_by_parts(
                        instance,
                        audio.samples,
                        kwargs,
                        functools.partial(transcribe.run, instance),
                        **options,
                    )
                else:
                    # Unless the diarizer or the aligner reads the samples after this, the
                    # speech is gathered in them.
                    keep = job.diarize or words.method(plan, worker) != "whisper"
                    tr = transcribe.run(
                        instance, audio.samples, kwargs, consume_audio=not keep, **options
                    )
    call.timings["transcribe"] = tr.seconds
    call.warnings += tr.warnings
    if tr.speech and (dropped := coverage.warning(tr.speech, tr.segments, multi)):
        call.warnings.append(dropped)
    if doubt := checks.english_only_doubt(model, tr.segments):
        call.warnings.append(doubt)
    if worker.pool.device == "cuda" and checks.silently_empty(tr.speech, tr.segments):
        raise checks.empty_transcript(tr.speech)
    return tr


def _options(plan: Plan, settings: Settings, call: Call, duration: float) -> dict[str, Any]:
    """What the transcription is handed beside the audio: its cancel, stream, languages,
    compute budget and the job's own thresholds (judged before decoding)."""
    options: dict[str, Any] = {
        "cancel": call.cancel,
        "on_segment": _segment_sink(call, duration, settings.progress_interval_s),
        "languages": plan.languages,
        "budget_s": compute_budget(settings, duration),
    }
    job, detects = plan.job, plan.kwargs.get("language") is None
    if admit := checks.admission(
        job.min_language_probability, job.min_speech_ratio, duration, detects
    ):
        options["admit"] = admit
    return options


def _what(duration: float, call: Call) -> str:
    held = " (with the other channels it holds)" if call.held_bytes else ""
    return f"{duration:.0f} s of audio{held}"


def _pieces_wanted(plan: Plan, duration: float) -> int:
    if plan.job.split in (None, 1):
        return 1
    return pieces.count(plan.job.split, duration, split.AUTO_PIECE_S, MAX_PIECES)


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
        return transcribe.run_engine(
            worker.engine, model, samples, kwargs, batch_size=batch_size, **options
        )
    instance, _ = worker.engine.scheduler_for(model.instances)
    part = functools.partial(transcribe.run_engine, worker.engine, model)
    return transcribe.run_by_parts(
        instance, samples, kwargs, part, batch_size=batch_size, **options
    )


def _speaker_breaks(
    job: JobInput, worker: Runtime, call: Call, audio: DecodedAudio, budget_s: float | None
) -> list[float]:
    """``"language": "multi"`` with diarize: a part per speaker turn too, so the turns come
    first and the parts are cut at them (speakers.beside then has nothing left to do)."""
    speakers.first(job, worker, call, audio.samples, budget_s)
    assert call.diarization is not None
    turns = call.diarization.turns
    return sorted({t.start for t in turns} | {t.end for t in turns})


def _segment_sink(call: Call, duration: float, interval: float) -> transcribe.SegmentCallback:
    """Each decoded segment to the caller's stream, and progress every ``interval`` s."""
    progress = _progress_reporter(duration, interval, call.on_progress)

    def each_segment(seg: Segment) -> None:
        if call.on_segment is not None:
            call.on_segment(seg)
        if progress is not None:
            progress(seg["end"])

    return each_segment


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
