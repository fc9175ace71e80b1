"""faster-whisper's decoding defaults, read from the library itself: never restated here.

A job passes on only the options it set (handler.schema); the batched decoder
(``fw_batch``) and the language detection need a value for every option, and took it from
literals that drifted from the library's in the official worker. Here they come from
``WhisperModel.transcribe``'s own signature, so an upgrade of faster-whisper that changes
a default changes ours with it (tests/test_engine.py pins that every option read here is a
parameter of that signature).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from faster_whisper import BatchedInferencePipeline, WhisperModel
from faster_whisper.vad import VadOptions


def _defaults(function: Any) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


DEFAULTS: dict[str, Any] = _defaults(WhisperModel.transcribe)
"""Every keyword of ``WhisperModel.transcribe`` with its default."""
BATCHED_DEFAULTS: dict[str, Any] = _defaults(BatchedInferencePipeline.transcribe)
"""The same for the batched pipeline, whose few differing defaults (``vad_filter``) the
engine follows where it does what that pipeline does."""


def opt(kwargs: Mapping[str, Any], name: str) -> Any:
    """The job's value of ``name``, or faster-whisper's default (KeyError: not an option)."""
    return kwargs[name] if name in kwargs else DEFAULTS[name]


def temperatures(kwargs: Mapping[str, Any]) -> list[float]:
    """The job's temperature ladder (one value or a list), as floats."""
    t = opt(kwargs, "temperature")
    return [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]


def vad_options(kwargs: Mapping[str, Any], **overrides: Any) -> VadOptions:
    """The job's VAD parameters (a dict or VadOptions) as VadOptions, with ``overrides``."""
    params = kwargs.get("vad_parameters")
    if isinstance(params, VadOptions):
        params = {k: getattr(params, k) for k in VadOptions.__dataclass_fields__}
    return VadOptions(**{**(params or {}), **overrides})
