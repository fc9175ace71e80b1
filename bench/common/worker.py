"""The worker as the accuracy benches run it: its Runtime on the CPU with a named model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cpu_worker(model: str, threads: int, **env: str) -> tuple[Any, Path]:
    """The worker's Runtime (``start_worker``) on the CPU with ``model`` (tiny.en, base or a
    folder; fetched into bench/out/models) and ``threads``, more settings in ``env``; and
    the model's folder, for a plain faster-whisper beside it."""
    from handler.settings import load_settings
    from handler.startup import start_worker
    from speech_assets.models import model_dir

    folder = model_dir(model, ROOT / "bench" / "out" / "models")
    settings = {
        "WHISPER_DEVICE": "cpu",
        "WHISPER_MODEL": str(folder),
        "WHISPER_CPU_THREADS": str(threads),
        **env,
    }
    return start_worker(load_settings(settings)), folder
