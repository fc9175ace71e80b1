"""``python -m bench broker-keda``: KEDA's rules run for real on this machine, against the
replay of ``python -m bench broker-cost``.

A real Redis, a real gateway, and consumers (real processes with the real model) that a
scaler starts and stops by KEDA's rules for the Redis list scaler: every ``--polling-s``
it reads the lengths of the queue and of the in-flight list (the two triggers of
deploy/kubernetes/broker/scaledobject.yaml), wants ``ceil(sum / --list-length)``
consumers (at most ``--max-workers``), activates from zero at its next poll, and scales
to zero after ``--cooldown-s`` with both lists empty (SIGTERM: a consumer finishes the
jobs in hand). Short real-speech jobs arrive as a Poisson process at ``--rate`` for
``--minutes``. Billed: each consumer from its process start to its exit.

The same arrivals then go through the replay (bench/broker/scaling.py) with this run's
own timers, so the model's figures are checked against a real run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from typing import Any

from bench.broker.scaling import Timers, keda_rules, poisson_arrivals, replay
from runpod_emulator.broker_stack import ConsumerProc, GatewayProc, RedisServer, all_ended
from speech_assets.clips import short_jobs


class KedaScaler:
    """KEDA's Redis list scaler's rules over real consumer processes."""

    def __init__(self, rds: RedisServer, args: argparse.Namespace) -> None:
        import redis

        self.rds, self.polling_s, self.cooldown_s = rds, args.polling_s, args.cooldown_s
        self.list_length, self.max_workers = args.list_length, args.max_workers
        self.cold: list[float] = []
        self.r = redis.Redis.from_url(rds.url, decode_responses=True)
        self.alive: list[tuple[ConsumerProc, float]] = []
        self.billed: list[tuple[float, float]] = []
        self.last_active = -math.inf
        self.stop = threading.Event()

    def backlog(self) -> int:
        from handler.faces.broker.queue import QUEUE
        from handler.faces.broker.store import INFLIGHT

        return int(self.r.llen(QUEUE)) + int(self.r.llen(INFLIGHT))

    def poll(self) -> None:
        """Up at once to what the lists ask (KEDA activates 0 -> 1, the HPA goes on);
        down only to zero, after the cooldown (the HPA's own scale-down waits 5 minutes
        by default, longer than any run here)."""
        now = time.monotonic()
        backlog = self.backlog()
        if backlog:
            self.last_active = now
        want = min(self.max_workers, math.ceil(backlog / self.list_length))
        while len(self.alive) < want:
            started = time.monotonic()
            self.alive.append((ConsumerProc(self.rds.url), started))
            self.cold.append(time.monotonic() - started)
        if want == 0 and self.alive and now - self.last_active >= self.cooldown_s:
            self.close()

    def run(self) -> None:
        while not self.stop.wait(self.polling_s):
            self.poll()

    def close(self) -> None:
        for proc, started in self.alive:
            proc.stop()
            self.billed.append((started, time.monotonic()))
        self.alive = []


def measure(args: argparse.Namespace) -> dict[str, Any]:
    arrivals = poisson_arrivals(args.rate, args.minutes, args.seed)
    pool = short_jobs()
    rds = RedisServer()
    gateway = GatewayProc(rds.url)
    scaler = KedaScaler(rds, args)
    thread = threading.Thread(target=scaler.run, daemon=True)
    t0 = time.monotonic()
    thread.start()
    try:
        ids = []
        for n, at in enumerate(arrivals):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            ids.append(gateway.run({"audio_base64": pool[n % len(pool)][0]}))
        done = all_ended(gateway, ids, 1800)
        while scaler.alive:  # until it scales to zero by its own rules
            time.sleep(1)
        horizon = time.monotonic() - t0
    finally:
        scaler.stop.set()
        thread.join(timeout=60)
        scaler.close()
        gateway.stop()
        rds.close()
    from speech_assets.clips import clips

    seconds = {c.text: len(c.samples) / 16000 for c in clips()}
    audio = sum(seconds[pool[n % len(pool)][1]] for n in range(len(ids)))
    billed = sum(b - a for a, b in scaler.billed)
    waits = sorted(float(s.get("delayTime", 0)) / 1000 for s in done.values())
    execution = [float(s["executionTime"]) / 1000 for s in done.values()]
    measured = {
        "jobs": len(ids),
        "completed": sum(s["status"] == "COMPLETED" for s in done.values()),
        "billed_gpu_s": round(billed, 1),
        "gpu_s_per_audio_s": round(billed / audio, 4),
        "starts": len(scaler.billed),
        "wait_p50_s": round(waits[len(waits) // 2], 1),
        "wait_p95_s": round(waits[int(0.95 * (len(waits) - 1))], 1),
    }
    timers = Timers(
        cold_start_s=sum(scaler.cold) / max(1, len(scaler.cold)),
        job_s=sum(execution) / len(execution),
        per_worker=16,
        audio_s_per_job=audio / len(ids),
    )
    keda = keda_rules(args)
    return {
        "measured": measured,
        "replayed": replay(arrivals, timers, keda, horizon),
        "settings": keda,
        "timers": timers.__dict__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench broker-keda", description=__doc__)
    p.add_argument("--rate", type=float, default=0.1, help="jobs per second (default 0.1)")
    p.add_argument("--minutes", type=float, default=5, help="arrivals over this long")
    p.add_argument("--polling-s", type=float, default=5, help="KEDA pollingInterval")
    p.add_argument("--cooldown-s", type=float, default=30, help="KEDA cooldownPeriod")
    p.add_argument("--list-length", type=int, default=16, help="KEDA listLength target")
    p.add_argument("--max-workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    print(json.dumps(measure(p.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
