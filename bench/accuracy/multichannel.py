"""Calls recorded in stereo: each side on its own channel, against the channels mixed down.

    python -m bench multichannel [--calls 12] [--model base] [--overlap 0.3] [--seed 0]

What it runs on: two-party calls built here from real recorded speech with known text
(bench.accuracy.diarization's voices): one side is the evaluation corpus's English voice
(Allison, en-US), the other the LibriVox reader or JFK (``en+en`` calls) or a voice in
another language (June fr-CA, Carlo it-IT, IvrvoiceRU ru-RU: ``en+xx`` calls, an
interpreted call), alternating. Turns of 1-2 phrases, 0.2-1.0 s apart; with probability
``--overlap`` a turn starts 0.3-1.0 s before the other side's ends (crosstalk). Each side
is one channel of a 16-bit stereo WAV.

Each call goes through the worker's own ``run_job`` twice: mixed down (the default) and
with ``multichannel``. Scored with jiwer after Whisper's normalisers (each phrase in its
own language; a hypothesis segment in the language it was decoded in): the WER of the
whole call against its phrases in the order said, and with ``multichannel`` each side's
WER alone. Also the transcription seconds of each way (the cost: ``time x`` is the median
call's multichannel seconds over its mixed-down seconds), and a call whose two
channels carry the same samples (a mono call saved as stereo), whose second channel is
not transcribed again.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import statistics
import sys
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.eval_corpus import DEFAULT_DIR
from bench.common.machine import describe, stamp

RATE = 16000
ROOT = Path(__file__).resolve().parents[2]
OTHER = {"fr_CA_f_June": "fr", "it_IT_m_Carlo": "it", "ru_RU_f_IvrvoiceRU": "ru"}


@dataclass
class Call:
    name: str
    kind: str
    stereo: np.ndarray
    """(samples, 2) float32."""
    phrases: list[tuple[float, int, str, str]]
    """(start s, side, language, text) of each phrase."""

    def side_text(self, side: int) -> list[tuple[str, str]]:
        return [(lang, text) for _, s, lang, text in sorted(self.phrases) if s == side]

    def wav(self, same: bool = False) -> bytes:
        pcm = np.clip(self.stereo, -1, 1)
        if same:
            pcm = np.stack([pcm[:, 0], pcm[:, 0]], axis=1)
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((pcm * 32767).astype("<i2").tobytes())
        return buf.getvalue()


def build_call(
    name: str,
    sides: list[tuple[list[Any], str]],
    seconds: float,
    overlap: float,
    rng: random.Random,
) -> Call:
    """Turns alternating between the two sides until ``seconds`` of audio."""
    pieces: list[tuple[int, int, np.ndarray, str, str]] = []
    t, side, last_end = 0, 0, 0
    while t < seconds * RATE:
        pool, lang = sides[side]
        if pieces and rng.random() < overlap:
            t = max(0, last_end - int(rng.uniform(0.3, 1.0) * RATE))
        else:
            t = last_end + int(rng.uniform(0.2, 1.0) * RATE)
        for _ in range(rng.randint(1, 2)):
            p = rng.choice(pool)
            pieces.append((t, side, p.samples.astype(np.float32), lang, p.text))
            t += len(p.samples) + int(rng.uniform(0.15, 0.35) * RATE)
        last_end = t
        side = 1 - side
    stereo = np.zeros((max(s + len(a) for s, _, a, _, _ in pieces) + RATE // 2, 2), np.float32)
    for s, c, a, _, _ in pieces:
        stereo[s : s + len(a), c] += a
    stereo /= max(1.0, float(np.abs(stereo).max()) / 0.9)
    phrases = [(s / RATE, c, lang, text) for s, c, _, lang, text in pieces]
    kind = "en+en" if sides[1][1] == "en" else "en+xx"
    return Call(name, kind, stereo, phrases)


def calls(n: int, overlap: float, seed: int) -> list[Call]:
    from bench.accuracy.diarization import voices

    pool = voices(DEFAULT_DIR, per_voice=80, seed=seed)
    english = [p for p in pool["en_US_f_Allison"] if p.text]
    readers = [p for p in pool["librivox"] + pool["jfk"] if p.text]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            other: tuple[list[Any], str] = (readers, "en")
        else:
            voice = sorted(OTHER)[(i // 2) % len(OTHER)]
            other = ([p for p in pool[voice] if p.text], OTHER[voice])
        out.append(build_call(f"call{i:02d}", [(english, "en"), other], 45.0, overlap, rng))
    return out


def _norm(pairs: list[tuple[str, str]]) -> str:
    """Texts normalised in their languages, a run in one language as one text (the English
    normaliser joins spoken numbers across phrases: scored alike on both sides)."""
    from bench.common.text import normalise

    runs: list[tuple[str, list[str]]] = []
    for lang, text in pairs:
        if runs and runs[-1][0] == lang:
            runs[-1][1].append(text)
        else:
            runs.append((lang, [text]))
    return " ".join(t for t in (normalise(" ".join(texts), lang) for lang, texts in runs) if t)


def _hyp(result: dict[str, Any], languages: dict[int, str]) -> str:
    """The result's segments, each normalised in the language it was decoded in."""
    lang = result.get("language") or "en"
    pairs = [(languages.get(s.get("channel", -1), lang), s["text"]) for s in result["segments"]]
    return _norm(pairs)


