"""The alignment pass: once a job's segments are decoded, its words are timed again by the
forced aligner (handler.inference.align), on a CPU thread outside any model slot."""

from __future__ import annotations

import time

import numpy as np

from handler.errors import Code
from handler.guard import Guard
from handler.inference import align, transcribe
from handler.pipeline.runtime import Call, Plan, Runtime


def method(plan: Plan, worker: Runtime) -> str:
    """The job's ``word_alignment``, else the deployment's."""
    return plan.job.word_alignment or worker.settings.word_alignment


def run(
    plan: Plan,
    tr: transcribe.Transcript,
    samples: np.ndarray,
    worker: Runtime,
    call: Call,
    budget_s: float | None,
) -> None:
    """Align ``tr``'s words in place and record how each language's words were timed."""
    if not plan.kwargs.get("word_timestamps"):
        return
    how = method(plan, worker)
    languages = [str(s.get("language") or tr.language or "") for s in tr.segments]
    found = list(dict.fromkeys(languages)) or [tr.language or ""]
    aligner = worker.aligner() if how != "whisper" else None
    if aligner is None:
        call.word_alignment = dict.fromkeys(found, "whisper")
        if how == "forced":
            call.warnings.append(
                "word_alignment forced: no forced aligner is installed in this image "
                "(pip install pocketsphinx); the words keep Whisper's times"
            )
        return
    guard = Guard(
        call.cancel,
        None if budget_s is None else time.monotonic() + budget_s,
        Code.COMPUTE_BUDGET_EXCEEDED,
        "the job used its compute budget while aligning its words and was stopped",
    )
    outcome = aligner.align(tr.segments, samples, languages, guard)
    call.timings["align"] = outcome.seconds
    call.word_alignment = {lang: outcome.method.get(lang, "whisper") for lang in found}
    total = outcome.aligned + outcome.kept
    if outcome.kept > 0.1 * total:
        call.warnings.append(
            f"word_alignment: {outcome.kept} of {total} words kept Whisper's times (the "
            "aligner could not place them: music, noise, another language, numbers)"
        )
    missing = sorted(k for k, v in call.word_alignment.items() if v == "whisper" and k)
    if how == "forced" and missing:
        call.warnings.append(
            f"word_alignment forced: no aligner for {', '.join(missing)} here (English "
            "only); those words keep Whisper's times"
        )


def summary(call: Call) -> str | None:
    """The output's ``word_alignment``: forced, whisper, or mixed (a multi job)."""
    if not call.word_alignment:
        return None
    kinds = set(call.word_alignment.values())
    return kinds.pop() if len(kinds) == 1 else "mixed"


def after_split(plan: Plan, tr: transcribe.Transcript, worker: Runtime, call: Call) -> None:
    """A split job's pieces aligned their own words (they run this same pass): record how,
    as each piece did, from the languages found."""
    if not plan.kwargs.get("word_timestamps"):
        return
    forced = method(plan, worker) != "whisper" and worker.aligner() is not None
    found = dict.fromkeys(str(s.get("language") or tr.language or "") for s in tr.segments)
    call.word_alignment = {
        lang: "forced" if forced and lang in align.LANGUAGES else "whisper"
        for lang in (found or {tr.language or "": None})
    }
