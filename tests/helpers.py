"""Helpers the tests import (not fixtures: those are in conftest.py)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.settings import load_settings
from speech_assets.clips import JFK_TEXT, wer, words

__all__ = ["DATA", "JFK_TEXT", "b64", "make_settings", "wait_for", "wer", "words"]

DATA = Path(__file__).parent / "data"


def b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def make_settings(**overrides):
    env = {"WHISPER_" + k.upper(): str(v) for k, v in overrides.items()}
    env.setdefault("WHISPER_WARMUP", "false")
    return load_settings(env)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
