"""``python -m handler``: load the model(s), then hand control to the RunPod worker loop.

The model load and warm-up run in a thread while ``import runpod`` (seconds on its own)
runs here, so the two overlap; the thread imports nothing (see startup.prepare). No job
is taken before the model is loaded; a model that cannot be loaded exits the process
with status 1 and one line saying what was tried.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from handler.job import Worker
from handler.startup import STARTUP_ERRORS, StartupTimes, configure_logging, load_models, prepare


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"] or os.environ.get("WHISPER_MODE", "").strip().lower() == "http":
        from handler.faces.http_server import serve

        return serve()
    # Other arguments are the runpod SDK's own (--test_input, --rp_serve_api, ...).
    times = StartupTimes()
    configure_logging()
    # The SDK logs whole results (transcripts) at DEBUG, its default.
    os.environ.setdefault("RUNPOD_LOG_LEVEL", "INFO")

    try:
        plan = prepare(times)  # settings, imports, resolution: all in this thread
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["pool"] = load_models(plan, times)
        except STARTUP_ERRORS as exc:
            box["error"] = str(exc)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()

    t = time.perf_counter()
    import runpod  # noqa: F401  (slow: a CPU probe and aiohttp; overlaps the model load)

    times.runpod_import = time.perf_counter() - t
    configure_logging()  # `import runpod` calls logging.basicConfig(INFO) on the root logger
    from handler.faces.result_posts import persist_result_posts
    from handler.faces.runpod_handlers import make_handlers

    persist_result_posts(plan.settings.result_retry_s)

    if plan.settings.s3_allowed_buckets or plan.settings.result_bucket:
        # Jobs run in threads: import boto3 once here, not lazily in two jobs at a time.
        import boto3  # noqa: F401
        import botocore.config  # noqa: F401

    loader.join()
    if "error" in box:
        print(f"whisper-worker: {box['error']}", file=sys.stderr)
        return 1
    worker = Worker(settings=plan.settings, pool=box["pool"])
    times.ready = time.perf_counter()
    times.log()

    handler, stream_handler = make_handlers(worker)
    # The SDK's local test mode does not iterate generators: stream only in the real loop.
    streaming = worker.settings.stream and bool(os.environ.get("RUNPOD_WEBHOOK_GET_JOB"))
    concurrency = worker.settings.concurrency
    runpod.serverless.start(
        {
            "handler": stream_handler if streaming else handler,
            "concurrency_modifier": lambda _current: concurrency,
            "return_aggregate_stream": True,
        }
    )
    return 0


if __name__ == "__main__":
    logging.captureWarnings(True)
    sys.exit(main())
