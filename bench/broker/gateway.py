"""``python -m bench broker``: what the gateway and the queue add, on a real Redis with
real consumers (tiny.en on this machine's CPU unless WHISPER_MODEL says otherwise).

- added time per job: jobs sent one at a time to an idle consumer; ``delayTime`` (the
  record's creation in the gateway to the consumer's start: Celery's publish, Redis's
  BRPOP, the start script) at p50/p95/p99, and the client's whole round trip less the
  job's ``executionTime`` (adds the client's polling, 50 ms here);
- throughput: a burst of short real-speech jobs to 1 consumer, then to 2 (on one machine
  they share its cores: on a GPU cluster each has its own), then to the HTTP server's own
  engine with no broker, in jobs and audio seconds per second; and each consumer's cold
  start (process start to taking jobs).

Writes ``bench/out/broker.json``, the input of ``python -m bench broker-cost``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.report import percentile
from runpod_emulator.broker_stack import ConsumerProc, GatewayProc, RedisServer, all_ended
from speech_assets.clips import short_jobs

OUT = Path(__file__).resolve().parents[1] / "out" / "broker.json"


def _pct(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q), 1) for q in (50, 95, 99)}


def added_time(gateway: GatewayProc, pool: list[tuple[str, str]], n: int) -> dict[str, Any]:
    delays, overheads = [], []
    for i in range(n):
        t = time.monotonic()
        job_id = gateway.run({"audio_base64": pool[i % len(pool)][0]})
        while (st := gateway.status(job_id))["status"] not in ("COMPLETED", "FAILED"):
            time.sleep(0.05)
        wall_ms = (time.monotonic() - t) * 1000
        delays.append(float(st["delayTime"]))
        overheads.append(wall_ms - float(st["executionTime"]))
    return {"jobs": n, "delay_ms": _pct(delays), "round_trip_less_execution_ms": _pct(overheads)}


def burst(gateway: GatewayProc, pool: list[tuple[str, str]], n: int) -> dict[str, Any]:
    from speech_assets.clips import clips

    seconds = {c.text: len(c.samples) / 16000 for c in clips()}
    t = time.monotonic()
    ids = [gateway.run({"audio_base64": pool[i % len(pool)][0]}) for i in range(n)]
    done = all_ended(gateway, ids, 1800)
    wall = time.monotonic() - t
    audio = sum(seconds[pool[i % len(pool)][1]] for i in range(n))
    execution = [float(s["executionTime"]) / 1000 for s in done.values()]
    return {
        "jobs": n,
        "completed": sum(s["status"] == "COMPLETED" for s in done.values()),
        "wall_s": round(wall, 2),
        "jobs_per_s": round(n / wall, 2),
        "audio_s_per_s": round(audio / wall, 2),
        "mean_job_s": round(sum(execution) / n, 3),
        "audio_s_per_job": round(audio / n, 2),
    }


def run(jobs: int, latency_jobs: int) -> dict[str, Any]:
    rds = RedisServer()
    gateway = GatewayProc(rds.url)
    consumers: list[ConsumerProc] = []
    pool = short_jobs()
    try:
        t = time.monotonic()
        consumers.append(ConsumerProc(rds.url))
        cold = [time.monotonic() - t]
        figures: dict[str, Any] = {"added_time": added_time(gateway, pool, latency_jobs)}
        figures["one_consumer"] = burst(gateway, pool, jobs)
        t = time.monotonic()
        consumers.append(ConsumerProc(rds.url))
        cold.append(time.monotonic() - t)
        figures["two_consumers"] = burst(gateway, pool, jobs)
        figures["consumer_cold_start_s"] = [round(c, 2) for c in cold]
        figures["per_worker"] = consumers[0].at_a_time()
    finally:
        gateway.stop()
        for c in consumers:
            c.stop()
        rds.close()
    embedded = GatewayProc(None)  # the same burst on the HTTP server's own engine
    try:
        figures["embedded_no_broker"] = burst(embedded, pool, jobs)
    finally:
        embedded.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench broker", description=__doc__)
    p.add_argument("--jobs", type=int, default=200, help="jobs per burst (default 200)")
    p.add_argument("--latency-jobs", type=int, default=200, help="jobs sent one at a time")
    p.add_argument("--out", default=str(OUT), help="where the figures go")
    args = p.parse_args(argv)
    from bench.common.machine import describe, stamp

    before = describe()
    figures = stamp(run(args.jobs, args.latency_jobs), before)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
