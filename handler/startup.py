"""Start-up shared by the worker entry and the CLI: logging, settings, model load, warm-up.

Start-up phases are timed and logged as one JSON line (``startup {...}``) with epoch
timestamps, so the benchmark can split a cold start into imports, load and warm-up.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from handler.inference import allocator
from handler.inference.models import (
    ModelLoadError,
    ModelPool,
    ModelSpec,
    device_and_compute,
    load_one,
    resolve,
)
from handler.pipeline.runtime import Runtime, sweep_stale_job_dirs
from handler.settings import Settings, SettingsError, load_settings

log = logging.getLogger("handler.startup")

STARTUP_LOG_TAG = "startup"
"""The word that opens the start-up timing line; bench/ and the tests parse lines after it."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str = "INFO") -> None:
    """The worker's log format on stderr at ``level`` (Settings.log_level for the worker)."""
    level = level.upper()
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    # Libraries that log request URLs (query strings, presigned credentials) at INFO/DEBUG.
    for name in ("urllib3", "botocore", "boto3", "s3transfer", "faster_whisper"):
        logging.getLogger(name).setLevel(logging.WARNING)


def process_start_epoch() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:
        return time.time()


@dataclass
class StartupTimes:
    """Seconds and epoch marks of each start-up phase."""

    process_start: float = field(default_factory=process_start_epoch)
    main_start: float = field(default_factory=time.time)
    imports: float = 0.0
    model_load: float = 0.0
    warmup: float = 0.0
    self_test: float = 0.0
    runpod_import: float = 0.0
    diarizer_load: float = 0.0
    ready: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)
    allocator: str = field(default_factory=allocator.policy)
    """The allocator policy in effect (handler.inference.allocator)."""

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()

    def log(self) -> None:
        self.mark("ready")
        data = asdict(self)
        data["ready"] = data["marks"]["ready"] - self.process_start
        log.info("%s %s", STARTUP_LOG_TAG, json.dumps(data, sort_keys=True))


def warm_up(pool: ModelPool) -> float:
    """One tiny transcription per instance (with VAD, which loads its own model)."""
    import numpy as np

    start = time.perf_counter()
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000) * 0.01).astype(np.float32)
    for model in pool.models.values():
        inst: Any
        for inst in model.instances:
            for vad in (True, False):
                segments, _ = inst.transcribe(
                    audio, beam_size=1, vad_filter=vad, language="en", without_timestamps=True
                )
                for _ in segments:
                    pass
    return time.perf_counter() - start


@dataclass
class Plan:
    """What to load, decided in the main thread before the loader thread starts."""

    settings: Settings
    specs: list[ModelSpec]
    device: str
    compute: str


def prepare(times: StartupTimes, settings: Settings | None = None) -> Plan:
    """Settings, imports and model resolution, in the calling thread.

    Raises SettingsError or ModelLoadError, whose message is the one line printed before
    exiting. Every import the model load and the warm-up need happens here: two threads
    importing at once can hand one of them a partially initialised module (seen:
    ``requests.utils`` while ``import runpod`` ran), so the loader thread that overlaps
    ``import runpod`` must import nothing.
    """
    if settings is None:
        settings = load_settings()
    sweep_stale_job_dirs(settings)
    t = time.perf_counter()
    # What the load and warm-up would otherwise import lazily (tests/test_entry.py checks
    # that the loader thread imports nothing): the VAD's runtime, the feature extractor's
    # FFT, the warm-up's noise, and what onnxruntime's session pulls in.
    import multiprocessing.synchronize  # noqa: F401
    import secrets  # noqa: F401

    import faster_whisper  # noqa: F401
    import numpy.fft  # noqa: F401
    import numpy.random  # noqa: F401
    import onnxruntime  # noqa: F401

    import handler.inference.selftest  # noqa: F401  (its clip reader, its driver reading)

    if settings.diarization:
        import handler.inference.speakers.diarizer  # noqa: F401
    times.imports = time.perf_counter() - t
    times.mark("imports_done")
    if settings.device != "cpu":
        from handler.inference import selftest

        refusal = selftest.driver_refusal(selftest.read_driver(selftest.PROC))
        if refusal is not None:
            raise ModelLoadError(refusal)
    device, compute = device_and_compute(settings)
    return Plan(settings, resolve(settings, device), device, compute)


def load_models(plan: Plan, times: StartupTimes) -> ModelPool:
    """Load and warm the planned models; raises ModelLoadError.

    Safe to run in a thread beside other imports: it imports nothing new (tested).
    """
    t = time.perf_counter()
    models = [load_one(s, plan.settings, plan.device, plan.compute) for s in plan.specs]
    pool = ModelPool(models, plan.device, plan.compute)
    times.model_load = time.perf_counter() - t
    times.mark("model_loaded")
    if plan.settings.warmup:
        try:
            times.warmup = warm_up(pool)
        except Exception as exc:  # a model that cannot run one second of audio is unusable
            raise ModelLoadError(
                f"warm-up transcription failed: {type(exc).__name__}: {exc}"
            ) from None
    if plan.settings.self_test:  # real speech, after the noise: is the text there?
        from handler.inference import selftest

        s = plan.settings
        times.self_test = selftest.run(pool, s.self_test_clip, s.self_test_text, plan.compute)
    times.mark("warmup_done")
    return pool


