"""One long recording split across workers: time to the result, billed worker seconds, seams.

    python -m bench fanout [--minutes 20,60] [--pieces 1,2,4,8] [--starts cold,warm]
                           [--model tiny.en] [--device cpu] [--out FILE]

Real worker processes under the local emulator's queue, brought by the bench's autoscaler
(bench/cost/autoscaler.py: RunPod's flex rules, max workers = the number of pieces, idle timeout
5 s, queue delay 4 s). Each run has an endpoint of its own:

- ``cold``: no worker at the start (scale to zero); the parent job starts the first one and
  its pieces the rest, so the time to the result includes the cold starts;
- ``warm``: as many workers as pieces already up (active workers);
- ``serial``: one warm worker and no other (max workers 1): the pieces run one after
  another beside the waiting parent, so their job seconds summed against the unsplit job's
  are what splitting adds to the work itself, with no other process on the cores: the
  figure a GPU per piece keeps (its cold start and idle timeout come on top).

Each run submits the recording once with ``split`` set to the number of pieces (1: not
split) and reports: seconds from submit to the whole result; billed worker seconds (cold:
every worker's lifetime from its start to its exit, cold start and idle timeout included,
as a flex endpoint bills; warm: the seconds each worker held a job, as the busy share of
active workers); the pieces' job seconds summed; WER of the stitched transcript against the
unsplit one and the words inserted and deleted against it (lost or doubled at the seams),
and WER against the reference text, normalised as the accuracy bench normalises English.
The recording is built from the real clips of speech_assets with pauses (a reader, JFK,
the LibriVox chapters, in turn). Worker processes share the machine: on one CPU host the
pieces cannot run faster side by side than the cores allow, so the time to the result on a
CPU says what splitting costs, not what a GPU per worker gains.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common.machine import describe, line
from bench.cost.autoscaler import Autoscaler, ScalerConfig
from runpod_emulator import Emulator
from speech_assets.clips import long_clip, wav_bytes

ROOT = Path(__file__).resolve().parents[2]
IDLE_TIMEOUT_S = 5.0


def one_run(
    audio: str, n: int, start: str, model: str, device: str, s3: dict[str, str]
) -> dict[str, Any]:
    """The recording on an endpoint of its own, split in n; the figures of the run."""
    # The whole recording goes inline to keep the bench to one machine (a deployment sends
    # a URL): the emulator's 10-MB /run limit is raised for it. The pieces stay under it.
    em = Emulator(
        ping_interval_ms=1000, stop_grace_s=30.0, run_payload_limit=256 * 1024 * 1024
    ).start()
    env = {
        "WHISPER_DEVICE": device,
        "HF_HUB_OFFLINE": "1",
        "RUNPOD_API_KEY": em.api_key,
        "WHISPER_MAX_CONCURRENCY": "2",
        "WHISPER_MODEL": model,
        "WHISPER_MAX_INLINE_BYTES": str(256 * 1024 * 1024),
        # The platform's path is measured: no piece taken back by the parent's worker.
        "WHISPER_PIECE_QUEUE_WAIT_S": "3600",
        **s3,
    }
    active = {"warm": n, "serial": 1}.get(start, 0)
    config = ScalerConfig(
        active_workers=active,
        max_workers=1 if start == "serial" else n,
        idle_timeout_s=IDLE_TIMEOUT_S,
        env=env,
        command=[sys.executable, "-m", "handler"],
    )
    scaler = Autoscaler(em, config).start()
    try:
        if active:
            scaler.wait_ready("active", 600)
        job: dict[str, Any] = {"audio_base64": audio, "output": ["text"]}
        if n > 1:
            job["split"] = n
        t = time.time()
        parent = em.submit(job)
        status = em.wait_job(parent, 3600)
        wall = time.time() - t
        if status["status"] != "COMPLETED":
            raise RuntimeError(f"{n} pieces, {start}: {status}")
        if start == "cold":
            scaler.wait_scaled_down(600)
        out = status["output"]
        with em.state.cond:
            jobs = [j for j in em.state.jobs.values() if j.taken_at is not None]
            kids = [em.state.jobs[p["job_id"]] for p in out.get("pieces") or []]
            piece_s = sum((k.finished_at or 0) - (k.taken_at or 0) for k in kids)
            held = _held_seconds(jobs, t)
        lifetimes = [
            (r["stopped_at"] or time.time()) - r["started_at"] for r in scaler.worker_records()
        ]
        billed = sum(lifetimes) if start == "cold" else held
        return {
            "pieces": n,
            "start": start,
            "wall_s": round(wall, 1),
            "billed_worker_s": round(billed, 1),
            "held_s": round(held, 1),
            "pieces_s": round(piece_s, 1),
            "workers": len(lifetimes),
            "split_s": round(float((out.get("timings") or {}).get("split") or 0), 2),
            "text": out["text"],
        }
    finally:
        scaler.stop()
        em.stop()


def _held_seconds(jobs: list[Any], since: float) -> float:
    """Seconds each worker held at least one job, summed over workers (overlapping jobs on
    one worker count once)."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for j in jobs:
        end = j.finished_at or time.time()
        by_worker.setdefault(j.worker_id or "", []).append((max(j.taken_at, since), end))
    total = 0.0
    for spans in by_worker.values():
        spans.sort()
        a, b = spans[0]
        for c, d in spans[1:]:
            if c > b:
                total += b - a
                a, b = c, d
            else:
                b = max(b, d)
        total += b - a
    return total


