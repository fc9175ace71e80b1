"""``profanity_filter`` on clean speech: how much does it mask that it should not, and what
does it cost?

``python -m bench profanity`` masks every reference transcript of the evaluation corpus
(bench.common.eval_corpus: professional voice prompts in five languages, none profane) in
its own language, as a job's answer is masked (handler.output.profanity), and counts the
texts and words that changed: each one is a false positive. ``--transcribe N`` also runs
N files per language through the worker's own ``run_job`` with the option on (the
packaged tiny.en unless ``--model``) and counts masked words in what it heard. It then
times the masking of an hour's transcript (750 segments of 14 words, the corpus's own
sentences, words beside the text) on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.eval_corpus import DEFAULT_DIR, FetchError, build
from bench.common.machine import describe, stamp

ROOT = Path(__file__).resolve().parents[2]


def masked_words(before: str, after: str) -> list[str]:
    """The words of ``before`` that masking changed."""
    return [b for b, a in zip(before.split(), after.split(), strict=True) if a != b]


def references(items: list[Any]) -> dict[str, dict[str, Any]]:
    """Per language: texts, words, texts changed, the words masked."""
    from handler.output import profanity

    out: dict[str, dict[str, Any]] = {}
    for it in items:
        if not it.language or not it.text:
            continue
        row = out.setdefault(it.language, {"texts": 0, "words": 0, "changed": 0, "masked": []})
        masked = profanity.masker(it.language).text(it.text)
        row["texts"] += 1
        row["words"] += len(it.text.split())
        if masked != it.text:
            row["changed"] += 1
            row["masked"] += masked_words(it.text, masked)
    return out


def hour_of_segments(items: list[Any]) -> list[Any]:
    """750 segments of 14 words (about an hour of speech), from the corpus's sentences."""
    words = " ".join(it.text for it in items if it.language == "en" and it.text).split()
    segments = []
    for i in range(750):
        said = [" " + words[(i * 14 + j) % len(words)] for j in range(14)]
        segments.append(
            {
                "id": i,
                "text": "".join(said),
                "tokens": [1],
                "words": [{"word": w, "start": 0.0, "end": 0.1, "probability": 0.9} for w in said],
            }
        )
    return segments


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
        row = rows.setdefault(it.language, {"files": 0, "words": 0, "masked": []})
        if row["files"] >= per_language:
            continue
        job = {"output": ["text"], "profanity_filter": True}
        result = run_job(job, worker, audio=it.path.read_bytes())
        text = result.get("text") or ""
        row["files"] += 1
        row["words"] += len(text.split())
        row["masked"] += [w for w in text.split() if "*" in w]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench profanity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dest", default=str(DEFAULT_DIR), help="corpus folder")
    parser.add_argument("--transcribe", type=int, default=0, metavar="N",
                        help="also transcribe N files per language with the option on")  # fmt: skip
    parser.add_argument("--model", help="WHISPER_MODEL for --transcribe (default tiny.en)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "profanity.json"))
    args = parser.parse_args(argv)
    machine = describe()
    try:
        items = build(Path(args.dest))
    except FetchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    from handler.output import profanity

    refs = references(items)
    print(f"{'language':<10}{'texts':>7}{'words':>8}{'changed':>9}  masked")
    for lang, row in sorted(refs.items()):
        shown = ", ".join(row["masked"][:5])
        print(f"{lang:<10}{row['texts']:>7}{row['words']:>8}{row['changed']:>9}  {shown}")
    segments = hour_of_segments(items)
    profanity.masker("en")  # built once per process: not part of a job's cost
    started = time.perf_counter()
    for seg in segments:
        profanity.segment(seg, "en")
    seconds = time.perf_counter() - started
    print(f"an hour's transcript (750 segments, 10,500 words) masked in {seconds:.3f} s")
    heard = transcribed(items, args.transcribe, args.model) if args.transcribe else {}
    for lang, row in sorted(heard.items()):
        print(f"heard {lang}: {row['files']} files, {row['words']} words, masked {row['masked']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    record = {"references": refs, "hour_seconds": seconds, "transcribed": heard}
    Path(args.out).write_text(json.dumps(stamp(record, machine), indent=1))
    print(f"json      {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
