"""Word times against human-made word boundaries: Whisper's own, the forced aligner's, and
plain faster-whisper's, in one run; what the alignment pass costs.

    python -m bench word-times [--models tiny.en,base] [--long-minutes 10] [--burst 6]

- **Boundaries**: the human-labelled words of tests/data/words (praatio's two example
  sentences, hand-made TextGrids: tests/data/SOURCES.md), each clip with 0.5 s of
  silence before and after, through the worker's ``run_job`` with ``word_alignment``
  ``whisper`` and ``forced``, and plain faster-whisper (``word_timestamps=True``) beside
  them: mean and median start and end error, the share within 50/100/200 ms, precision
  and recall at a 200 ms collar (a word counts when its text matches and both ends are
  within 200 ms). Eight words: the direction and size of the error, not a population.
- **Text**: the JFK and LibriVox clips: WER of each method, and whether the text and the
  words are identical with and without alignment.
- **Cost**: ``--long-minutes`` of real speech decoded once; then the pass alone on its
  words (CPU seconds per audio second, by the thread's CPU clock) and, on the same words
  tiled to two hours, the peak growth of the process's memory while it aligns.
- **Burst**: ``--burst`` jobs of about a minute each sent at once through the engine,
  with and without the pass: audio seconds per wall second.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.machine import describe, stamp

ROOT = Path(__file__).resolve().parents[2]
WORDS = ROOT / "tests" / "data" / "words"
LEAD_S = 0.5
COLLAR_S = 0.2


def human_clips() -> list[tuple[str, np.ndarray, list[tuple[str, float, float]]]]:
    from speech_assets.clips import RATE, read_wav

    rows = [ln.split("\t") for ln in (WORDS / "boundaries.tsv").read_text().splitlines()[1:]]
    out = []
    for name in dict.fromkeys(r[0] for r in rows):
        pad = np.zeros(int(LEAD_S * RATE), np.float32)
        samples = np.concatenate([pad, read_wav(WORDS / f"{name}.wav"), pad])
        ref = [(w, float(s) + LEAD_S, float(e) + LEAD_S) for n, w, s, e in rows if n == name]
        out.append((name, samples, ref))
    return out


def bare(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "'")


def boundary_stats(pairs: list[tuple[dict[str, Any], tuple[str, float, float]]]) -> dict:
    """Errors of hypothesis words against reference words matched in order by text."""
    starts = [abs(h["start"] - r[1]) for h, r in pairs]
    ends = [abs(h["end"] - r[2]) for h, r in pairs]
    signed = [h["start"] - r[1] for h, r in pairs]
    hit = sum(
        1
        for h, r in pairs
        if abs(h["start"] - r[1]) <= COLLAR_S and abs(h["end"] - r[2]) <= COLLAR_S
    )
    return {
        "words": len(pairs),
        "start_mean_ms": round(1000 * statistics.mean(starts), 1),
        "start_median_ms": round(1000 * statistics.median(starts), 1),
        "start_bias_ms": round(1000 * statistics.mean(signed), 1),
        "end_mean_ms": round(1000 * statistics.mean(ends), 1),
        "end_median_ms": round(1000 * statistics.median(ends), 1),
        **{
            f"start_within_{ms}": round(sum(e <= ms / 1000 for e in starts) / len(starts), 3)
            for ms in (50, 100, 200)
        },
        "collar_hits": hit,
    }


def matched(hyp: list[dict[str, Any]], ref: list[tuple[str, float, float]]) -> list[tuple]:
    """Pairs of (hypothesis word, reference word) aligned by text in order."""
    import difflib

    sm = difflib.SequenceMatcher(None, [bare(h["word"]) for h in hyp], [r[0] for r in ref])
    return [(hyp[a + k], ref[b + k]) for a, b, n in sm.get_matching_blocks() for k in range(n)]


def plain_words(model: Any, samples: np.ndarray) -> list[dict[str, Any]]:
    segments, _ = model.transcribe(samples, word_timestamps=True, language="en")
    return [{"word": w.word, "start": w.start, "end": w.end} for s in segments for w in s.words]


def job(samples: np.ndarray, how: str) -> dict[str, Any]:
    import base64

    from speech_assets.clips import wav_bytes

    audio = base64.b64encode(wav_bytes(samples)).decode()
    return {
        "audio_base64": audio,
        "word_timestamps": True,
        "word_alignment": how,
        "language": "en",
        "output": ["text", "words"],
    }


def boundaries(worker: Any, plain: Any) -> dict[str, Any]:
    from handler.pipeline.job import run_job

    pairs: dict[str, list] = {"plain faster-whisper": [], "whisper": [], "forced": []}
    refs = 0
    for _name, samples, ref in human_clips():
        refs += len(ref)
        pairs["plain faster-whisper"] += matched(plain_words(plain, samples), ref)
        for how in ("whisper", "forced"):
            pairs[how] += matched(run_job(job(samples, how), worker)["words"], ref)
    out = {}
    for how, got in pairs.items():
        stats = boundary_stats(got)
        stats["precision_200ms"] = round(stats["collar_hits"] / max(1, len(got)), 3)
        stats["recall_200ms"] = round(stats["collar_hits"] / refs, 3)
        out[how] = stats
    return out


def text_identity(worker: Any, plain: Any) -> dict[str, Any]:
    from handler.pipeline.job import run_job
    from speech_assets.clips import clips, wer

    hyps: dict[str, list[str]] = {"plain faster-whisper": [], "whisper": [], "forced": []}
    identical = True
    refs = []
    for clip in clips():
        refs.append(clip.text)
        hyps["plain faster-whisper"].append(
            " ".join(w["word"] for w in plain_words(plain, clip.samples))
        )
        got = {how: run_job(job(clip.samples, how), worker) for how in ("whisper", "forced")}
        for how, out in got.items():
            hyps[how].append(out["text"])
        identical &= got["whisper"]["text"] == got["forced"]["text"] and [
            w["word"] for w in got["whisper"]["words"]
        ] == [w["word"] for w in got["forced"]["words"]]
    joined = " ".join(refs)
    return {
        "wer": {how: round(wer(joined, " ".join(h)), 4) for how, h in hyps.items()},
        "text_and_words_identical": identical,
        "clips": len(refs),
    }


def pass_cost(worker: Any, minutes: float) -> dict[str, Any]:
    """The pass alone on a long recording's words; memory on the same words tiled to 2 h."""
    from handler.guard import Guard
    from handler.inference import transcribe
    from speech_assets.clips import RATE, long_clip

    clip = long_clip(minutes * 60)
    instance_model = worker.pool.get(None)
    with worker.pool.acquire(instance_model, None) as (instance, _):
        tr = transcribe.run(
            instance, clip.samples, {"word_timestamps": True, "language": "en", "vad_filter": True}
        )
    aligner = worker.aligner()
    aligner.warm()
    segs = copy.deepcopy(tr.segments)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    outcome = aligner.align(segs, clip.samples, ["en"] * len(segs), Guard())
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    seconds = clip.seconds
    reps = max(1, int(np.ceil(7200 / seconds)))
    long_samples = np.tile(clip.samples, reps)
    tiled = []
    for r in range(reps):
        for s in copy.deepcopy(tr.segments):
            s["start"] += r * seconds
            s["end"] += r * seconds
            for w in s["words"] or []:
                w["start"] += r * seconds
                w["end"] += r * seconds
            tiled.append(s)
    peak = peak_rss_growth(lambda: aligner.align(tiled, long_samples, ["en"] * len(tiled), Guard()))
    return {
        "audio_s": round(seconds, 1),
        "words": outcome.aligned + outcome.kept,
        "aligned": outcome.aligned,
        "kept_whisper": outcome.kept,
        "cpu_s_per_audio_s": round(cpu / seconds, 4),
        "wall_s_per_audio_s": round(wall / seconds, 4),
        "two_hours": {"audio_s": round(len(long_samples) / RATE), "peak_rss_growth_mb": peak},
    }


