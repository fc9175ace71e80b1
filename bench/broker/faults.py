"""``python -m bench broker-faults``: short real-speech jobs through the gateway to two
consumers, one consumer process SIGKILLed midway (its supervisor starts another), on a
real Redis. Reports how many jobs completed, how many ran again, lost, duplicated or
stuck, the WER against in-process transcription's reference, and the time to drain.

tests/test_broker.py runs the same procedure with fewer jobs; the figures in
docs/broker.md come from this command with its defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.common.text import normalise
from runpod_emulator.broker_stack import ConsumerProc, GatewayProc, RedisServer, all_ended
from speech_assets.clips import short_jobs

VISIBILITY_S = 30
"""The consumers' visibility timeout here: the killed one's jobs return after it."""


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return float(jiwer.wer(normalise(reference, "en"), normalise(hypothesis, "en")))


def in_process(pool: list[tuple[str, str]]) -> list[str]:
    """Each clip's text from the same model in this process, through the same pipeline."""
    from handler.pipeline.job import run_job
    from handler.settings import load_settings
    from handler.startup import Loader

    worker = Loader(load_settings({"WHISPER_DEVICE": "cpu"}), log_level="WARNING").wait()
    return [run_job({"audio_base64": audio}, worker, job_id="bench")["text"] for audio, _ in pool]


def kill_midway(jobs: int = 500, kill_after: float = 0.2) -> dict[str, Any]:
    """Run ``jobs`` jobs; SIGKILL one consumer once ``kill_after`` of them completed."""
    import redis

    from handler.faces.broker.store import JobStore

    rds = RedisServer()
    env = {"WHISPER_BROKER_VISIBILITY_S": str(VISIBILITY_S), "WHISPER_MAX_CONCURRENCY": "4"}
    consumers = [ConsumerProc(rds.url, **env) for _ in range(2)]
    gateway = GatewayProc(rds.url)
    store = JobStore(redis.Redis.from_url(rds.url, decode_responses=True), 600)
    try:
        pool = short_jobs()
        here = in_process(pool)
        started = time.monotonic()
        sent, clip = {}, {}
        for n in range(jobs):
            audio, text = pool[n % len(pool)]
            job_id = gateway.run({"audio_base64": audio})
            sent[job_id], clip[job_id] = text, n % len(pool)
        while store.health()["jobs"]["completed"] < kill_after * jobs:
            time.sleep(0.1)
        in_hand = store.r.scard("whisper:running")
        killed = consumers[0].kill_child()
        consumers[0].wait_ready(2)
        done = all_ended(gateway, list(sent), 1800)
        elapsed = time.monotonic() - started
        health = store.health()["jobs"]
        statuses = [s["status"] for s in done.values()]
        texts = {i: s.get("output", {}).get("text", "") for i, s in done.items()}
        errors = [wer(sent[i], t) for i, t in texts.items()]
        return {
            "jobs": jobs,
            "completed": statuses.count("COMPLETED"),
            "other_endings": len(statuses) - statuses.count("COMPLETED"),
            "lost": jobs - len(done),
            "stored_completions": health["completed"],
            "duplicated": health["completed"] - statuses.count("COMPLETED"),
            "stuck_in_progress": store.r.scard("whisper:running"),
            "running_when_killed": in_hand,
            "ran_again": health["retried"],
            "killed_pid": killed,
            "mean_wer": round(sum(errors) / max(1, len(errors)), 4),
            "in_process_mean_wer": round(
                sum(wer(sent[i], here[clip[i]]) for i in sent) / max(1, len(sent)), 4
            ),
            "not_as_in_process": sum(t != here[clip[i]] for i, t in texts.items()),
            "seconds": round(elapsed, 1),
            "visibility_timeout_s": VISIBILITY_S,
        }
    finally:
        gateway.stop()
        for c in consumers:
            c.stop()
        rds.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench broker-faults", description=__doc__)
    p.add_argument("--jobs", type=int, default=500, help="jobs to send (default 500)")
    args = p.parse_args(argv)
    print(json.dumps(kill_midway(args.jobs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
