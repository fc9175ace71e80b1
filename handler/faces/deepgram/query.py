"""Deepgram's query options as both of its routes read them (``live`` and ``prerecorded``):
booleans, bounded numbers, hotwords, the model a name stands for. A value that can never be
served raises QueryError; each route answers it in its own shape."""

from __future__ import annotations

from typing import Any

from handler.output.formats import plain

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


def language_hints(params: Any, multi: bool | None = None) -> list[str]:
    """``language_hint`` (repeated, at most 100): with ``language=multi``, the languages
    each part's (live: each turn's) detection picks among, as Whisper codes (``en-GB`` ->
    ``en``), in the order first given. Deepgram biases its detection toward them; this
    worker detects among them only. Ignored with any other ``language``, as Deepgram does."""
    hints = [h.strip() for h in _bounded(params, "language_hint")]
    if any(not h.replace("-", "").replace("_", "").isalpha() for h in hints):
        raise QueryError("language_hint: language codes such as en or es", "invalid_value")
    if not (params.get("language") == "multi" if multi is None else multi):
        return []
    return list(dict.fromkeys(h.replace("_", "-").split("-")[0].lower() for h in hints))


UTT_SPLIT_S = (0.0, 30.0)
"""``utt_split``'s bounds (s)."""


def utt_split(params: Any) -> float | None:
    """``utt_split``: the pause (s) between two words that ends an utterance; absent: None
    (an utterance is a segment)."""
    value = params.get("utt_split")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    lo, hi = UTT_SPLIT_S
    if not lo <= seconds <= hi:  # nan too
        raise QueryError(f"utt_split: seconds from {lo:g} to {hi:g}", "invalid_value")
    return seconds


DIARIZE_MODELS = ("latest", "v1", "v2")
LIVE_DIARIZE_MODELS = ("latest", "v1")


def diarization(params: Any, live: bool = False) -> bool:
    """Speakers asked for: ``diarize=true``, or ``diarize_model`` (Deepgram's current name
    for it, ``diarize`` being deprecated: ``latest``, ``v1``, ``v2``; live ``latest`` and
    ``v1``, as Deepgram takes them). Any version is this worker's one diarizer."""
    version = params.get("diarize_model")
    if version is None:
        return flag(params, "diarize")
    served = LIVE_DIARIZE_MODELS if live else DIARIZE_MODELS
    if version.lower() not in served:
        where = "live" if live else "files"
        raise QueryError(f"diarize_model: {', '.join(served)} ({where})", "invalid_value")
    return True


def served_model(asked: str, loaded: list[str]) -> str:
    """The model a ``model`` name stands for: itself when loaded here, else (``nova-3`` and
    every other Deepgram name) the default model."""
    return asked if asked in loaded else (loaded[0] if loaded else "whisper")


ACCEPTED = ("punctuate", "smart_format", "numerals", "filler_words", "measurements", "mip_opt_out")
"""Boolean options accepted and checked, with nothing to change: Whisper punctuates and
formats as it transcribes; nothing here is sent to a model-improvement programme."""


NOT_SERVED = {
    "sentiment": "sentiment analysis",
    "summarize": "summaries",
    "topics": "topic detection",
    "intents": "intent recognition",
    "detect_entities": "entity detection",
    "custom_topic": "topic detection",
    "custom_intent": "intent recognition",
}
"""What a file's query may ask that this worker cannot do: refused, never answered empty
(a transcript that should have been redacted must not come back as if it had been)."""
MAX_TERMS = 100
MAX_PHRASE_WORDS = 5


REDACT_AS = {
    "true": "numbers",
    "numbers": "numbers",
    "aggressive_numbers": "numbers",
    "pci": "pci",
    "ssn": "ssn",
}


def redaction(params: Any) -> list[str]:
    """``redact`` (repeated, or comma-separated): the job's ``redact`` kinds. ``true``,
    ``numbers``, ``aggressive_numbers``, ``pci`` and ``ssn`` are served (one rule:
    handler.output.redact); ``pii``, ``phi`` and single entities need a recognizer this
    worker has not: refused, never answered unredacted."""
    kinds: list[str] = []
    for value in params.getlist("redact"):
        for name in (v.strip().lower() for v in value.split(",")):
            if name in ("", "false"):
                continue
            if name not in REDACT_AS:
                raise QueryError(
                    f"redact: {name[:40]} is not served by this worker (numbers, pci, ssn are)",
                    "invalid_value",
                )
            kinds.append(REDACT_AS[name])
    return list(dict.fromkeys(kinds))


def refuse_unserved(params: Any) -> None:
    for name, what in NOT_SERVED.items():
        for value in params.getlist(name):
            if value.lower() not in ("false", ""):
                raise QueryError(f"{name}: {what} is not served by this worker", "invalid_value")


def _bounded(params: Any, name: str) -> list[str]:
    values = params.getlist(name)
    if len(values) > MAX_TERMS or any(not v.strip() or len(v) > 100 for v in values):
        raise QueryError(f"{name}: at most {MAX_TERMS}, each 1 to 100 characters", "invalid_value")
    return values


def replacements(params: Any) -> dict[str, str]:
    """``replace=find:replacement`` (repeated): one word found, case and punctuation aside,
    written as the replacement (``find:`` drops it)."""
    table: dict[str, str] = {}
    for entry in _bounded(params, "replace"):
        find, sep, to = entry.partition(":")
        found = plain(find)  # as the words are matched: case and punctuation aside
        if not sep or not found or len(found.split()) != 1:
            raise QueryError("replace: find:replacement, one word to find", "invalid_value")
        table[found] = to.strip()
    return table


MAX_EXTRA_CHARS = 2048
"""One ``extra`` pair at most (Deepgram's own limit)."""


def extra(params: Any) -> dict[str, str]:
    """``extra=key:value`` (repeated): the pairs the answer's metadata carries back, so a
    caller can tell which of its requests a callback answers."""
    values = params.getlist("extra")
    if len(values) > MAX_TERMS:
        raise QueryError(f"extra: at most {MAX_TERMS} pairs", "invalid_value")
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, said = value.partition(":")
        if not sep or not key or len(value) > MAX_EXTRA_CHARS:
            raise QueryError(
                f"extra: key:value, at most {MAX_EXTRA_CHARS} characters", "invalid_value"
            )
        pairs[key] = said
    return pairs


def searches(params: Any) -> list[str]:
    """``search`` (repeated): words or phrases of up to five words."""
    terms = [" ".join(t.split()) for t in _bounded(params, "search")]
    if any(len(t.split()) > MAX_PHRASE_WORDS for t in terms):
        raise QueryError(f"search: a phrase of at most {MAX_PHRASE_WORDS} words", "invalid_value")
    return list(dict.fromkeys(terms))
