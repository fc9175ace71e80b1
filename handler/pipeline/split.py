"""A long recording across workers: cut at silences into pieces, each run as a job of the
endpoint (the fan-out the queue face hands in as ``Runtime.fan_out``), stitched back on
the recording's time line as the pieces end.

The local run (a piece no other worker takes, run by this one) is handed in by the caller,
so this module never imports the job step that calls it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import numpy as np

from handler.audio import seal
from handler.audio.decode import DecodedAudio
from handler.audio.encode import to_flac
from handler.contract import SAMPLE_RATE, SEGMENT_FIELDS, Segment
from handler.errors import Code, WorkerError
from handler.inference import language, pieces, threads, transcribe
from handler.output.offload import PieceStore
from handler.pipeline import speakers
from handler.pipeline.runtime import Call, Plan, Runtime, compute_budget
from handler.settings import Settings

SEAL_S = 7200.0
"""How long a piece's seal lets its job read it (the parent waits 30 min for a piece; its
objects are deleted when the job ends, whichever comes first)."""
LocalRun = Callable[..., dict[str, Any]]
"""``run_job``: a piece run on this worker (``run_here(input, worker, job_id=, cancel=,
samples=)``)."""


AUTO_PIECE_S = 240.0
"""``split: "auto"``: one piece per this much audio (4 min: a piece travels inline, FLAC)."""


def run(
    plan: Plan, audio: DecodedAudio, n: int, worker: Runtime, call: Call, run_here: LocalRun
) -> transcribe.Transcript:
    """The recording cut at silences into n pieces, run as jobs of the endpoint by
    ``worker.fan_out``, stitched back on the recording's time line."""
    t = time.perf_counter()
    job, kwargs, samples = plan.job, plan.kwargs, audio.samples
    child = _piece_input(plan)
    detected = _one_language(plan, samples, worker, call)
    if detected is not None:
        child["language"] = detected[0]
    spans = pieces.speech(samples, kwargs)
    bounds = list(pairwise([0, *pieces.cut_points(samples, n, kwargs, spans), len(samples)]))
    # A piece in which the VAD hears no speech would transcribe nothing: it is no job.
    quiet = [
        bool(kwargs.get("vad_filter", True)) and not pieces.heard(spans, a, b) for a, b in bounds
    ]
    stitch = Stitch(bounds, call, audio.duration)
    results = _run_pieces(child, samples, (bounds, quiet), worker, call, stitch, run_here, t)
    if job.diarize:
        # Each piece embedded its speech windows; the whole clusters them all at once, so
        # "A" is one person throughout and a count holds for the whole (bench/README.md).
        windows = [r["output"].get("speaker_windows") for r in results]
        found = [(a, w) for (a, _), w in zip(bounds, windows, strict=True)]
        budget = compute_budget(worker.settings, audio.duration)
        speakers.from_pieces(job, worker, call, samples, found, budget)
    # The language of most of the speech: a piece without any reports "en" (faster-whisper's
    # answer when the VAD leaves nothing), so the pieces are weighed by what they heard.
    heard: dict[str, list[tuple[float, float]]] = {}  # language: [(speech s, p)] a piece
    call.pieces = []
    for i, ((a, b), res) in enumerate(zip(bounds, results, strict=True)):
        out = res["output"]
        speech = sum(float(s["end"]) - float(s["start"]) for s in out.get("segments") or [])
        heard.setdefault(out.get("language") or "", []).append(
            (speech, float(out.get("language_probability") or 0.0))
        )
        call.warnings += [f"piece {i + 1}: {w}" for w in out.get("warnings") or []]
        call.pieces.append(
            {
                "piece": i + 1,
                "start": round(a / SAMPLE_RATE, 3),
                "end": round(b / SAMPLE_RATE, 3),
                "speech": not quiet[i],
                "job_id": None if res.get("here") else res["job_id"],
                "ran_here": bool(res.get("here")),
                "tries": res["tries"],
                "seconds": (out.get("timings") or {}).get("total"),
            }
        )
    # Without speech anywhere: the first piece's (max keeps the first of equals).
    main = max(heard, key=lambda k: sum(speech for speech, _ in heard[k]))
    p = max(heard[main])[1] if detected is None else detected[1]
    call.timings["transcribe"] = time.perf_counter() - t - call.timings["split"]
    return transcribe.Transcript(stitch.segments, main, p, time.perf_counter() - t)


