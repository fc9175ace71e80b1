"""``python -m handler``: load the model(s), then hand control to the RunPod worker loop.

The model load and warm-up run in a thread while ``import runpod`` (seconds on its own)
runs here, so the two overlap (handler.startup.Loader; the thread imports nothing). No job
is taken before the model is loaded; a setting or a model that cannot be loaded exits the
process with status 1 and one line saying what was tried. ``serve`` (or
``WHISPER_MODE=http``) starts HTTP mode instead; ``consume`` (or ``WHISPER_MODE=consume``)
takes jobs from the broker (handler.faces.broker.consumer).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from handler.settings import Settings, SettingsError, load_settings
from handler.startup import STARTUP_ERRORS, Loader, configure_logging


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1
    if argv[:1] == ["serve"] or settings.mode == "http":
        from handler.serve import serve

        return serve(settings)
    if argv[:1] == ["consume"] or settings.mode == "consume":
        from handler.faces.broker.consumer import supervise

        return supervise(settings)
    # Other arguments are the runpod SDK's own (--test_input, --rp_serve_api, ...).
    return queue_worker(settings)


def queue_worker(settings: Settings) -> int:
    # The SDK logs whole results (transcripts) at DEBUG, its default.
    os.environ.setdefault("RUNPOD_LOG_LEVEL", "INFO")
    try:
        loader = Loader(settings).start()  # settings, imports here; the load in a thread
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        return 1

    t = time.perf_counter()
    import runpod  # noqa: F401  (slow: a CPU probe and aiohttp; overlaps the model load)

    loader.times.runpod_import = time.perf_counter() - t
    # `import runpod` calls logging.basicConfig(INFO) on the root logger.
    configure_logging(settings.log_level)
    from handler.faces import fanout
    from handler.faces.result_posts import persist_result_posts
    from handler.faces.runpod_handlers import make_handlers

    persist_result_posts(settings.result_retry_s)
    if settings.s3_allowed_buckets or settings.result_bucket:
        # Jobs run in threads: import boto3 once here, not lazily in two jobs at a time.
        import boto3  # noqa: F401
        import botocore.config  # noqa: F401

    try:
        worker = loader.wait()
    except STARTUP_ERRORS as exc:
        print(f"whisper-worker: {exc}", file=sys.stderr)
        if loader.self_test_failed and os.environ.get("RUNPOD_WEBHOOK_GET_JOB"):
            fail_fitness_check(str(exc))
        return 1
    # A job's `split` submits its pieces to this endpoint with the endpoint's own key.
    worker.fan_out = fanout.Platform.from_env(
        settings=settings, queue_wait_s=settings.piece_queue_wait_s
    )
    handler, stream_handler = make_handlers(worker)
    # The SDK's local test mode does not iterate generators: stream only in the real loop.
    streaming = settings.stream and bool(os.environ.get("RUNPOD_WEBHOOK_GET_JOB"))
    concurrency = settings.concurrency
    runpod.serverless.start(
        {
            "handler": stream_handler if streaming else handler,
            "concurrency_modifier": lambda _current: concurrency,
            "return_aggregate_stream": True,
        }
    )
    return 0


def fail_fitness_check(reason: str) -> None:
    """Tell the platform through the SDK's own fitness check, which reports the worker
    unhealthy (its ping, with the check's name and reason) and exits 1, so RunPod replaces
    the worker rather than routes jobs to it."""
    import runpod

    def speech_self_test() -> None:
        raise RuntimeError(reason)

    runpod.serverless.register_fitness_check(speech_self_test)
    runpod.serverless.start({"handler": lambda _job: None})


if __name__ == "__main__":
    logging.captureWarnings(True)
    sys.exit(main())
