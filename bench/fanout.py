"""One long recording split across workers: time to the result, worker seconds, seams.

    python -m bench fanout [--minutes 10] [--workers 2] [--pieces 1,2,4] [--model tiny.en]

Real worker processes under the local emulator (its queue and its workers, started warm
before the runs), the recording built from the real clips of speech_assets with pauses
(a reader, JFK, the LibriVox chapters, in turn). Each run submits the recording once, with
``split`` set to the number of pieces (1: not split), and reports: seconds from submit to
the whole result; the seconds the pieces' jobs ran, summed (what a GPU per piece bills for
the work), and the parent's; WER of the stitched transcript against the unsplit one, and
the words inserted and deleted against it (lost or doubled at the seams), both normalised
as the accuracy bench normalises English.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.machine import describe, line
from runpod_emulator import Emulator
from speech_assets.clips import long_clip, wav_bytes

ROOT = Path(__file__).resolve().parent.parent


def run(minutes: float, workers: int, pieces: list[int], model: str) -> dict[str, Any]:
    import jiwer

    from bench.accuracy import normalise

    clip = long_clip(minutes * 60)
    audio = base64.b64encode(wav_bytes(clip.samples)).decode()
    # The whole recording goes inline to keep the bench to one machine (a deployment sends
    # a URL): the emulator's 10-MB /run limit is raised for it. The pieces stay far under.
    em = Emulator(ping_interval_ms=1000, stop_grace_s=30.0,
                  run_payload_limit=64 * 1024 * 1024).start()  # fmt: skip
    rows = []
    try:
        env = {"WHISPER_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "RUNPOD_API_KEY": em.api_key,
               "WHISPER_MAX_CONCURRENCY": "2", "WHISPER_MODEL": model,
               "WHISPER_MAX_INLINE_BYTES": str(64 * 1024 * 1024)}  # fmt: skip
        ids = [em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
               for _ in range(workers)]  # fmt: skip
        for wid in ids:
            em.wait_worker(wid, {"idle", "busy"}, 180)
        unsplit = ""
        for n in pieces:
            job: dict[str, Any] = {"audio_base64": audio, "output": ["text"]}
            if n > 1:
                job["split"] = n
            t = time.perf_counter()
            parent = em.submit(job)
            status = em.wait_job(parent, 3600)
            wall = time.perf_counter() - t
            if status["status"] != "COMPLETED":
                raise RuntimeError(f"{n} pieces: {status}")
            out = status["output"]
            with em.state.cond:
                record = em.state.jobs[parent]
                own = (record.finished_at or 0) - (record.taken_at or 0)
                kids = [em.state.jobs[p["job_id"]] for p in out.get("pieces") or []]
                piece_s = sum((k.finished_at or 0) - (k.taken_at or 0) for k in kids)
            text = normalise(out["text"], "en")
            if n == 1:
                unsplit = text
            m = jiwer.process_words(unsplit, text)
            reference = round(jiwer.wer(normalise(clip.text, "en"), text), 4)
            rows.append({"pieces": n, "wall_s": round(wall, 1), "parent_s": round(own, 1),
                         "pieces_s": round(piece_s, 1), "wer_vs_unsplit": round(m.wer, 4),
                         "inserted": m.insertions, "deleted": m.deletions,
                         "wer_vs_reference": reference})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        em.stop()
    return {"minutes": minutes, "workers": workers, "model": model, "rows": rows}


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['minutes']:g} min of speech, {report['workers']} warm workers, {report['model']}",
        "| pieces | to the result, s | pieces' jobs, s (sum) | the parent job, s "
        "| WER vs unsplit | words inserted / deleted vs unsplit | WER vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        work = r["pieces_s"] if r["pieces"] > 1 else r["parent_s"]
        lines.append(f"| {r['pieces']} | {r['wall_s']} | {work} | {r['parent_s']} | "
                     f"{r['wer_vs_unsplit']:.4f} | {r['inserted']} / {r['deleted']} | "
                     f"{r['wer_vs_reference']:.4f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fanout", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pieces", default="1,2,4")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--out", type=Path, default=Path("bench/out/fanout.json"))
    args = parser.parse_args(argv)
    pieces = [int(x) for x in args.pieces.split(",")]
    if pieces[0] != 1:
        pieces = [1, *pieces]
    machine = describe()
    report = run(args.minutes, args.workers, pieces, args.model)
    report["machine"] = machine
    print(line(machine))
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
