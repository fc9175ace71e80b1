"""Phrases a speaker really repeats, with and without the loop guard: kept or collapsed?

    python -m bench said-again [--cases 24] [--model tiny.en] [--languages en] [--seed 0]

A repetition loop and a speaker who says the same thing again and again ("press star to
cancel" four times from a phone menu, "hello? hello? hello? hello?" from a caller) look the
same in a transcript. Each case here is real speech: a short prompt of the evaluation
corpus (1-8 words; ``python -m bench corpus`` fetches it) said 4-7 times back to back,
0.2-0.9 s apart, between two other prompts. Every configuration decodes the same cases in
the same run:

- ``off``: the worker with ``loop_guard`` false (what the model heard);
- ``collapse``: the guard as it was before occurrences were heard (decoded again, and
  collapsed if it still loops: ``repeats.CHECKS`` set to 0 for this row);
- ``on``: the guard as it is.

Per configuration: the cases whose text still shows the repetition (a phrase back to back
4 times or more, a word 6 times, as the guard finds loops), the repeats in the text beside
the repeats said, loop warnings, WER against what was said, and the seconds spent. (The
same job decoded twice on the CPU here is not always the same text, "Press 1" once and
"Press one" the next time, so whole-text comparisons between rows would count that too.)
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.eval_corpus import DEFAULT_DIR, build, load16k
from bench.common.machine import describe, stamp

ROOT = Path(__file__).resolve().parents[2]
RATE = 16000


def cases(count: int, languages: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """``count`` cases: samples, what was said, the language, the phrase and its repeats."""
    prompts = [it for it in build(DEFAULT_DIR, 0) if it.group == "prompt"]
    by_lang = {
        lang: [it for it in prompts if it.language == lang and it.text.strip()]
        for lang in languages
    }
    out = []
    for n in range(count):
        lang = languages[n % len(languages)]
        short = [it for it in by_lang[lang] if 1 <= len(it.text.split()) <= 8]
        phrase = rng.choice(short)
        times = rng.randint(6, 7) if len(phrase.text.split()) == 1 else rng.randint(4, 6)
        before, after = rng.choice(by_lang[lang]), rng.choice(by_lang[lang])
        said = load16k(phrase.path)
        parts = [load16k(before.path), np.zeros(int(0.6 * RATE), np.float32)]
        for _ in range(times):
            parts += [said, np.zeros(int(rng.uniform(0.2, 0.9) * RATE), np.float32)]
        parts += [load16k(after.path)]
        text = " ".join([before.text, *[phrase.text] * times, after.text])
        out.append(
            {
                "samples": np.concatenate(parts),
                "text": text,
                "language": lang,
                "phrase": phrase.text,
                "times": times,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench said-again", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base or a folder")
    parser.add_argument("--languages", default="en", help="comma-separated: en,es,fr,it,ru")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "said-again.json"))
    args = parser.parse_args(argv)
    before = describe()

    from bench.common.worker import cpu_worker
    from handler.inference import loops
    from handler.pipeline import repeats
    from handler.pipeline.job import run_job
    from speech_assets.clips import wav_bytes, wer

    worker, _ = cpu_worker(args.model, args.threads)
    checks = repeats.CHECKS
    rows: dict[str, dict[str, Any]] = {
        k: {"repeating": 0, "repeats": 0, "wer": [], "seconds": 0.0, "warnings": 0}
        for k in ("off", "collapse", "on")
    }
    made = cases(args.cases, args.languages.split(","), random.Random(args.seed))
    for case in made:
        audio = base64.b64encode(wav_bytes(case["samples"])).decode()
        for name in rows:
            repeats.CHECKS = 0 if name == "collapse" else checks
            job = {"audio_base64": audio, "language": case["language"]}
            t = time.perf_counter()
            out = run_job({**job, "loop_guard": name != "off"}, worker)
            assert "error" not in out, out
            row = rows[name]
            row["seconds"] += time.perf_counter() - t
            found = loops.find(out["text"].split())
            row["repeating"] += bool(found)
            row["repeats"] += sum(f.repeats for f in found)
            row["wer"].append(round(wer(case["text"], out["text"]), 4))
            row["warnings"] += sum("repetition loop" in w for w in out.get("warnings", []))
    repeats.CHECKS = checks
    report = {
        "cases": len(made),
        "model": args.model,
        "languages": args.languages,
        "audio_seconds": round(sum(len(c["samples"]) for c in made) / RATE, 1),
        "rows": rows,
        "command": "python -m bench said-again " + " ".join(argv or []),
    }
    stamp(report, before)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    said = sum(c["times"] for c in made)
    print(f"{len(made)} cases ({args.languages}), {report['audio_seconds']} s, {args.model}")
    print(
        "| configuration | cases still repeating | repeats in the text (said) | loop warnings "
        "| WER | s |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        cells = [
            name,
            f"{r['repeating']}/{len(made)}",
            f"{r['repeats']} ({said})",
            str(r["warnings"]),
            f"{np.mean(r['wer']):.1%}",
            f"{r['seconds']:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
