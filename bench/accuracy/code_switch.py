"""Conversations in several languages: WER per language and speech left without a segment.

    python -m bench code-switch [--conversations 8] [--seed 0] [--model base] [--out FILE]

Each conversation is built from the accuracy corpus's prompts (bench/common/eval_corpus.py, five
languages, one voice each: en, es, fr, it, ru): three languages (so three voices), 8-14
turns, each turn 1-3 prompts of one language (1-9 s), the language changing at every turn,
0.25-1 s of silence between turns. No file of tests/data is used.

Every conversation goes through the worker's own job path (base model, int8, this CPU)
twice: with the language left to detection (the default: one language for the file) and
with ``"language": "multi"`` (a language per part, handler/inference/code_switch.py). Each
turn is also transcribed alone (detected) as the reference point. Reported per mode: WER
per language over the turns of that language (words assigned to turns by their times),
the share of the turns' speech that no segment covers, how often the worker warned of
speech without a segment, and the job's seconds.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.eval_corpus import Item, load16k, with_model
from bench.common.machine import describe, line

RATE = 16000
LANGUAGES = ("en", "es", "fr", "it", "ru")
MAX_TURN_S = 9.0


@dataclass
class Turn:
    start: float
    end: float
    language: str
    text: str
    samples: np.ndarray


@dataclass
class Conversation:
    name: str
    samples: np.ndarray
    turns: list[Turn]


def conversation(name: str, pool: dict[str, list[Item]], rng: random.Random) -> Conversation:
    langs = rng.sample(LANGUAGES, 3)
    parts: list[np.ndarray] = []
    turns: list[Turn] = []
    at = 0
    last = None
    for _ in range(rng.randint(8, 14)):
        lang = rng.choice([x for x in langs if x != last])
        last = lang
        clips: list[np.ndarray] = []
        texts: list[str] = []
        for _ in range(rng.randint(1, 3)):
            item = rng.choice(pool[lang])
            audio = load16k(item.path)
            if clips and (sum(len(c) for c in clips) + len(audio)) / RATE > MAX_TURN_S:
                break
            clips.append(audio)
            texts.append(item.text)
            clips.append(np.zeros(int(0.15 * RATE), np.float32))
        turn = np.concatenate(clips[:-1]) if len(clips) > 1 else clips[0]
        gap = np.zeros(int(rng.uniform(0.25, 1.0) * RATE), np.float32)
        turns.append(Turn(at / RATE, (at + len(turn)) / RATE, lang, " ".join(texts), turn))
        parts += [turn, gap]
        at += len(turn) + len(gap)
    return Conversation(name, np.concatenate(parts), turns)


def words_by_turn(result: dict[str, Any], turns: list[Turn]) -> list[list[str]]:
    """Each turn's words of the hypothesis: a word goes to the turn nearest its middle."""
    out: list[list[str]] = [[] for _ in turns]
    for seg in result.get("segments") or []:
        for w in seg.get("words") or []:
            mid = (w["start"] + w["end"]) / 2
            near = min(
                range(len(turns)),
                key=lambda i: max(turns[i].start - mid, mid - turns[i].end, 0.0),
            )
            out[near].append(w["word"])
    return out


def covered(result: dict[str, Any], turns: list[Turn], step: float = 0.01) -> float:
    """Share of the turns' speech inside some segment."""
    end = max(t.end for t in turns)
    grid = np.arange(0, end, step) + step / 2
    speech = np.zeros(len(grid), bool)
    for t in turns:
        speech |= (grid >= t.start) & (grid < t.end)
    seg = np.zeros(len(grid), bool)
    for s in result.get("segments") or []:
        seg |= (grid >= s["start"]) & (grid < s["end"])
    return float((speech & seg).sum() / max(1, speech.sum()))


def wer_by_language(pairs: list[tuple[str, str, str]]) -> dict[str, float]:
    import jiwer

    from bench.common.text import normalise

    out = {}
    for lang in LANGUAGES:
        refs = [normalise(r, lang) for lg, r, _ in pairs if lg == lang]
        hyps = [normalise(h, lang) or "<empty>" for lg, _, h in pairs if lg == lang]
        if refs:
            out[lang] = round(float(jiwer.wer(refs, hyps)), 4)
    return out


def wav_b64(samples: np.ndarray) -> str:
    from speech_assets.clips import wav_bytes

    return base64.b64encode(wav_bytes(samples)).decode()