def peak_rss_growth(run: Any) -> float:
    import psutil

    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], proc.memory_info().rss)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        run()
    finally:
        done.set()
        t.join()
    return round((max(peak[0], proc.memory_info().rss) - base) / 2**20, 1)


def burst(worker: Any, jobs: int) -> dict[str, Any]:
    from handler.pipeline.job import run_job
    from speech_assets.clips import long_clip

    clip = long_clip(60)
    out = {}
    for how in ("whisper", "forced"):
        body = {**job(clip.samples, how), "batch_size": 8}
        t = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(run_job, [body] * jobs, [worker] * jobs))
        wall = time.perf_counter() - t
        assert all("error" not in r for r in results), results[0]
        out[how] = {
            "jobs": jobs,
            "audio_s_per_wall_s": round(jobs * clip.seconds / wall, 2),
            "wall_s": round(wall, 1),
        }
    return out


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from faster_whisper import WhisperModel

    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets.models import model_dir

    folder = model_dir(name, Path(args.models_dir))
    env = {
        "WHISPER_DEVICE": "cpu",
        "WHISPER_MODEL": str(folder),
        "WHISPER_CPU_THREADS": str(args.threads),
    }
    worker = start_worker(load_settings(env))
    plain = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=args.threads)
    report: dict[str, Any] = {
        "boundaries": boundaries(worker, plain),
        "text": text_identity(worker, plain),
    }
    if args.long_minutes > 0:
        report["cost"] = pass_cost(worker, args.long_minutes)
    if args.burst > 0:
        report["burst"] = burst(worker, args.burst)
    return report


def table(report: dict[str, Any]) -> str:
    head = (
        "| model | method | start mean / median (ms) | bias (ms) | end mean (ms) "
        "| within 50 / 100 / 200 ms | P / R @200 ms | WER |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for model, r in report["models"].items():
        for how, b in r["boundaries"].items():
            cells = [
                model,
                how,
                f"{b['start_mean_ms']:.0f} / {b['start_median_ms']:.0f}",
                f"{b['start_bias_ms']:+.0f}",
                f"{b['end_mean_ms']:.0f}",
                " / ".join(f"{b[f'start_within_{ms}']:.0%}" for ms in (50, 100, 200)),
                f"{b['precision_200ms']:.0%} / {b['recall_200ms']:.0%}",
                f"{r['text']['wer'][how]:.1%}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench word-times", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--models", default="tiny.en,base", help="comma separated: tiny.en, base or folders"
    )
    parser.add_argument(
        "--models-dir",
        default=str(ROOT / "bench" / "out" / "models"),
        help="where base is assembled",
    )
    parser.add_argument(
        "--long-minutes", type=float, default=10.0, help="the cost run's recording (0: skip)"
    )
    parser.add_argument("--burst", type=int, default=6, help="jobs sent at once (0: skip)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "word_times.json"))
    args = parser.parse_args(argv)
    before = describe()
    report: dict[str, Any] = {
        "models": {},
        "command": "python -m bench word-times " + " ".join(argv or []),
    }
    for i, name in enumerate(args.models.split(",")):
        if i:  # the cost and the burst once, on the first model
            args.long_minutes, args.burst = 0, 0
        report["models"][name] = run_model(name, args)
    stamp(report, before)
    print(table(report))
    for name, r in report["models"].items():
        for key in ("text", "cost", "burst"):
            if key in r:
                print(f"{name} {key}: {json.dumps(r[key])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0
