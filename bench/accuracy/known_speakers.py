"""Known speakers, measured: is a name given to the voice of its reference clip, and to
no other? And does a speaker count the voices cannot support get a warning?

    python -m bench known-speakers [--trials 40] [--tune-seed 0] [--seed 1] [--out FILE]

Real voices: the nine of ``python -m bench diarization`` (the evaluation corpus's
Asterisk prompt voices in four languages, three more Debian prompt voices, the LibriVox
reader), each voice's phrases cut in two halves: reference clips come from one half,
conversations from the other, so no clip is heard in the conversation it names.

Each trial builds a two-voice conversation (A and B, 45-90 s, as the diarization bench
builds them) and two 3-9-s reference clips: one of A (its name must go to A and to no
one else) and one of a third voice C that is not in the conversation (its name must go to
no one). The diarizer runs once; the cosine between each reference and each speaker's
voice (the unit mean of its windows' embeddings, what ``speaker_embeddings`` returns)
gives the same-voice and different-voice score distributions, and from them the rates a
threshold would give. ``--tune-seed`` trials choose the threshold (the lowest that keeps
wrong names at 0 there, plus a margin); ``--seed`` trials, other conversations and
clips, report the rates through the worker's own naming at that threshold.

The count: the same conversations diarized with ``num_speakers`` 2 (true) and one voice's
speech alone with ``num_speakers`` 2 and 4 (false); the highest cosine between two of the
speakers found tells a count the voices support from one they do not.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy.diarization import Phrase, conversation, voices
from bench.common.machine import describe
from bench.common.machine import line as machine_line

RATE = 16000
ROOT = Path(__file__).resolve().parents[2]


def halves(
    pool: dict[str, list[Phrase]],
) -> tuple[dict[str, list[Phrase]], dict[str, list[Phrase]]]:
    """(reference phrases, conversation phrases) of every voice with enough of both."""
    refs, convs = {}, {}
    for voice, phrases in pool.items():
        if len(phrases) < 8:
            continue  # JFK: one recording, nothing to hold out
        refs[voice], convs[voice] = phrases[::2], phrases[1::2]
    return refs, convs


def reference_clip(phrases: list[Phrase], rng: random.Random) -> np.ndarray:
    """3-9 s of one voice: phrases joined with 0.3 s between, as a person would record."""
    out: list[np.ndarray] = []
    total = 0
    for p in rng.sample(phrases, len(phrases)):
        if total + len(p.samples) > 9 * RATE:
            continue
        out += [p.samples.astype(np.float32), np.zeros(int(0.3 * RATE), np.float32)]
        total += len(p.samples) + int(0.3 * RATE)
        if total >= 3 * RATE:
            break
    clip = np.concatenate(out)[: int(9.5 * RATE)]
    return clip / max(1.0, float(np.abs(clip).max()) / 0.9)


def _owner(turns: list[Any], truth: list[tuple[float, float, str]]) -> dict[str, str]:
    """Hypothesis speaker -> the true voice it overlaps most."""
    overlap: dict[tuple[str, str], float] = {}
    for t in turns:
        for s, e, v in truth:
            o = min(t.end, e) - max(t.start, s)
            if o > 0:
                overlap[(t.speaker, v)] = overlap.get((t.speaker, v), 0.0) + o
    best: dict[str, tuple[float, str]] = {}
    for (h, v), o in overlap.items():
        if o > best.get(h, (0.0, ""))[0]:
            best[h] = (o, v)
    return {h: v for h, (_, v) in best.items()}


def trials(n: int, seed: int, diarizer: Any) -> list[dict[str, Any]]:
    from handler.inference.speakers.clusters import SpeakerCount

    refs, convs = halves(voices())
    names = sorted(refs)
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, c = rng.sample(names, 3)
        conv = conversation(
            f"t{i:02d}", {a: convs[a], b: convs[b]}, 2, rng.choice((45, 60, 90)), rng
        )
        ref_a = diarizer.clip_embedding(reference_clip(refs[a], rng))
        ref_c = diarizer.clip_embedding(reference_clip(refs[c], rng))
        found = diarizer.run(conv.samples, SpeakerCount(), None, {"Named": ref_a})
        owner = _owner(found.turns, conv.turns)
        voice_of = {h: np.asarray(v) / np.linalg.norm(v) for h, v in found.centroids.items()}
        rows.append(
            {
                "a": a,
                "b": b,
                "c": c,
                "speakers": {h: owner.get(h, "?") for h in voice_of},
                "named": [h for h in found.speakers if h == "Named"],
                "named_owner": owner.get("Named"),
                "cos_a": {h: float(v @ ref_a) for h, v in voice_of.items()},
                "cos_c": {h: float(v @ ref_c) for h, v in voice_of.items()},
                "pair_cos": _max_pair(list(voice_of.values())),
            }
        )
        print(f"  trial {i + 1}/{n}: {a} + {b} (impostor {c})", file=sys.stderr)
    return rows


def _max_pair(vs: list[np.ndarray]) -> float | None:
    pairs = [float(x @ y) for i, x in enumerate(vs) for y in vs[i + 1 :]]
    return max(pairs) if pairs else None


def scores(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(same-voice cosines, different-voice cosines) of the references against speakers."""
    same: list[float] = []
    diff: list[float] = []
    for r in rows:
        for h, v in r["speakers"].items():
            (same if v == r["a"] else diff).append(r["cos_a"][h])
            diff.append(r["cos_c"][h])
    return same, diff