def run(
    minutes: float, pieces: list[int], starts: list[str], model: str, device: str
) -> dict[str, Any]:

    from bench.common.text import normalise

    clip = long_clip(minutes * 60)
    audio = base64.b64encode(wav_bytes(clip.samples)).decode()
    reference = normalise(clip.text, "en")
    rows = []
    with piece_bucket() as s3:
        for start in starts:
            unsplit = ""
            for n in pieces:
                rows.append(
                    _scored(one_run(audio, n, start, model, device, s3), unsplit, reference)
                )
                if n == 1:
                    unsplit = rows[-1].pop("normalised")
                rows[-1].pop("normalised", None)
                print(json.dumps({"minutes": minutes, **rows[-1]}), flush=True)
    return {"minutes": minutes, "model": model, "device": device, "rows": rows}


def _scored(row: dict[str, Any], unsplit: str, reference: str) -> dict[str, Any]:
    import jiwer

    from bench.common.text import normalise

    text = normalise(row.pop("text"), "en")
    m = jiwer.process_words(unsplit or text, text)
    row.update(
        {
            "wer_vs_unsplit": round(m.wer, 4),
            "inserted": m.insertions,
            "deleted": m.deletions,
            "wer_vs_reference": round(jiwer.wer(reference, text), 4),
            "normalised": text,
        }
    )
    return row


@contextlib.contextmanager
def piece_bucket() -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1 as the endpoint's piece bucket (pieces over 9 MB of
    base64, about 7 minutes, go through it as they would through the user's bucket); the
    workers' environment for it."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per S3 request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        keys = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="pieces")
        yield {
            **keys,
            "WHISPER_S3_ENDPOINT_URL": url,
            "WHISPER_S3_ALLOWED_BUCKETS": "pieces",
            "WHISPER_PIECE_BUCKET": "pieces",
        }
    finally:
        server.stop()


def table(reports: list[dict[str, Any]]) -> str:
    lines = [
        "| audio | workers at the start | pieces | to the result, s | billed worker s "
        "(x unsplit) | pieces' jobs, s | cut + encode, s | WER vs unsplit "
        "| seam words inserted / deleted | WER vs reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        base = {r["start"]: r["billed_worker_s"] for r in report["rows"] if r["pieces"] == 1}
        for r in report["rows"]:
            one = base.get(r["start"]) or 0.0
            ratio = f" ({r['billed_worker_s'] / one:.2f}x)" if one else ""
            at_start = {"cold": "0 (cold)", "serial": "1 (max 1)"}.get(
                r["start"], f"{r['pieces']} (warm)"
            )
            lines.append(
                f"| {report['minutes']:g} min | {at_start} | {r['pieces']} | {r['wall_s']} | "
                f"{r['billed_worker_s']}{ratio} | {r['pieces_s'] or '-'} | "
                f"{r.get('split_s') or '-'} | "
                f"{r['wer_vs_unsplit']:.4f} | {r['inserted']} / {r['deleted']} | "
                f"{r['wer_vs_reference']:.4f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fanout", description=__doc__)
    parser.add_argument("--minutes", default="20,60")
    parser.add_argument("--pieces", default="1,2,4,8")
    parser.add_argument("--starts", default="cold,warm")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("bench/out/fanout.json"))
    args = parser.parse_args(argv)
    pieces = [int(x) for x in args.pieces.split(",")]
    if pieces[0] != 1:
        pieces = [1, *pieces]
    starts = [s for s in args.starts.split(",") if s in ("cold", "warm", "serial")]
    machine = describe()
    reports = [
        run(float(m), pieces, starts, args.model, args.device) for m in args.minutes.split(",")
    ]
    print(line(machine))
    print(table(reports))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "reports": reports}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
