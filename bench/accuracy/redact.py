"""``redact`` on clean speech: how much of ordinary speech does it hide, does a digit ever
come through, and what does it cost?

``python -m bench redact`` masks every reference transcript of the evaluation corpus
(bench.common.eval_corpus: professional voice prompts in five languages) as a job's
segment is masked (handler.output.redact: a prompt is one segment, its edges counted),
and counts the texts and words that changed, the runs of three digits left (there must be
none) and the digits left in shorter numbers (by design: "press 7").
``--transcribe N`` also runs N files per language through the worker's own ``run_job``
with ``"redact": ["pci"]`` (the packaged tiny.en unless ``--model``) and counts the
masked words and the runs and digits left in what it heard. It then times the masking of an hour's
transcript (bench.accuracy.profanity.hour_of_segments) on this machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.accuracy.profanity import ROOT, hour_of_segments, masked_words
from bench.common.eval_corpus import DEFAULT_DIR, FetchError, build
from bench.common.machine import describe, stamp

LONG_RUN = re.compile(r"\d(?:[ \-./,:]{0,2}\d){2,}")
"""Three digits in a row (at most two separators between them): none may be left."""
DIGIT = re.compile(r"\d")


def references(items: list[Any]) -> dict[str, dict[str, Any]]:
    """Per language: texts, words, texts changed, the words masked, digits left."""
    from handler.output import redact

    out: dict[str, dict[str, Any]] = {}
    for it in items:
        if not it.language or not it.text:
            continue
        row = out.setdefault(
            it.language,
            {"texts": 0, "words": 0, "changed": 0, "masked": [], "runs_left": 0, "digits_left": 0},
        )
        masked = redact.text(it.text, edges=True)
        row["texts"] += 1
        row["words"] += len(it.text.split())
        row["runs_left"] += len(LONG_RUN.findall(masked))
        row["digits_left"] += len(DIGIT.findall(masked))
        if masked != it.text:
            row["changed"] += 1
            row["masked"] += masked_words(it.text, masked)
    return out


def transcribed(items: list[Any], per_language: int, model: str | None) -> dict[str, Any]:
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker

    env = {"WHISPER_DEVICE": "cpu"} | ({"WHISPER_MODEL": model} if model else {})
    worker = start_worker(load_settings(env))
    english_only = not worker.pool.get(None).multilingual
    rows: dict[str, Any] = {}
    for it in items:
        if not it.language or (english_only and it.language != "en"):
            continue
        row = rows.setdefault(
            it.language, {"files": 0, "words": 0, "masked": [], "runs_left": 0, "digits_left": 0}
        )
        if row["files"] >= per_language:
            continue
        job = {"output": ["text"], "redact": ["pci"]}
        text = run_job(job, worker, audio=it.path.read_bytes()).get("text") or ""
        row["files"] += 1
        row["words"] += len(text.split())
        row["masked"] += [w for w in text.split() if "*" in w]
        row["runs_left"] += len(LONG_RUN.findall(text))
        row["digits_left"] += len(DIGIT.findall(text))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench redact", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dest", default=str(DEFAULT_DIR), help="corpus folder")
    parser.add_argument("--transcribe", type=int, default=0, metavar="N",
                        help="also transcribe N files per language with redact on")  # fmt: skip
    parser.add_argument("--model", help="WHISPER_MODEL for --transcribe (default tiny.en)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "redact.json"))
    args = parser.parse_args(argv)
    machine = describe()
    try:
        items = build(Path(args.dest))
    except FetchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    from handler.output import redact

    refs = references(items)
    print(f"{'language':<10}{'texts':>7}{'words':>8}{'changed':>9}{'runs':>6}{'digits':>8}  masked")
    for lang, row in sorted(refs.items()):
        shown = ", ".join(row["masked"][:6])
        print(
            f"{lang:<10}{row['texts']:>7}{row['words']:>8}{row['changed']:>9}"
            f"{row['runs_left']:>6}{row['digits_left']:>8}  {shown}"
        )
    segments = hour_of_segments(items)
    started = time.perf_counter()
    for seg in segments:
        redact.segment(seg)
    seconds = time.perf_counter() - started
    print(f"an hour's transcript (750 segments, 10,500 words) redacted in {seconds:.3f} s")
    heard = transcribed(items, args.transcribe, args.model) if args.transcribe else {}
    for lang, row in sorted(heard.items()):
        print(
            f"heard {lang}: {row['files']} files, {row['words']} words, "
            f"runs left {row['runs_left']}, digits left {row['digits_left']}, "
            f"masked {row['masked'][:10]}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    record = {"references": refs, "hour_seconds": seconds, "transcribed": heard}
    Path(args.out).write_text(json.dumps(stamp(record, machine), indent=1))
    print(f"json      {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