def rates(rows: list[dict[str, Any]], threshold: float) -> dict[str, float]:
    """What naming at ``threshold`` gives: A's speaker named (right), any other speaker
    named by A's or C's clip (wrong), per trial."""
    right = wrong = 0
    for r in rows:
        best_a = max(r["cos_a"], key=r["cos_a"].get)
        if r["cos_a"][best_a] >= threshold:
            if r["speakers"].get(best_a) == r["a"]:
                right += 1
            else:
                wrong += 1
        if max(r["cos_c"].values()) >= threshold:
            wrong += 1
    n = max(1, len(rows))
    return {"right": right / n, "wrong": wrong / (2 * n)}


def choose(rows: list[dict[str, Any]], margin: float = 0.05) -> float:
    """The lowest threshold with no wrong name on the tuning trials, plus ``margin``."""
    _, diff = scores(rows)
    return round(max(diff) + margin, 2)


def counts(seed: int, n: int, diarizer: Any) -> dict[str, list[float]]:
    """Highest speaker-pair cosine with a count the voices support (two voices, 2) and
    with counts they do not (one voice, 2 and 4)."""
    from handler.inference.speakers.clusters import SpeakerCount

    _, convs = halves(voices())
    names = sorted(convs)
    rng = random.Random(seed + 1000)
    out: dict[str, list[float]] = {"true": [], "false": []}
    for _ in range(n):
        a, b = rng.sample(names, 2)
        two = conversation("two", {a: convs[a], b: convs[b]}, 2, 60, rng)
        one = conversation("one", {a: convs[a]}, 1, 45, rng)
        for samples, k, kind in (
            (two.samples, 2, "true"),
            (one.samples, 2, "false"),
            (one.samples, 4, "false"),
        ):
            found = diarizer.run(samples, SpeakerCount(k, 1, 8))
            vs = [np.asarray(v) / np.linalg.norm(v) for v in found.centroids.values()]
            if (pair := _max_pair(vs)) is not None:
                out[kind].append(round(pair, 4))
    return out


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    q = np.percentile(values, [0, 5, 50, 95, 100])
    return " / ".join(f"{x:.2f}" for x in q)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench known-speakers", description=__doc__)
    parser.add_argument("--trials", type=int, default=40, help="conversations per seed")
    parser.add_argument("--tune-seed", type=int, default=0, help="trials that set the threshold")
    parser.add_argument("--seed", type=int, default=1, help="held-out trials that are reported")
    parser.add_argument("--count-trials", type=int, default=12, help="for the count check")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "known-speakers.json")
    args = parser.parse_args(argv)

    from handler.inference.speakers import diarizer as diarize
    from speech_assets.diarization import diarizer_dir

    d = diarize.load(str(diarizer_dir()))
    tune = trials(args.trials, args.tune_seed, d)
    held = trials(args.trials, args.seed, d)
    same, diff = scores(tune)
    chosen = choose(tune)
    report: dict[str, Any] = {
        "machine": describe(),
        "tune": {"same": _summary(same), "different": _summary(diff), "rows": tune},
        "chosen_threshold": chosen,
        "worker_threshold": diarize.NAME_THRESHOLD,
        "held_out": {
            "at_chosen": rates(held, chosen),
            "at_worker": rates(held, diarize.NAME_THRESHOLD),
            "named_by_worker": {
                "right": sum(r["named_owner"] == r["a"] for r in held) / len(held),
                "wrong": sum(bool(r["named"]) and r["named_owner"] != r["a"] for r in held)
                / len(held),
            },
            "same": _summary(scores(held)[0]),
            "different": _summary(scores(held)[1]),
            "rows": held,
        },
        "count": counts(args.seed, args.count_trials, d),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(machine_line(report["machine"]))
    print("cosine of a reference clip with a speaker's voice: min / p5 / median / p95 / max")
    print(f"  tuning seed {args.tune_seed}: same voice {_summary(same)}; other {_summary(diff)}")
    h_same, h_diff = scores(held)
    print(f"  held-out seed {args.seed}: same voice {_summary(h_same)}; other {_summary(h_diff)}")
    print(
        f"threshold chosen on the tuning trials: {chosen} (the worker's: {diarize.NAME_THRESHOLD})"
    )
    for key in ("at_chosen", "at_worker", "named_by_worker"):
        print(f"  held out, {key}: {report['held_out'][key]}")
    c = report["count"]
    print(f"highest speaker-pair cosine, count supported: {_summary(c['true'])}")
    print(f"highest speaker-pair cosine, count not supported: {_summary(c['false'])}")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
