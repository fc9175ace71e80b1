"""``python -m bench broker-cost``: billed GPU seconds per audio second of the broker setup
scaled by KEDA, beside a RunPod flex endpoint, for the same arrivals.

A model, not a cluster run (none exists here): the measured timers come from
``python -m bench broker`` (bench/out/broker.json: a consumer's cold start, a job's time
in a consumer, jobs a consumer runs at once, the gateway's added delay); the scalers are
replayed second by second on Poisson arrivals:

- KEDA (its Redis list scaler on the queue and the in-flight list): every ``--polling-s``
  (``pollingInterval``, 30 s by default) it reads both lengths and scales up to
  ``ceil((queued + running) / --list-length)`` consumers (at most ``--max-workers``),
  from zero too; down only to 0, after ``--cooldown-s`` (``cooldownPeriod``, 300 s) with
  both empty (the HPA's own scale-down waits 5 minutes). A consumer is billed from its
  start (the cold start included) to its stop. ``python -m bench broker-keda`` runs the
  same rules on real consumers and prints this replay beside it.
- RunPod flex: a worker starts as soon as a job waits (another when the oldest has waited
  ``--queue-delay-s``), and stops after ``--idle-s`` (5 s) without a job; billed the same.

Prices are yours (``--rate`` per GPU second, none built in): the figures are seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.broker.gateway import OUT


@dataclass
class Timers:
    cold_start_s: float
    job_s: float
    """A job's time in a consumer (the measured mean at the measured concurrency)."""
    per_worker: int
    """Jobs a consumer runs at once."""
    audio_s_per_job: float
    added_s: float = 0.0


@dataclass
class Pod:
    start: float
    ready: float
    stop: float | None = None
    busy: list[float] = field(default_factory=list)
    """End times of the jobs it runs now."""
    last_job: float = 0.0


def _serve(pods: list[Pod], queue: list[float], now: float, t: Timers, waits: list[float]) -> None:
    for pod in pods:
        if pod.stop is not None or now < pod.ready:
            continue
        pod.busy = [e for e in pod.busy if e > now]
        while queue and len(pod.busy) < t.per_worker:
            waits.append(now - queue.pop(0) + t.added_s)
            pod.busy.append(now + t.job_s)
            pod.last_job = now + t.job_s


