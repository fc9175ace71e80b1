"""Repetition loops per audio hour, before and after the loop guard, on long recordings
with music, noise and silence between the speech.

    python -m bench loops [--recordings 2] [--minutes 10] [--model tiny.en] [--seed 0]

Each recording is built from real assets (``python -m bench corpus`` fetches them): the
evaluation corpus's English prompts and the JFK and LibriVox readings, with, between two
stretches of speech, a 20-90-s excerpt of a music-on-hold track (Debian's
asterisk-moh-opsound-wav), 10-40 s of white or pink noise, or 10-60 s of silence. Each
configuration decodes the same recordings in the same run:

- ``plain``: ``WhisperModel.transcribe`` with faster-whisper's defaults (no VAD);
- ``worker off`` / ``worker on``: the worker's defaults with ``loop_guard`` false / true;
- ``novad off`` / ``novad on``: the same with ``vad_filter: false``.

A loop is what the guard looks for (``handler.inference.loops.find``: a phrase back to
back 4 times or more, a word 6 times), counted in each output; WER against the speech
that was put in (after lower-casing and dropping punctuation).
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
CONFIGS: dict[str, dict[str, Any]] = {
    "worker off": {"loop_guard": False},
    "worker on": {},
    "novad off": {"loop_guard": False, "vad_filter": False},
    "novad on": {"vad_filter": False},
}


def filler(kind: str, rng: random.Random, music: list[np.ndarray]) -> np.ndarray:
    if kind == "music":
        track = rng.choice(music)
        n = int(rng.uniform(20, 90) * RATE)
        start = rng.randrange(0, max(1, len(track) - n))
        return track[start : start + n]
    if kind == "silence":
        return np.zeros(int(rng.uniform(10, 60) * RATE), np.float32)
    n = int(rng.uniform(10, 40) * RATE)
    white = np.random.default_rng(rng.randrange(2**31)).standard_normal(n).astype(np.float32)
    if kind == "pink":
        spectrum = np.fft.rfft(white)
        spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
        white = np.fft.irfft(spectrum, n).astype(np.float32)
    return (0.05 * white / (np.abs(white).max() + 1e-9)).astype(np.float32)


def recording(minutes: float, rng: random.Random) -> tuple[np.ndarray, str, float]:
    """Samples, the reference text and the seconds of speech in them."""
    from speech_assets.clips import clips

    speech = [
        (load16k(it.path), it.text)
        for it in build(DEFAULT_DIR, 40)
        if it.language == "en" and it.group == "prompt"
    ]
    speech += [(c.samples, c.text) for c in clips()]
    music = [load16k(p) for p in sorted((DEFAULT_DIR / "x/usr/share/asterisk/moh").glob("*.wav"))]
    parts, texts, spoken, total = [], [], 0.0, 0.0
    while total < minutes * 60:
        for _ in range(rng.randint(1, 4)):
            samples, text = rng.choice(speech)
            parts += [samples, np.zeros(int(0.6 * RATE), np.float32)]
            texts.append(text)
            spoken += len(samples) / RATE
        parts.append(filler(rng.choice(["music", "music", "white", "pink", "silence"]), rng, music))
        total = sum(len(p) for p in parts) / RATE
    return np.concatenate(parts), " ".join(texts), spoken


def loops_in(text: str) -> tuple[int, int]:
    """(loops, words repeated beyond the first) in ``text``."""
    from handler.inference import loops

    found = loops.find(text.split())
    return len(found), sum((f.repeats - 1) * f.unit for f in found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench loops", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--recordings", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base or a folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "loops.json"))
    args = parser.parse_args(argv)
    before = describe()

    from faster_whisper import WhisperModel

    from bench.common.worker import cpu_worker
    from handler.pipeline.job import run_job
    from speech_assets.clips import wav_bytes, wer

    # recordings of many minutes, inline
    worker, folder = cpu_worker(args.model, args.threads, WHISPER_MAX_INLINE_BYTES=str(2**31))
    plain = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=args.threads)
    rng = random.Random(args.seed)
    rows: dict[str, dict[str, Any]] = {
        k: {"loops": 0, "repeated_words": 0, "wer": [], "seconds": 0.0, "warnings": 0}
        for k in ["plain", *CONFIGS]
    }
    hours = 0.0
    for _ in range(args.recordings):
        samples, reference, _spoken = recording(args.minutes, rng)
        hours += len(samples) / RATE / 3600
        t = time.perf_counter()
        segments, _ = plain.transcribe(samples, language="en")
        outputs: dict[str, tuple[str, float, list[str]]] = {
            "plain": (" ".join(s.text for s in segments), time.perf_counter() - t, [])
        }
        audio = base64.b64encode(wav_bytes(samples)).decode()
        for name, options in CONFIGS.items():
            t = time.perf_counter()
            out = run_job({"audio_base64": audio, "language": "en", **options}, worker)
            assert "error" not in out, out
            outputs[name] = (out["text"], time.perf_counter() - t, out.get("warnings", []))
        for name, (text, seconds, warnings) in outputs.items():
            n, repeated = loops_in(text)
            row = rows[name]
            row["loops"] += n
            row["repeated_words"] += repeated
            row["wer"].append(round(wer(reference, text), 4))
            row["seconds"] += seconds
            row["warnings"] += sum("repetition loop" in w for w in warnings)
    report = {
        "hours": round(hours, 3),
        "model": args.model,
        "rows": rows,
        "command": "python -m bench loops " + " ".join(argv or []),
    }
    stamp(report, before)
    print(f"{args.recordings} recordings, {hours * 60:.1f} minutes, {args.model}")
    print(
        "| configuration | loops per audio hour | repeated words per hour | loop warnings | WER |"
    )
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        cells = [
            name,
            f"{r['loops'] / hours:.1f}",
            f"{r['repeated_words'] / hours:.0f}",
            str(r["warnings"]),
            f"{np.mean(r['wer']):.1%}",
        ]
        print("| " + " | ".join(cells) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0
