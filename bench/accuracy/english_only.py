"""The English-only model on speech it cannot understand: is the worker's warning right?

``python -m bench english-only`` runs the evaluation corpus (bench.common.eval_corpus) through the
worker's own ``run_job`` on an English-only model (default the packaged tiny.en) and
prints, per language, how many transcripts carried the worker's "English-only model was
unsure" warning and the spread of the token-weighted mean log-probability it is based on
(``handler.inference.transcribe.ENGLISH_ONLY_MIN_LOGPROB``). On English files a warning is a false
alarm; on the other languages a missing warning is English nonsense passed off silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.eval_corpus import DEFAULT_DIR, FetchError, build
from bench.common.machine import describe, stamp

ROOT = Path(__file__).resolve().parents[2]


def mean_logprob(segments: list[dict[str, Any]]) -> float | None:
    tokens = sum(len(s["tokens"]) for s in segments)
    if not tokens:
        return None
    return sum(s["avg_logprob"] * len(s["tokens"]) for s in segments) / tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench english-only", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dest", default=str(DEFAULT_DIR), help="corpus folder")
    parser.add_argument("--per-language", type=int, default=40, help="prompts per language")
    parser.add_argument("--model", help="WHISPER_MODEL (default: the packaged tiny.en)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "english_only.json"))
    args = parser.parse_args(argv)
    machine = describe()

    from handler.inference.checks import ENGLISH_ONLY_MIN_LOGPROB
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import start_worker

    try:
        items = build(Path(args.dest), args.per_language)
    except FetchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    env = {"WHISPER_DEVICE": "cpu", "WHISPER_CPU_THREADS": str(args.threads)}
    if args.model:
        env["WHISPER_MODEL"] = args.model
    worker = start_worker(load_settings(env))
    if worker.pool.get(None).multilingual:
        print("bench: the model is multilingual; this bench is for English-only models")
        return 2
    rows = []
    started = time.perf_counter()
    for n, it in enumerate(items, 1):
        if not it.language:  # music or noise: no language to judge
            continue
        result = run_job({"output": ["segments"]}, worker, audio=it.path.read_bytes())
        if "error" in result:
            continue
        warned = any("English-only model" in w for w in result.get("warnings", []))
        rows.append(
            {
                "file": it.path.name,
                "language": it.language,
                "group": it.group,
                "mean_logprob": mean_logprob(result["segments"]),
                "warned": warned,
            }
        )
        if sys.stderr.isatty():
            print(f"\r{n}/{len(items)} files", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"threshold {ENGLISH_ONLY_MIN_LOGPROB}, {time.perf_counter() - started:.0f} s")
    print(f"{'language':<10}{'files':>6}{'warned':>8}{'min':>8}{'median':>8}{'max':>8}")
    for lang in sorted({r["language"] for r in rows}, key=lambda x: (x != "en", x)):
        mine = [r for r in rows if r["language"] == lang]
        lps = [float(r["mean_logprob"]) for r in mine if r["mean_logprob"] is not None]
        n_warned = sum(bool(r["warned"]) for r in mine)
        spread = f"{min(lps):>8.2f}{statistics.median(lps):>8.2f}{max(lps):>8.2f}" if lps else ""
        print(f"{lang:<10}{len(mine):>6}{n_warned:>8}{spread}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, **stamp({}, machine)}, indent=1))
    print(f"json      {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