def run(convs: list[Conversation], worker: Any) -> dict[str, Any]:
    from handler.pipeline.job import run_job

    modes: dict[str, dict[str, Any]] = {
        "detected (default)": {},
        "multi": {"language": "multi"},
    }
    report: dict[str, Any] = {"modes": {}, "conversations": []}
    pairs: dict[str, list[tuple[str, str, str]]] = {m: [] for m in [*modes, "each turn alone"]}
    stats: dict[str, dict[str, float]] = {
        m: {"seconds": 0.0, "covered": 0.0, "warned": 0} for m in modes
    }
    for conv in convs:
        row: dict[str, Any] = {
            "name": conv.name,
            "seconds": round(len(conv.samples) / RATE, 1),
            "languages": [t.language for t in conv.turns],
        }
        audio = wav_b64(conv.samples)
        for mode, extra in modes.items():
            job = {
                "audio_base64": audio,
                "word_timestamps": True,
                "output": ["segments", "words"],
                **extra,
            }
            t = time.perf_counter()
            result = run_job(job, worker)
            took = time.perf_counter() - t
            if "error" in result:
                raise RuntimeError(f"{conv.name} {mode}: {result['error_code']}")
            per_turn = words_by_turn(result, conv.turns)
            for turn, words in zip(conv.turns, per_turn, strict=True):
                pairs[mode].append((turn.language, turn.text, "".join(words)))
            cov = covered(result, conv.turns)
            warned = any("got no segment" in w for w in result.get("warnings") or [])
            stats[mode]["seconds"] += took
            stats[mode]["covered"] += cov
            stats[mode]["warned"] += warned
            row[mode] = {
                "covered": round(cov, 4),
                "seconds": round(took, 2),
                "warned": warned,
                "language": result.get("language"),
            }
        for turn in conv.turns:
            alone = run_job({"audio_base64": wav_b64(turn.samples)}, worker)
            pairs["each turn alone"].append((turn.language, turn.text, alone.get("text", "")))
        report["conversations"].append(row)
        print(json.dumps(row), flush=True)
    n = len(convs)
    for mode in pairs:
        entry: dict[str, Any] = {"wer": wer_by_language(pairs[mode])}
        if mode in stats:
            entry.update(
                covered=round(stats[mode]["covered"] / n, 4),
                warned=f"{int(stats[mode]['warned'])}/{n}",
                seconds=round(stats[mode]["seconds"], 1),
            )
        report["modes"][mode] = entry
    return report


def table(report: dict[str, Any]) -> str:
    langs = [x for x in LANGUAGES if any(x in m["wer"] for m in report["modes"].values())]
    lines = [
        "| mode | "
        + " | ".join(f"WER {x}" for x in langs)
        + " | speech covered | warned | job s (all) |",
        "|---|" + "---|" * (len(langs) + 3),
    ]
    for mode, m in report["modes"].items():
        cells = [f"{m['wer'].get(x, float('nan')):.3f}" for x in langs]
        rest = (
            [f"{m['covered']:.3f}", m["warned"], f"{m['seconds']:.1f}"]
            if "covered" in m
            else ["", "", ""]
        )
        lines.append(f"| {mode} | " + " | ".join(cells + rest) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench code-switch", description=__doc__)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="base")
    parser.add_argument("--out", type=Path, default=Path("bench/out/code_switch.json"))
    args = parser.parse_args(argv)
    from handler.settings import load_settings
    from handler.startup import start_worker

    if (loaded := with_model(args.model, args.seed)) is None:
        return 1
    items, model_dir = loaded
    pool: dict[str, list[Item]] = {}
    for it in items:
        if it.source == "asterisk" and it.group in ("prompt", "short") and it.language:
            pool.setdefault(it.language, []).append(it)
    rng = random.Random(args.seed)
    convs = [conversation(f"conv{i:02d}", pool, rng) for i in range(args.conversations)]
    machine = describe()
    worker = start_worker(
        load_settings(
            {"WHISPER_DEVICE": "cpu", "WHISPER_MODEL": str(model_dir), "WHISPER_WARMUP": "false"}
        )
    )
    report = run(convs, worker)
    report["machine"] = machine
    print(line(machine))
    print(
        f"{len(convs)} conversations, {sum(len(c.samples) for c in convs) / RATE / 60:.1f} min, "
        f"model {args.model}, seed {args.seed}"
    )
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
