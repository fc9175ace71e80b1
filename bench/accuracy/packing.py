"""Packing short clips into one window: does each clip keep its text?

``python -m bench packing`` takes short real prompts of the evaluation corpus
(bench.common.eval_corpus, 1-10 s, one language at a time), transcribes each alone through the
worker's own ``run_job`` (its defaults, the clip's language given, word timestamps on),
then packs consecutive clips into windows of at most ``--window`` seconds with ``--gap``
seconds of silence between them, transcribes each pack the same way, and gives every
word back to the clip whose time span holds the word's middle. It prints, per language,
the WER of the clips alone and packed (jiwer, the accuracy bench's normalisers), how many
clips changed text, how many words landed in the wrong clip or in a gap, and the model
time of both: the case for packing (a 5-s clip pays for a 30-s encoder window) against
what it costs in accuracy. Packing is adopted only if the packed WER is no worse.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jiwer
import numpy as np

from bench.common.eval_corpus import DEFAULT_DIR, FetchError, Item, build, load16k
from bench.common.machine import describe, stamp
from bench.common.text import normalise
from speech_assets.clips import RATE, wav_bytes

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Pack:
    clips: list[Item]
    spans: list[tuple[float, float]]
    """Each clip's (start, end) in the packed audio, seconds."""
    samples: np.ndarray


def packs_of(items: list[Item], window: float, gap: float) -> list[Pack]:
    """Consecutive clips, ``gap`` s of silence apart, while the pack fits ``window`` s."""
    out: list[Pack] = []
    cur: list[tuple[Item, np.ndarray]] = []

    def close() -> None:
        parts, spans, t = [], [], 0.0
        silence = np.zeros(int(gap * RATE), np.float32)
        for n, (_, audio) in enumerate(cur):
            if n:
                parts.append(silence)
                t += gap
            spans.append((t, t + len(audio) / RATE))
            parts.append(audio)
            t += len(audio) / RATE
        out.append(Pack([it for it, _ in cur], spans, np.concatenate(parts)))
        cur.clear()

    for it in items:
        audio = load16k(it.path)
        length = sum(len(a) for _, a in cur) / RATE + gap * len(cur) + len(audio) / RATE
        if cur and length > window:
            close()
        cur.append((it, audio))
    if cur:
        close()
    return out


def transcribe(worker: Any, samples: np.ndarray, language: str) -> tuple[dict[str, Any], float]:
    from handler.pipeline.job import run_job

    job = {
        "audio_base64": base64.b64encode(wav_bytes(samples)).decode(),
        "language": language,
        "word_timestamps": True,
        "output": ["text", "words"],
    }
    t = time.perf_counter()
    out = run_job(job, worker)
    return out, time.perf_counter() - t


def split_words(
    words: list[dict[str, Any]], spans: list[tuple[float, float]], gap: float
) -> tuple[list[str], int]:
    """Each clip's text from the pack's words (by the word's middle); words in no span."""
    texts: list[list[str]] = [[] for _ in spans]
    stray = 0
    for w in words:
        mid = (w["start"] + w["end"]) / 2
        # A word belongs to the nearest clip whose span, widened by half the gap, holds it.
        hit = [n for n, (a, b) in enumerate(spans) if a - gap / 2 <= mid <= b + gap / 2]
        if hit:
            texts[hit[0]].append(w["word"])
        else:
            stray += 1
    return ["".join(t).strip() for t in texts], stray


def wer(refs: list[str], hyps: list[str]) -> float:
    return jiwer.process_words(refs, [h or "<empty>" for h in hyps]).wer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench packing", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="base", help="base (PyPI), tiny.en or a folder")
    parser.add_argument("--languages", default="en,es,fr,it,ru")
    parser.add_argument("--clips", type=int, default=40, help="clips per language")
    parser.add_argument("--window", type=float, default=30.0, help="pack length limit, s")
    parser.add_argument("--gap", type=float, default=1.0, help="silence between clips, s")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "packing.json"))
    args = parser.parse_args(argv)
    machine = describe()

    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets import models as pypi_models

    try:
        items = build(DEFAULT_DIR)
        model_dir = pypi_models.model_dir(args.model, DEFAULT_DIR.parent / "whisper-base")
    except (FetchError, pypi_models.ModelMissing) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    env = {
        "WHISPER_DEVICE": "cpu",
        "WHISPER_CPU_THREADS": str(args.threads),
        "WHISPER_MODEL": str(model_dir),
    }
    worker = start_worker(load_settings(env))
    rows, files = [], []
    for lang in args.languages.split(","):
        mine = [it for it in items if it.language == lang and it.group in ("prompt", "short")]
        mine = [it for it in mine if 1.0 <= len(load16k(it.path)) / RATE <= 10.0][: args.clips]
        if not mine:
            continue
        refs = [normalise(it.text, lang) for it in mine]
        alone, t_alone = [], 0.0
        for it in mine:
            out, dt = transcribe(worker, load16k(it.path), lang)
            alone.append(normalise(out.get("text", ""), lang))
            t_alone += dt
        packed, t_packed, stray, packs = [], 0.0, 0, packs_of(mine, args.window, args.gap)
        for pack in packs:
            out, dt = transcribe(worker, pack.samples, lang)
            texts, s = split_words(out.get("words", []), pack.spans, args.gap)
            packed += [normalise(t, lang) for t in texts]
            t_packed += dt
            stray += s
        changed = sum(a != p for a, p in zip(alone, packed, strict=True))
        row = {
            "language": lang,
            "clips": len(mine),
            "packs": len(packs),
            "wer_alone": wer(refs, alone),
            "wer_packed": wer(refs, packed),
            "changed": changed,
            "stray_words": stray,
            "seconds_alone": round(t_alone, 1),
            "seconds_packed": round(t_packed, 1),
        }
        rows.append(row)
        files += [
            {"file": it.path.name, "language": lang, "ref": r, "alone": a, "packed": p}
            for it, r, a, p in zip(mine, refs, alone, packed, strict=True)
        ]
        print(
            f"{lang}: {len(mine)} clips in {len(packs)} packs, WER alone "
            f"{row['wer_alone']:.1%} packed {row['wer_packed']:.1%}",
            flush=True,
        )
    all_refs = [f["ref"] for f in files]
    total = {
        "language": "all",
        "clips": len(files),
        "packs": sum(r["packs"] for r in rows),
        "wer_alone": wer(all_refs, [f["alone"] for f in files]),
        "wer_packed": wer(all_refs, [f["packed"] for f in files]),
        "changed": sum(r["changed"] for r in rows),
        "stray_words": sum(r["stray_words"] for r in rows),
        "seconds_alone": round(sum(r["seconds_alone"] for r in rows), 1),
        "seconds_packed": round(sum(r["seconds_packed"] for r in rows), 1),
    }
    rows.append(total)
    print(f"\nmodel {args.model}, windows of at most {args.window:g} s, {args.gap:g} s gaps")
    print(
        "| language | clips | packs | WER alone | WER packed | clips changed | stray words "
        "| model s alone | model s packed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['language']} | {r['clips']} | {r['packs']} | {r['wer_alone']:.1%} | "
            f"{r['wer_packed']:.1%} | {r['changed']} | {r['stray_words']} | "
            f"{r['seconds_alone']} | {r['seconds_packed']} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "args": vars(args),
                "rows": rows,
                "files": files,
                "machine": stamp({}, machine)["machine"],
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
