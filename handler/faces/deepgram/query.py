"""Deepgram's query options as both of its routes read them (``live`` and ``prerecorded``):
booleans, bounded numbers, hotwords, the model a name stands for. A value that can never be
served raises QueryError; each route answers it in its own shape."""

from __future__ import annotations

from typing import Any

MAX_KEYWORDS = 100


class QueryError(ValueError):
    """A query value that can never be served; ``code``: the live route's Error variant."""

    def __init__(self, message: str, code: str = "invalid_query") -> None:
        super().__init__(message)
        self.code = code


def flag(params: Any, name: str) -> bool:
    """A boolean option (``true``/``false``, any case); absent: false."""
    value = params.get(name)
    if value is None:
        return False
    if value.lower() not in ("true", "false"):
        raise QueryError(f"{name}: true or false")
    return value.lower() == "true"


def number(params: Any, name: str, lo: int, hi: int) -> int | None:
    """A whole-number option from ``lo`` to ``hi``; absent: None."""
    value = params.get(name)
    if value is None:
        return None
    if not value.isdigit() or not lo <= int(value) <= hi:
        raise QueryError(f"{name}: a whole number from {lo} to {hi}")
    return int(value)


def keywords(params: Any) -> list[str]:
    """``keywords`` (their ``:intensifier`` dropped) and ``keyterm``: hotwords."""
    terms = [k.rsplit(":", 1)[0] if ":" in k else k for k in params.getlist("keywords")]
    terms += params.getlist("keyterm")
    if len(terms) > MAX_KEYWORDS or any(not k or len(k) > 100 for k in terms):
        raise QueryError(
            f"keywords, keyterm: at most {MAX_KEYWORDS}, each 1 to 100 characters",
            "invalid_value",
        )
    return terms


def served_model(asked: str, loaded: list[str]) -> str:
    """The model a ``model`` name stands for: itself when loaded here, else (``nova-3`` and
    every other Deepgram name) the default model."""
    return asked if asked in loaded else (loaded[0] if loaded else "whisper")