def _one_language(
    plan: Plan, samples: np.ndarray, worker: Runtime, call: Call
) -> tuple[str, float] | None:
    """The language unsplit would detect, for every piece, when the job set none: a piece
    left to detect its own was wrong where it was mostly music (1 of 118 pieces of the
    split-language bench; the whole recordings 0 of 30). None: the job set one, asked
    for one per part (``multi``), the model is English-only, or no speech was heard."""
    model, kwargs, languages = plan.model, plan.kwargs, plan.languages
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
    cut: tuple[list[tuple[int, int]], list[bool]],
    worker: Runtime,
    call: Call,
    stitch: Stitch,
    run_here: LocalRun,
    started: float,
) -> list[dict[str, Any]]:
    """Each piece's output, job id and tries, in order: those with speech as jobs of the
    endpoint (``worker.fan_out``), each told to ``stitch`` as it ends; one without any
    ends here at once, empty (no worker started and billed for silence or music)."""
    assert worker.fan_out is not None  # refused in the plan otherwise
    bounds, quiet = cut
    sent = [i for i, q in enumerate(quiet) if not q]
    results: dict[int, dict[str, Any]] = {
        i: {"output": quiet_output(child), "job_id": None, "tries": 0}
        for i, q in enumerate(quiet)
        if q
    }
    for i, res in results.items():
        stitch.done(i, res["output"])

    def here(j: int) -> dict[str, Any]:
        a, b = bounds[sent[j]]
        return run_here(
            child,
            worker,
            job_id=f"{call.job_id}/{sent[j] + 1}",
            cancel=call.cancel,
            samples=samples[a:b],
        )

    with PieceStore(worker.settings) as store:
        inputs = _piece_inputs(child, samples, [bounds[i] for i in sent], store, worker.settings)
        call.timings["split"] = time.perf_counter() - started
        ended = lambda j, output: stitch.done(sent[j], output)  # noqa: E731
        ran = worker.fan_out(inputs, call.cancel, here, ended) if inputs else []
    for i, res in zip(sent, ran, strict=True):
        results[i] = res
        if i not in stitch.outputs:  # a fan-out that tells only at the end
            stitch.done(i, res["output"])
    return [results[i] for i in range(len(bounds))]


def quiet_output(child: dict[str, Any]) -> dict[str, Any]:
    """What a piece without speech would have answered: nothing heard, no speaker windows."""
    out: dict[str, Any] = {
        "segments": [],
        "language": "",
        "language_probability": 0.0,
        "timings": {"total": 0.0},
    }
    if child.get("speaker_windows"):
        out["speaker_windows"] = {"regions": [], "spans": [], "fine": [], "emb": "", "fine_emb": ""}
    return out


class Stitch:
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
        secret = seal.secret_of(settings)
        if secret is None:
            raise WorkerError(
                Code.SPLIT_UNAVAILABLE,
                "pieces in the piece bucket are sealed with WHISPER_PIECE_SECRET (else "
                "RUNPOD_API_KEY): neither is set on this worker",
            )
        url = store.put(i, flac, len(bounds))
        return {**child, "audio_url": url, "piece": seal.seal(url, flac, SEAL_S, secret)}

    cores = min(len(bounds), threads.usable_cpus())
    with ThreadPoolExecutor(max(1, cores), thread_name_prefix="piece") as pool:
        return list(pool.map(one, range(len(bounds))))


def _piece_input(plan: Plan) -> dict[str, Any]:
    """The job's own options for each piece, asking for what stitching needs."""
    job, kwargs = plan.job, plan.kwargs
    child = job.model_dump(
        exclude_unset=True,
        # profanity_filter, redact: the whole is masked once stitched and its words aligned
        exclude={"audio_base64", "audio_url", "split", "piece", "output", "batch_size"}
        | {"profanity_filter", "redact"},
    )
    child = {k: v for k, v in child.items() if v is not None}
    child["output"] = ["segments"]
    if kwargs.get("word_timestamps"):
        child["word_timestamps"] = True
        child["output"].append("words")
    if job.batch_size:
        child["batch_size"] = job.batch_size
    # The pieces embed their speech windows; the speakers are found on the whole (run).
    for name in (
        "num_speakers",
        "min_speakers",
        "max_speakers",
        "known_speakers",
        "speaker_embeddings",
    ):
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
        [
            {**w, "start": round(w["start"] + offset, 3), "end": round(w["end"] + offset, 3)}
            for w in words
        ]
        if words
        else None
    )
    if "language" in seg:
        item["language"] = seg["language"]
    if "speaker" in seg:
        item["speaker"] = seg["speaker"]
    return item  # type: ignore[return-value]
