"""``python -m bench live-speakers``: a live session's speakers (Deepgram's ``diarize``,
AssemblyAI's ``speaker_labels``), turn by turn, on built conversations of real voices.

Each conversation of ``bench diarization`` (2 to 5 of nine real voices, 1 to 10 minutes)
is played as a live stream ends it: each phrase a turn, given to
``handler.inference.speakers.online.LiveSpeakers`` in the order said, which names its
speaker once (a live label is never revised). Scored per conversation: the share of the
speech whose turn got its voice's label (the labels mapped one to one onto the voices, the
best way: Hungarian), and the speakers found minus the voices that spoke. ``--sweep`` runs
the thresholds around the chosen ones on the same embeddings; ``--seed`` picks the
conversations (seed 1 chose the thresholds, seed 0 held them out).

``--snr DB`` plays them under pink noise that many dB below the speech (the diarization
bench's ``with_noise``); ``--overlap S`` lets the next speaker barge in: the first S
seconds of the next turn, when another voice says it, are mixed over the last S seconds
of this one (a turn a live VAD cut around crosstalk holds both voices).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy.diarization import RATE, Conversation, conversations, voices, with_noise
from handler.inference.speakers import diarizer as speaker_diarizer
from handler.inference.speakers import online
from speech_assets.diarization import diarizer_dir


class _Embedded:
    """A diarizer whose ``clip_embedding`` answers from embeddings made once (a sweep
    scores the same turns many times)."""

    def __init__(self, embeddings: list[np.ndarray]) -> None:
        self.left = list(embeddings)

    def clip_embedding(self, _samples: np.ndarray) -> np.ndarray:
        return self.left.pop(0)


def _score(labels: list[int | None], truth: list[str], seconds: list[float]) -> tuple[float, int]:
    from scipy.optimize import linear_sum_assignment

    voices_, found = sorted(set(truth)), sorted({x for x in labels if x is not None})
    grid = np.zeros((max(1, len(found)), len(voices_)))
    for label, voice, s in zip(labels, truth, seconds, strict=True):
        if label is not None:
            grid[found.index(label), voices_.index(voice)] += s
    rows, cols = linear_sum_assignment(-grid)
    return float(grid[rows, cols].sum() / sum(seconds)), len(found) - len(voices_)


def turn_pieces(conv: Conversation, overlap_s: float = 0.0) -> list[np.ndarray]:
    """Each turn's samples; with ``overlap_s``, the next turn's first seconds mixed over
    this one's last when another voice says it (a barge-in)."""
    pieces = [conv.samples[int(s * RATE) : int(e * RATE)].copy() for s, e, _ in conv.turns]
    n = int(overlap_s * RATE)
    if n <= 0:
        return pieces
    for i, (piece, nxt) in enumerate(zip(pieces, pieces[1:], strict=False)):
        if conv.turns[i][2] == conv.turns[i + 1][2]:
            continue
        k = min(n, len(piece), len(nxt))
        piece[len(piece) - k :] += nxt[:k]
        piece /= max(1.0, float(np.abs(piece).max()) / 0.9)
    return pieces


def run(
    seed: int, n: int, sweep: bool, snr_db: float | None = None, overlap_s: float = 0.0
) -> dict[str, Any]:
    diarizer = speaker_diarizer.load(str(diarizer_dir()), threads=2)
    convs = conversations(n, voices(), seed=seed)
    if snr_db is not None:
        convs = [with_noise(c, snr_db, i) for i, c in enumerate(convs)]
    started, turns = time.perf_counter(), []
    for conv in convs:
        pieces = turn_pieces(conv, overlap_s)
        turns.append(
            (
                [
                    diarizer.clip_embedding(p) if len(p) >= online.MIN_S * RATE else None
                    for p in pieces
                ],
                [v for _, _, v in conv.turns],
                [len(p) / RATE for p in pieces],
                pieces,
            )
        )
    embed_s = time.perf_counter() - started
    count = sum(len(t[0]) for t in turns)
    grid = [(online.THRESHOLD, online.SHORT_S)]
    if sweep:
        grid = [(t, s) for t in (0.60, 0.65, 0.70, 0.75, 0.80) for s in (0.0, 1.0, 1.5, 2.0)]
    rows, chosen = [], (online.THRESHOLD, online.SHORT_S)
    for threshold, short in grid:
        online.THRESHOLD, online.SHORT_S = threshold, short
        scores, extra = [], []
        for embeddings, truth, seconds, pieces in turns:
            speakers = online.LiveSpeakers(_Embedded([e for e in embeddings if e is not None]))
            labels = [None if (r := speakers.assign(p)) is None else r[0] for p in pieces]
            a, x = _score(labels, truth, seconds)
            scores.append(a)
            extra.append(x)
        rows.append(
            {
                "threshold": threshold,
                "short_s": short,
                "attribution_mean": round(float(np.mean(scores)), 3),
                "attribution_min": round(float(np.min(scores)), 3),
                "speakers_found_minus_true": extra,
            }
        )
    online.THRESHOLD, online.SHORT_S = chosen
    return {
        "seed": seed,
        "conversations": n,
        "snr_db": snr_db,
        "overlap_s": overlap_s,
        "turns": count,
        "embed_ms_per_turn": round(1000 * embed_s / max(1, count), 1),
        "rows": rows,
    }


def table(report: dict[str, Any]) -> str:
    noise = "" if report.get("snr_db") is None else f", pink noise {report['snr_db']:g} dB below"
    barge = f", {report['overlap_s']:g} s barge-ins" if report.get("overlap_s") else ""
    lines = [
        f"seed {report['seed']}: {report['conversations']} conversations, {report['turns']} "
        f"turns{noise}{barge}, {report['embed_ms_per_turn']} ms to embed a turn",
        "",
        "| threshold | shorter turns join the nearest (s) | attribution, mean | worst "
        "| speakers found - true |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['threshold']:.2f} | {r['short_s']:.1f} | {r['attribution_mean']:.3f} | "
            f"{r['attribution_min']:.3f} | {r['speakers_found_minus_true']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench live-speakers", description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--snr", type=float, default=None, help="pink noise, dB below speech")
    parser.add_argument(
        "--overlap", type=float, default=0.0, help="seconds of the next voice over a turn's end"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 0.0 <= args.overlap <= 5.0:
        parser.error("--overlap: 0 to 5 seconds")
    report = run(args.seed, args.conversations, args.sweep, args.snr, args.overlap)
    print(table(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0
