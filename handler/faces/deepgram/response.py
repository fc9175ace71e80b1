"""Deepgram's pre-recorded response, shaped from a job's result: for ``POST /v1/listen``
(handler.faces.deepgram.prerecorded) and for a ``callback``'s call when its job ends
(handler.faces.webhooks): the same body either way."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.datastructures import QueryParams

from handler.faces.deepgram import dictation, shape
from handler.faces.deepgram.query import (
    extra,
    flag,
    language_hints,
    replacements,
    searches,
    utt_split,
)
from handler.faces.deepgram.shape import whole_words


class Words:
    """A job's words as Deepgram's: whole words, speakers numbered by first word,
    ``replace``'s table applied."""

    def __init__(self, table: dict[str, str], paragraphs: bool, dictated: bool = False) -> None:
        self.table = table
        self.speakers: dict[str, int] = {}
        self.paragraphs = paragraphs
        """``paragraphs=true``: each alternative gets its paragraphs."""
        self.dictated = dictated
        """``dictation=true``: spoken punctuation commands as their marks."""

    def speaker(self, w: dict[str, Any]) -> int | None:
        label = w.get("speaker")
        return None if label is None else self.speakers.setdefault(str(label), len(self.speakers))

    def __call__(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        words = [shape.word(w, 0.0, self.speaker(w)) for w in whole_words(raw)]
        words = shape.replaced(words, self.table)
        return dictation.apply(words) if self.dictated else words

    def said(self, text: str, words: list[dict[str, Any]]) -> str:
        """The transcript: the job's text, or with ``replace`` or ``dictation`` its words as
        they left them."""
        return dictation.transcript(words) if self.table or self.dictated else text


def answer(
    result: dict[str, Any], model: str, params: Any, sha256: str, request_id: str | None = None
) -> dict[str, Any]:
    """Deepgram's response for a job's result: a channel per channel of a ``multichannel``
    job (one that repeats another has its words), else the one channel. ``sha256``: the
    audio's (empty for a URL), ``request_id``: a callback's (else a new one)."""
    detected = "language" not in params or flag(params, "detect_language")
    whole = {"channel": None, "text": result["text"], "language": result.get("language")}
    whole["language_probability"] = result.get("language_probability")
    heard = result.get("channels") or [whole]
    words_of = Words(replacements(params), flag(params, "paragraphs"), flag(params, "dictation"))
    terms = searches(params)
    if multi := shape.language_of(params.get("language")) == "multi":
        result = {**result, "words": _in_their_languages(result)}
    channels = [_channel(result, entry, words_of, detected, terms) for entry in heard]
    if multi:  # as nova-3's language=multi answers: the languages by words, the hints
        for channel in channels:
            alt = channel["alternatives"][0]
            said = [w["language"] for w in alt["words"] if w.get("language")]
            alt["languages"] = sorted(dict.fromkeys(said), key=lambda x: -said.count(x))
            alt["languages_hinted"] = language_hints(params)
    meta = shape.metadata(
        request_id or str(uuid.uuid4()), model, float(result.get("duration", 0.0))
    )
    meta["sha256"] = sha256
    if pairs := extra(params):
        meta["extra"] = pairs
    meta["channels"] = len(channels)
    body: dict[str, Any] = {"metadata": meta, "results": {"channels": channels}}
    if flag(params, "utterances"):
        body["results"]["utterances"] = utterances(result, words_of, utt_split(params))
    return body


def utterances(
    result: dict[str, Any], words_of: Words, split: float | None
) -> list[dict[str, Any]]:
    """Deepgram's ``utterances``: one per segment, or with ``utt_split`` runs of words
    broken where the pause between two words is that long or more, or the channel or
    the speaker changes (as Deepgram breaks them)."""
    if split is None:
        segments = result.get("segments") or []
        return [_utterance(s, words_of) for s in segments if s["text"].strip()]
    runs: list[list[dict[str, Any]]] = []
    for w in whole_words(result.get("words") or []):
        last = runs[-1][-1] if runs else None
        if (
            last is None
            or float(w["start"]) - float(last["end"]) >= split
            or (w.get("channel"), w.get("speaker")) != (last.get("channel"), last.get("speaker"))
        ):
            runs.append([])
        runs[-1].append(w)
    return [_utterance(_run_segment(run), words_of) for run in runs]


def _run_segment(run: list[dict[str, Any]]) -> dict[str, Any]:
    """A run of words as the segment it stands for: its times, channel and text."""
    text = " ".join(w["word"].strip() for w in run)
    return {
        "start": run[0]["start"],
        "end": run[-1]["end"],
        "text": text,
        "words": run,
        "channel": run[0].get("channel", 0),
    }


def _in_their_languages(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's words, each with its segment's language (``language=multi``: each part
    decoded in its own); the words are the segments' words in order."""
    words = result.get("words") or []
    said = [s.get("language") for s in result.get("segments") or [] for _ in s.get("words") or []]
    if len(said) != len(words):
        return list(words)
    return [{**w, "language": lang} if lang else w for w, lang in zip(words, said, strict=True)]


def _channel(
    result: dict[str, Any],
    entry: dict[str, Any],
    words_of: Words,
    detected: bool,
    terms: list[str],
) -> dict[str, Any]:
    """One of ``results.channels``: its transcript and words (``entry["channel"]`` None:
    the whole result's), ``replace`` applied, ``search``'s hits when asked."""
    index = entry.get("same_as", entry["channel"])
    words = words_of(
        [w for w in result.get("words", []) if index is None or w.get("channel") == index]
    )
    alt = shape.alternative(words_of.said(entry["text"], words), words)
    if words_of.paragraphs:
        alt["paragraphs"] = shape.paragraphs(words)
    channel: dict[str, Any] = {"alternatives": [alt]}
    if detected:
        channel["detected_language"] = entry.get("language")
        channel["language_confidence"] = entry.get("language_probability")
    if terms:
        channel["search"] = shape.search(words, terms)
    return channel


def _utterance(seg: dict[str, Any], words_of: Words) -> dict[str, Any]:
    words = words_of(seg.get("words") or [])
    alt = shape.alternative(words_of.said(seg["text"].strip(), words), words)
    out = {
        "start": round(float(seg["start"]), 3),
        "end": round(float(seg["end"]), 3),
        "confidence": alt["confidence"],
        "channel": int(seg.get("channel", 0)),
        "transcript": alt["transcript"],
        "words": words,
        "id": str(uuid.uuid4()),
    }
    if words and "speaker" in words[0]:
        out["speaker"] = words[0]["speaker"]
    return out


def callback_body(request_id: str, status: dict[str, Any], spec: dict[str, Any]) -> bytes:
    """What a ``callback`` is sent when its job (``status``: its status object) ends:
    Deepgram's response, or Deepgram's error body with the job's code; ``spec``: the
    query, model and audio digest kept when it was queued."""
    output = status.get("output")
    if status.get("status") == "COMPLETED" and isinstance(output, dict) and "error" not in output:
        params = QueryParams(spec.get("query") or "")
        body = answer(
            output, spec.get("model") or "whisper", params, spec.get("sha256") or "", request_id
        )
    else:
        failed = output if isinstance(output, dict) else {}
        body = {
            "err_code": failed.get("error_code") or "INTERNAL",
            "err_msg": failed.get("error") or status.get("error") or "the job failed",
            "request_id": request_id,
        }
    return json.dumps(body, ensure_ascii=False).encode()