def replay(arrivals: list[float], t: Timers, scaler: dict[str, Any], horizon: float) -> dict:
    """Second by second; ``scaler["kind"]`` is ``keda`` or ``runpod``."""
    pods: list[Pod] = []
    queue: list[float] = []
    waits: list[float] = []
    pending = sorted(arrivals)
    last_busy = -math.inf
    step = 1.0
    now = 0.0
    while now < horizon or queue or any(p.busy and p.stop is None for p in pods):
        while pending and pending[0] <= now:
            queue.append(pending.pop(0))
        alive = [p for p in pods if p.stop is None]
        running = sum(len([e for e in p.busy if e > now]) for p in alive)
        # KEDA sees the lists only when it polls: a job served between polls is unseen.
        polled = scaler["kind"] != "keda" or int(now) % int(scaler["polling_s"]) == 0
        if (queue or running) and polled:
            last_busy = now
        if scaler["kind"] == "keda":
            _keda(pods, alive, len(queue), running, now, last_busy, t, scaler)
        else:
            _runpod(pods, alive, queue, now, t, scaler)
        _serve(pods, queue, now, t, waits)
        now += step
        if now > horizon * 10:
            break
    for p in pods:
        if p.stop is None:
            p.stop = now
    billed = sum((p.stop or now) - p.start for p in pods)
    audio = len(arrivals) * t.audio_s_per_job
    waits.sort()
    return {
        "billed_gpu_s": round(billed, 1),
        "gpu_s_per_audio_s": round(billed / audio, 4) if audio else None,
        "starts": len(pods),
        "wait_p50_s": round(waits[len(waits) // 2], 1) if waits else None,
        "wait_p95_s": round(waits[int(0.95 * (len(waits) - 1))], 1) if waits else None,
    }


def _keda(
    pods: list[Pod],
    alive: list[Pod],
    queued: int,
    running: int,
    now: float,
    last_busy: float,
    t: Timers,
    s: dict[str, Any],
) -> None:
    if int(now) % int(s["polling_s"]) != 0:
        return  # KEDA acts on its polls only, activation from zero included
    want = min(s["max_workers"], math.ceil((queued + running) / s["list_length"]))
    for _ in range(want - len(alive)):
        pods.append(Pod(now, now + t.cold_start_s))
    # Down only to zero, after the cooldown (the HPA's own scale-down waits 5 minutes).
    if want == 0 and alive and now - last_busy >= s["cooldown_s"]:
        for pod in alive:
            pod.stop = now


def _runpod(
    pods: list[Pod], alive: list[Pod], queue: list[float], now: float, t: Timers, s: dict
) -> None:
    starting = [p for p in alive if now < p.ready]
    wanted = queue and not starting and len(alive) < s["max_workers"]
    free = sum(t.per_worker - len([e for e in p.busy if e > now]) for p in alive)
    if wanted and (not alive or (free <= 0 and now - queue[0] >= s["queue_delay_s"])):
        pods.append(Pod(now, now + t.cold_start_s))
    for pod in alive:
        idle = not [e for e in pod.busy if e > now] and now >= pod.ready
        if idle and now - max(pod.last_job, pod.ready) >= s["idle_s"]:
            pod.stop = now


def poisson_arrivals(rate: float, minutes: float, seed: int) -> list[float]:
    """Seconds at which jobs arrive, ``rate`` a second on average, for ``minutes``."""
    rng = random.Random(seed)
    arrivals, now = [], 0.0
    while (now := now + rng.expovariate(rate)) < minutes * 60:
        arrivals.append(now)
    return arrivals


def keda_rules(args: argparse.Namespace) -> dict[str, Any]:
    """KEDA's scaler as the command line sets it (``replay``'s ``scaler``)."""
    return {
        "kind": "keda",
        "polling_s": args.polling_s,
        "cooldown_s": args.cooldown_s,
        "list_length": args.list_length,
        "max_workers": args.max_workers,
    }


def timers_from(path: Path) -> Timers:
    fig = json.loads(path.read_text())
    one = fig["one_consumer"]
    return Timers(
        cold_start_s=max(fig["consumer_cold_start_s"]),
        job_s=one["mean_job_s"],
        per_worker=fig.get("per_worker", 4),
        audio_s_per_job=one["audio_s_per_job"],
        added_s=fig["added_time"]["delay_ms"]["p50"] / 1000,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench broker-cost", description=__doc__)
    p.add_argument("--figures", default=str(OUT), help="python -m bench broker's JSON")
    p.add_argument("--rate", type=float, default=0.2, help="jobs per second (default 0.2)")
    p.add_argument("--minutes", type=float, default=60, help="arrivals over this long")
    p.add_argument("--idle-gap-min", type=float, default=0, help="then nothing this long")
    p.add_argument("--polling-s", type=float, default=30, help="KEDA pollingInterval")
    p.add_argument("--cooldown-s", type=float, default=300, help="KEDA cooldownPeriod")
    p.add_argument("--list-length", type=int, default=16, help="KEDA listLength target")
    p.add_argument("--idle-s", type=float, default=5, help="RunPod idle timeout")
    p.add_argument("--queue-delay-s", type=float, default=4, help="RunPod queue delay")
    p.add_argument("--max-workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t = timers_from(Path(args.figures))
    arrivals = poisson_arrivals(args.rate, args.minutes, args.seed)
    horizon = (args.minutes + args.idle_gap_min) * 60
    keda = keda_rules(args)
    runpod = {"kind": "runpod", "idle_s": args.idle_s, "queue_delay_s": args.queue_delay_s}
    runpod["max_workers"] = args.max_workers
    out = {
        "timers": t.__dict__,
        "jobs": len(arrivals),
        "keda": {**keda, **replay(arrivals, t, keda, horizon)},
        "runpod": {**runpod, **replay(arrivals, t, runpod, horizon)},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