def score(call: Call, mixed: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
    import jiwer

    ref = _norm([(lang, text) for _, _, lang, text in sorted(call.phrases)])
    languages = {c["channel"]: c["language"] or "en" for c in split["channels"]}
    row: dict[str, Any] = {
        "call": call.name,
        "kind": call.kind,
        "seconds": round(len(call.stereo) / RATE, 1),
        "wer_mixed": round(jiwer.wer(ref, _hyp(mixed, {})), 4),
        "wer_multichannel": round(jiwer.wer(ref, _hyp(split, languages)), 4),
        "language_mixed": mixed.get("language"),
        "languages": [languages[0], languages[1]],
        "transcribe_mixed_s": round(mixed["timings"]["transcribe"], 2),
        "transcribe_multichannel_s": round(split["timings"]["transcribe"], 2),
    }
    for side in (0, 1):
        side_ref = _norm(call.side_text(side))
        side_hyp = _norm([(languages[side], split["channels"][side]["text"])])
        row[f"wer_side{side}"] = round(jiwer.wer(side_ref, side_hyp), 4)
    return row


def _table(rows: list[dict[str, Any]]) -> None:
    print(f"{'kind':<8}{'calls':>6}{'WER mixed':>11}{'WER multi':>11}{'side 0':>8}{'side 1':>8}"
          f"{'time x':>8}")  # fmt: skip
    for kind in ("en+en", "en+xx", "all"):
        mine = [r for r in rows if kind in ("all", r["kind"])]
        if not mine:
            continue

        def mean(key: str, rs: list[dict[str, Any]] = mine) -> float:
            return sum(float(r[key]) for r in rs) / len(rs)

        # The median call's: one temperature fallback can take a call's decoding 4x.
        ratio = statistics.median(
            r["transcribe_multichannel_s"] / max(1e-9, r["transcribe_mixed_s"]) for r in mine
        )
        print(
            f"{kind:<8}{len(mine):>6}{mean('wer_mixed'):>11.3f}{mean('wer_multichannel'):>11.3f}"
            f"{mean('wer_side0'):>8.3f}{mean('wer_side1'):>8.3f}{ratio:>8.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench multichannel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--model", default="base", help="tiny.en, base or a model folder")
    parser.add_argument("--overlap", type=float, default=0.3, help="share of turns that overlap")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "multichannel.json"))
    args = parser.parse_args(argv)
    machine = describe()

    from bench.common.worker import cpu_worker
    from handler.pipeline.job import run_job

    worker, _ = cpu_worker(args.model, args.threads)
    built = calls(args.calls, args.overlap, args.seed)
    if not worker.pool.get(None).multilingual:
        built = [c for c in built if c.kind == "en+en"]
    rows = []
    started = time.perf_counter()
    for call in built:
        audio = base64.b64encode(call.wav()).decode()
        mixed = run_job({"audio_base64": audio}, worker)
        split = run_job({"audio_base64": audio, "multichannel": True}, worker)
        if "error" in mixed or "error" in split:
            print(
                f"bench: {call.name}: {mixed.get('error') or split.get('error')}", file=sys.stderr
            )
            return 1
        rows.append(score(call, mixed, split))
        print(json.dumps(rows[-1]), file=sys.stderr)
    same = base64.b64encode(built[0].wav(same=True)).decode()
    once = run_job({"audio_base64": same, "multichannel": True}, worker)
    alone = run_job({"audio_base64": same}, worker)
    repeated = {
        "same_as": once["channels"][1].get("same_as"),
        "transcribe_multichannel_s": round(once["timings"]["transcribe"], 2),
        "transcribe_mixed_s": round(alone["timings"]["transcribe"], 2),
    }
    print(f"model {args.model}, overlap {args.overlap}, {time.perf_counter() - started:.0f} s")
    _table(rows)
    print(f"same samples on both channels: {repeated}")
    report = {"args": vars(args), "rows": rows, "same_channels": repeated}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(report, machine), indent=1))
    print(f"json      {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