def no_diarizer_model(folder: str) -> str:
    """What to do when the diarizer's model is not where WHISPER_DIARIZATION_MODEL says: the
    image bakes it (DIARIZATION=true); outside it (a clone, an image of one's own) it is
    exported once with torch, which the worker itself never needs."""
    return (
        f"diarizer load failed: no diarizer model in {folder} (its manifest.json is missing). "
        "The image built with --build-arg DIARIZATION=true has it; outside that image, export "
        "it once: pip install torch==2.13.0 onnx (for the export only; in a clone: "
        "pip install -e '.[diarizer]') "
        "&& python -m builder.diarizer --dest models/diarizer, then set "
        "WHISPER_DIARIZATION_MODEL=models/diarizer (docs/deploy.md, Speaker diarization)"
    )


def load_all(plan: Plan, times: StartupTimes) -> tuple[ModelPool, Any]:
    """The Whisper models and, when the deployment turns it on, the diarizer, loaded at
    the same time (the diarizer in a second thread). Raises ModelLoadError."""
    if not plan.settings.diarization:
        return load_models(plan, times), None
    from handler.inference.speakers import diarizer as diarize

    box: dict[str, Any] = {}

    def load_diarizer() -> None:
        t = time.perf_counter()
        try:
            box["diarizer"] = diarize.load(
                plan.settings.diarization_model,
                threads=_diarizer_threads(plan.settings),
                device=plan.device,
                device_index=plan.settings.device_index[0],
            )
        except FileNotFoundError:
            box["error"] = no_diarizer_model(plan.settings.diarization_model)
        except Exception as exc:  # the model folder is unreadable or broken
            box["error"] = f"diarizer load failed: {type(exc).__name__}: {exc}"
        times.diarizer_load = time.perf_counter() - t

    thread = threading.Thread(target=load_diarizer, name="diarizer-load", daemon=True)
    thread.start()
    try:
        pool = load_models(plan, times)
    finally:
        thread.join()
    if "error" in box:
        raise ModelLoadError(box["error"])
    return pool, box["diarizer"]


def _diarizer_threads(settings: Settings) -> int:
    from handler.inference.threads import usable_cpus

    return settings.cpu_threads or usable_cpus()


class Loader:
    """Start-up, written once for every entry point: the queue worker, HTTP mode, the CLI.

    ``Loader(settings)`` reads the settings (when not given), configures logging at
    ``Settings.log_level`` and does every import the load needs, in the calling thread
    (:func:`prepare`); ``start()`` loads and warms the models in a thread, so the caller's
    own slow work (``import runpod``, starting the HTTP server) overlaps it; ``wait()``
    joins it and returns the Runtime or raises the load's error. Both raise what
    STARTUP_ERRORS names, whose message is the one line printed before exiting 1.
    """

    def __init__(self, settings: Settings | None = None, *, log_level: str | None = None) -> None:
        self.times = StartupTimes()
        if settings is None:
            settings = load_settings()
        configure_logging(log_level or settings.log_level)
        self.plan = prepare(self.times, settings)
        self.worker: Runtime | None = None
        self.error: str | None = None
        self.self_test_failed = False
        """The model loaded but did not transcribe real speech (SelfTestFailed)."""
        self._thread: threading.Thread | None = None

    @property
    def settings(self) -> Settings:
        return self.plan.settings

    def start(
        self,
        on_ready: Callable[[Runtime], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> Loader:
        """Load in a thread; then ``on_ready(worker)`` or ``on_error(message)`` there."""

        def load() -> None:
            try:
                pool, diarizer = load_all(self.plan, self.times)
            except STARTUP_ERRORS as exc:
                self.error = str(exc)
                self.self_test_failed = type(exc).__name__ == "SelfTestFailed"
                if on_error is not None:
                    on_error(self.error)
                return
            self.worker = runtime(self.plan.settings, pool, diarizer)
            if on_ready is not None:
                on_ready(self.worker)

        self._thread = threading.Thread(target=load, name="model-load", daemon=True)
        self._thread.start()
        return self

    def wait(self) -> Runtime:
        """The loaded Runtime (ModelLoadError if the load failed); logs the start-up line."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        self._thread.join()
        if self.worker is None:
            from handler.inference.selftest import SelfTestFailed

            failure = SelfTestFailed if self.self_test_failed else ModelLoadError
            raise failure(self.error or "the model load did not finish")
        self.ready()
        return self.worker

    def ready(self) -> None:
        self.times.ready = time.perf_counter()
        self.times.log()


def start_worker(settings: Settings | None = None) -> Runtime:
    """Sequential start-up (the CLI, the benches, the model-tier tests): load, then return.

    Logging is left as the caller set it. Raises SettingsError or ModelLoadError.
    """
    times = StartupTimes()
    plan = prepare(times, settings)
    pool, diarizer = load_all(plan, times)
    return runtime(plan.settings, pool, diarizer)


def runtime(settings: Settings, pool: Any, diarizer: Any) -> Runtime:
    """The worker's Runtime; the forced aligner's first decoder built now when the
    deployment's jobs align by default (its dictionary takes about 0.4 s to read)."""
    worker = Runtime(settings=settings, pool=pool, diarizer=diarizer)
    if settings.word_alignment != "whisper" and (aligner := worker.aligner()) is not None:
        aligner.warm()
    return worker


STARTUP_ERRORS = (SettingsError, ModelLoadError)
"""What start-up raises for a worker that cannot serve: one line on stderr, exit 1."""
