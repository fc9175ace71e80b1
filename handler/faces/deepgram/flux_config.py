"""Flux's options (``/v2/listen``): the connection's query, read whole before the session
starts, and the ``Configure`` message that changes some of them in the middle of a stream.

End of turn, as Deepgram names it: ``eot_threshold`` (0.5-1.0, default 0.7), the confidence
that ends a turn, served as the silence that ends one (``TURN_SILENCE_MS``: a surer end waits
longer); at 1.0 only ``eot_timeout_ms`` (500-60000, default 5000: the longest silence before
a turn ends) or the client's ``ForceEndTurn`` ends a turn. ``eager_eot_threshold`` (0.3-0.9;
absent: no eager events) is served the same way, as the shorter silence after which the
turn is decoded early and ``EagerEndOfTurn`` sent (``eager_silence_ms``).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import QueryParams

from handler.faces.deepgram.live import audio_format
from handler.faces.deepgram.query import (
    QueryError,
    flag,
    keywords,
    language_hints,
    redaction,
    served_model,
)
from handler.faces.realtime.binary import query_number
from handler.faces.realtime.protocol import SessionError
from handler.inference.live_vad import WINDOW_MS

TURN_SILENCE_MS = (300, 700)
"""The silence that ends a turn at ``eot_threshold`` 0.5 and at 0.9 (linear between; 500 ms
at Flux's default 0.7): a surer end of turn waits longer. Whisper needs whole phrases, so
300 ms is the floor, as on ``/v1/listen``."""
MAX_SILENCE_MS = 10_000
"""The longest silence a live session waits for (the live config's bound): an
``eot_timeout_ms`` over it is served as it."""
EAGER_FLOOR_MS = 160
"""The shortest silence after which a turn is decoded early (five VAD windows): less is a
pause between two words, and each early decode costs one."""
EOT_THRESHOLD, EOT_TIMEOUT_MS = 0.7, 5000
"""Flux's defaults."""
THRESHOLDS: dict[str, tuple[float, float, float | None]] = {
    "eot_threshold": (0.5, 1.0, EOT_THRESHOLD),
    "eager_eot_threshold": (0.3, 0.9, None),
    "eot_timeout_ms": (500, 60_000, EOT_TIMEOUT_MS),
}
"""Each threshold's (lowest, highest, default), Deepgram's."""
ACCEPTED = ("numerals", "mip_opt_out")


def thresholds(source: Any, code: str) -> dict[str, float]:
    """The thresholds ``source`` (a query, or a Configure's ``thresholds`` object) sets;
    SessionError (``code``) on a value out of its range."""
    found: dict[str, float] = {}
    for name, (lo, hi, _default) in THRESHOLDS.items():
        value = query_number(source, name, lo, hi, code)
        if value is not None:
            found[name] = int(value) if name == "eot_timeout_ms" else value
    return found


def _line(threshold: float) -> float:
    lo, hi = TURN_SILENCE_MS
    return lo + (hi - lo) * (threshold - 0.5) / 0.4


def silence_ms(chosen: dict[str, float]) -> int:
    """The silence (ms) that ends a turn under these thresholds."""
    threshold = chosen.get("eot_threshold", EOT_THRESHOLD)
    timeout = chosen.get("eot_timeout_ms", EOT_TIMEOUT_MS)
    silence = timeout if threshold >= 1.0 else min(_line(threshold), timeout)
    return round(min(max(TURN_SILENCE_MS[0], silence), MAX_SILENCE_MS))


def eager_silence_ms(chosen: dict[str, float]) -> int | None:
    """The silence (ms) after which a turn is decoded early and ``EagerEndOfTurn`` sent:
    shorter than the one that ends it, by two VAD windows at least; None: no eager events."""
    eager = chosen.get("eager_eot_threshold")
    if eager is None:
        return None
    return max(EAGER_FLOOR_MS, min(round(_line(eager)), silence_ms(chosen) - 2 * WINDOW_MS))


def configure(params: Any, loaded: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI's session object, Flux's own options) from the connection's query."""
    try:
        for name in ACCEPTED:
            flag(params, name)
        model = params.get("model") or ""
        multi = model.endswith("-multi")
        transcription: dict[str, Any] = {
            "model": model if model in loaded else "whisper-1",
            "language": None if multi or model in loaded else "en",
            "word_alignment": "whisper",
        }
        if multi and (hints := language_hints(params, multi=True)):
            transcription["languages"] = hints
        if terms := keywords(params):
            transcription["keywords"] = terms
        if flag(params, "profanity_filter"):
            transcription["profanity_filter"] = "full"
        if kinds := redaction(params):
            transcription["redact"] = kinds
        chosen = thresholds(params, "INVALID_QUERY")
        turns = {"type": "server_vad", "silence_duration_ms": silence_ms(chosen)}
        audio = {"format": audio_format(params), "transcription": transcription}
    except QueryError as exc:
        raise SessionError(str(exc), exc.code.upper()) from None
    session = {"type": "transcription", "audio": {"input": {**audio, "turn_detection": turns}}}
    options = {"model": served_model(model, loaded), "multi": multi, "thresholds": chosen}
    options["numerals"] = flag(params, "numerals")
    return session, options


def configure_message(event: dict[str, Any], multi: bool) -> dict[str, Any]:
    """What a ``Configure`` message changes, checked whole (SessionError: nothing changes):
    ``thresholds``, ``keyterms`` (a list, or one), ``language_hints`` (``flux-general-multi``
    only; ``[]`` clears them), ``numerals``."""
    changes: dict[str, Any] = {}
    if (given := event.get("thresholds")) is not None:
        if not isinstance(given, dict):
            raise SessionError("thresholds: an object", "INVALID_THRESHOLDS")
        changes["thresholds"] = thresholds(given, "INVALID_THRESHOLDS")
    if (terms := event.get("keyterms")) is not None:
        terms = [terms] if isinstance(terms, str) else terms
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise SessionError("keyterms: a list of words or phrases", "INVALID_KEYTERMS")
        changes["keyterms"] = terms
    if (hints := event.get("language_hints")) is not None:
        if not multi:
            raise SessionError("language_hints: only with flux-general-multi", "INVALID_HINTS")
        if not isinstance(hints, list) or not all(isinstance(h, str) for h in hints):
            raise SessionError("language_hints: a list of language codes", "INVALID_HINTS")
        try:
            query = QueryParams([("language_hint", h) for h in hints])
            changes["language_hints"] = language_hints(query, multi=True)
        except QueryError as exc:
            raise SessionError(
                str(exc).replace("language_hint", "language_hints"), "INVALID_HINTS"
            ) from None
    if (numerals := event.get("numerals")) is not None:
        if not isinstance(numerals, bool):
            raise SessionError("numerals: true or false", "INVALID_NUMERALS")
        changes["numerals"] = numerals
    return changes


def current_thresholds(chosen: dict[str, float]) -> dict[str, Any]:
    """The thresholds in force, as ``ConfigureSuccess`` echoes them (defaults filled in)."""
    return {name: chosen.get(name, default) for name, (_lo, _hi, default) in THRESHOLDS.items()}
