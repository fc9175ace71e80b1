"""HTTP mode against queue mode, one worker each, the same clips and concurrent clients.

``python -m bench http``: starts a real ``python -m handler serve`` and, separately, a real
queue worker under the runpod SDK against the local emulator; N client threads send the
real clips (JFK and the LibriVox readings) for a fixed count of requests per mode. Reports
p50/p95/p99 latency (client send to answer), requests/s and WER per mode, as one table and
one JSON. Traffic goes to 127.0.0.1 only; the run is bounded by ``--requests``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from bench.common.machine import describe, stamp
from bench.common.report import percentile
from bench.common.servers import free_port, start_until_healthy
from runpod_emulator import Emulator
from speech_assets.clips import Clip, clips, wer

ROOT = Path(__file__).resolve().parents[2]


def drive(send: Callable[[Clip], str], pool: list[Clip], n: int, clients: int) -> dict[str, Any]:
    """Send ``n`` requests from ``clients`` threads; latency, throughput, WER, failures."""
    latencies: list[float] = []
    errors: list[str] = []
    scores: list[float] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def client() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            clip = pool[i % len(pool)]
            t = time.perf_counter()
            try:
                text = send(clip)
            except Exception as exc:  # counted and reported, never hidden
                with lock:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                continue
            dt = time.perf_counter() - t
            with lock:
                latencies.append(dt)
                scores.append(wer(clip.text, text))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "requests": n,
        "ok": len(latencies),
        "failed": len(errors),
        "errors": errors[:5],
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(latencies) / wall, 3),
        "p50_s": round(percentile(latencies, 50), 3),
        "p95_s": round(percentile(latencies, 95), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "mean_wer": round(statistics.mean(scores), 4) if scores else None,
    }


def run_http(env: dict[str, str], pool: list[Clip], n: int, clients: int) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    full = {**os.environ, **env, "PORT": str(port), "HOST": "127.0.0.1"}
    argv = [sys.executable, "-m", "handler", "serve"]
    with tempfile.TemporaryDirectory() as logs:
        proc = start_until_healthy(
            argv, full, Path(logs) / "server.log", url + "/ping", cwd=ROOT, wait_s=300
        )
        try:
            session = threading.local()

            def send(clip: Clip) -> str:
                s = getattr(session, "s", None) or requests.Session()
                session.s = s
                r = s.post(
                    url + "/v1/audio/transcriptions",
                    files={"file": ("clip.wav", clip.wav_bytes(), "audio/wav")},
                    data={"model": "whisper-1"},
                    timeout=600,
                )
                r.raise_for_status()
                return str(r.json()["text"])

            send(pool[0])  # warm
            return drive(send, pool, n, clients)
        finally:
            proc.terminate()
            proc.wait(60)


def run_queue(env: dict[str, str], pool: list[Clip], n: int, clients: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as logs:
        em = Emulator(log_dir=logs).start()
        try:
            wid = em.start_worker(env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT))
            em.wait_worker(wid, {"idle", "busy"}, 300)

            def send(clip: Clip) -> str:
                job = {
                    "audio_base64": base64.b64encode(clip.wav_bytes()).decode(),
                    "output": ["text"],
                }
                final = em.wait_job(em.submit(job), 600)
                if final.get("status") != "COMPLETED":
                    raise RuntimeError(f"job ended {final.get('status')}")
                return str(final["output"]["text"])

            send(pool[0])  # warm
            return drive(send, pool, n, clients)
        finally:
            em.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench http", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=24, help="requests per mode")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--concurrency", type=int, default=2, help="WHISPER_MAX_CONCURRENCY")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "http_vs_queue.json"))
    args = parser.parse_args(argv)
    env = {
        "WHISPER_DEVICE": "cpu",
        "WHISPER_MAX_CONCURRENCY": str(args.concurrency),
        "HF_HUB_OFFLINE": "1",
    }
    pool = clips()
    machine = describe()
    report = {
        "clients": args.clients,
        "concurrency": args.concurrency,
        "clips": [c.name for c in pool],
        "queue": run_queue(env, pool, args.requests, args.clients),
        "http": run_http(env, pool, args.requests, args.clients),
    }
    q, h = report["queue"], report["http"]
    print(
        f"{args.requests} requests per mode, {args.clients} clients, concurrency {args.concurrency}"
    )
    head = ("mode", "ok", "failed", "req/s", "p50 s", "p95 s", "p99 s", "WER")
    print("{:6} {:>4} {:>6} {:>7} {:>7} {:>7} {:>7} {:>6}".format(*head))
    for name, r in (("queue", q), ("http", h)):
        row = (
            name,
            r["ok"],
            r["failed"],
            r["requests_per_s"],
            r["p50_s"],
            r["p95_s"],
            r["p99_s"],
            r["mean_wer"] or 0.0,
        )
        print("{:6} {:>4} {:>6} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>6.3f}".format(*row))
    if q["requests_per_s"]:
        print(
            f"http/queue: {h['requests_per_s'] / q['requests_per_s']:.2f}x requests/s, "
            f"p50 {h['p50_s'] / q['p50_s']:.2f}x"
        )
    stamp(report, machine)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 1 if q["failed"] or h["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
