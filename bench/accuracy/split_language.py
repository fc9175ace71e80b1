"""Does each piece of a split recording detect the recording's language?

    python -m bench split-language [--recordings 3] [--seconds 150] [--pieces 8] [--seed 0]
                                   [--model base] [--out FILE]

A split job's pieces are ordinary jobs: when the job sets no language, each piece detects
its own (handler/pipeline/split.py ``_piece_input``). A piece wrong about the language would be
transcribed (or translated) in the wrong one. This bench builds single-language recordings
from the accuracy corpus's prompts (bench/common/eval_corpus.py: en, es, fr, it, ru, one recorded
voice each, 0.3-1.2 s between prompts), cuts each where the worker cuts
(handler/inference/pieces.py) and asks the detection sequential decoding runs
(handler/inference/language.py ``as_sequential``: the job's speech by the VAD, its first
30 s) for the whole recording and for each piece. It does so twice: speech only, and with
the corpus's music on hold (20-s clips, no speech) put between prompts one time in six,
so that some pieces are mostly music. A piece in which the VAD finds no speech at all is
counted apart ("-"): its job transcribes nothing. No file of tests/data is used.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.eval_corpus import Item, load16k, with_model
from bench.common.machine import describe, line

RATE = 16000
LANGUAGES = ("en", "es", "fr", "it", "ru")
MUSIC_EVERY = 6
"""With music: a music clip after about one prompt in this many."""


def recording(
    prompts: list[Item], music: list[Item], seconds: float, rng: random.Random
) -> np.ndarray:
    parts: list[np.ndarray] = []
    n = 0
    while n < seconds * RATE:
        if music and rng.randrange(MUSIC_EVERY) == 0:
            parts.append(0.5 * load16k(rng.choice(music).path))
        else:
            parts.append(load16k(rng.choice(prompts).path))
        parts.append(np.zeros(int(rng.uniform(0.3, 1.2) * RATE), np.float32))
        n += len(parts[-2]) + len(parts[-1])
    return np.concatenate(parts).astype(np.float32)


def detect(model: Any, audio: np.ndarray, n: int) -> tuple[str, list[str]]:
    """The whole recording's language and each piece's, as the worker detects them."""
    from handler.inference import language, pieces

    kwargs = {"vad_filter": True}
    whole = language.as_sequential(model, audio, kwargs)
    cuts = pieces.cut_points(audio, n, kwargs)
    bounds = zip([0, *cuts], [*cuts, len(audio)], strict=True)
    found = [language.as_sequential(model, audio[a:b], kwargs) for a, b in bounds]
    return (whole[0] if whole else "-"), [f[0] if f else "-" for f in found]


def run(items: list[Item], model: Any, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    music = [it for it in items if it.group == "no_speech" and it.source == "music"]
    rows = []
    for with_music in (False, True):
        for lang in LANGUAGES:
            prompts = [it for it in items if it.language == lang and it.group == "prompt"]
            for r in range(args.recordings):
                audio = recording(prompts, music if with_music else [], args.seconds, rng)
                whole, found = detect(model, audio, args.pieces)
                rows.append(
                    {
                        "language": lang,
                        "music": with_music,
                        "recording": r,
                        "seconds": round(len(audio) / RATE, 1),
                        "whole": whole,
                        "pieces": found,
                    }
                )
                print(
                    f"{lang} music={with_music} #{r}: whole {whole}, pieces {' '.join(found)}",
                    flush=True,
                )
    return {
        "rows": rows,
        "pieces": args.pieces,
        "seconds": args.seconds,
        "model": args.model,
        "seed": args.seed,
    }


def table(report: dict[str, Any]) -> str:
    out = [
        "| language | music between prompts | recordings wrong (whole) | pieces wrong "
        "| pieces without speech |",
        "|---|---|---|---|---|",
    ]
    for with_music in (False, True):
        for lang in (*LANGUAGES, "all"):
            rows = [
                r
                for r in report["rows"]
                if r["music"] == with_music and lang in ("all", r["language"])
            ]
            wrong = sum(r["whole"] != r["language"] for r in rows)
            pieces = [(p, r["language"]) for r in rows for p in r["pieces"]]
            bad = sum(p not in (lang_, "-") for p, lang_ in pieces)
            quiet = sum(p == "-" for p, _ in pieces)
            out.append(
                f"| {lang} | {'yes' if with_music else 'no'} | {wrong} of {len(rows)} "
                f"| {bad} of {len(pieces)} | {quiet} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench split-language", description=__doc__)
    parser.add_argument("--recordings", type=int, default=3, help="per language (default 3)")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--pieces", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="base")
    parser.add_argument("--out", type=Path, default=Path("bench/out/split_language.json"))
    args = parser.parse_args(argv)
    from faster_whisper import WhisperModel

    if (loaded := with_model(args.model, args.seed)) is None:
        return 1
    items, model_dir = loaded
    machine = describe()
    model = WhisperModel(str(model_dir), device="cpu", compute_type="int8")
    report = {**run(items, model, args), "machine": machine}
    print(line(machine))
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
