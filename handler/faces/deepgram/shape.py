"""Deepgram's answer shapes, from a job's result: its words, one alternative, the model's
metadata. Shared by the live (``/v1/listen`` WebSocket) and the pre-recorded
(``POST /v1/listen``) faces."""

from __future__ import annotations

import datetime
from typing import Any

from handler.output import sentences as grouping
from handler.output.formats import plain, respell, whole_words

__all__ = ["plain", "whole_words"]  # here too: the faces' words are Deepgram's first


def word(
    w: dict[str, Any],
    offset: float = 0.0,
    speaker: int | None = None,
    limit: float = float("inf"),
) -> dict[str, Any]:
    """One word of a job's ``words`` (start, end, word, probability) as Deepgram's, on a
    clock ``offset`` seconds on, none past ``limit`` (the end of the audio it was heard in:
    Whisper may time a last word past it)."""
    written = w["word"].strip()
    out: dict[str, Any] = {
        "word": plain(written) or written,
        "start": round(min(offset + float(w["start"]), limit), 3),
        "end": round(min(offset + float(w["end"]), limit), 3),
        "confidence": round(float(w.get("probability", 0.0)), 4),
        "punctuated_word": written,
    }
    if speaker is not None:
        out["speaker"] = speaker
    if w.get("language"):
        out["language"] = w["language"]  # language=multi: its part's
    return out


def alternative(
    text: str, words: list[dict[str, Any]], language: str | None = None
) -> dict[str, Any]:
    """Deepgram's one alternative: the transcript, its confidence (the mean of its words'
    probabilities: Whisper gives no transcript-level one), its words and, when known, its
    language (``languages``, which LiveKit reads under ``language=multi``)."""
    confidence = sum(w["confidence"] for w in words) / len(words) if words else 0.0
    alt = {"transcript": text, "confidence": round(confidence, 4), "words": words}
    if language:
        alt["languages"] = [language]
    return alt


def model_info(model: str) -> dict[str, Any]:
    """What Deepgram's ``model_info`` says of a model: its name, and Whisper as its arch."""
    return {"name": model, "version": "", "arch": "whisper"}


def created() -> str:
    """Deepgram's ``created``: now, in ISO 8601 with a Z."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def metadata(request_id: str, model: str, duration: float) -> dict[str, Any]:
    """The ``metadata`` of a pre-recorded answer and the live ``Metadata`` message."""
    return {
        "transaction_key": "deprecated",
        "request_id": request_id,
        "sha256": "",
        "created": created(),
        "duration": round(duration, 3),
        "channels": 1,
        "models": [model],
        "model_info": {model: model_info(model)},
    }


def language_of(value: str | None) -> str | None:
    """Deepgram's ``language`` as a Whisper language: ``en-US`` -> ``en``; ``multi`` kept."""
    if not value:
        return None
    return value if value == "multi" else value.split("-")[0].lower()


def replaced(words: list[dict[str, Any]], table: dict[str, str]) -> list[dict[str, Any]]:
    """Deepgram's words with ``replace``'s table applied (a word to nothing is dropped)."""
    out = []
    for w in words:
        to = table.get(w["word"])
        if to is None:
            out.append(w)
        elif to:
            written = respell(w["punctuated_word"], table)
            out.append({**w, "word": plain(to) or to, "punctuated_word": written})
    return out


def search(words: list[dict[str, Any]], terms: list[str]) -> list[dict[str, Any]]:
    """Deepgram's ``search`` over the words: each query's hits (its words in a row, case and
    punctuation aside), timed, with the least confidence of their words and their text."""
    spoken = [w["word"] for w in words]
    wanted = [[plain(t) for t in term.split()] for term in terms]
    out = []
    found = grouping.find_phrases(spoken, wanted)
    for term, n, at in zip(terms, map(len, wanted), found, strict=True):
        runs = [words[i : i + n] for i in at]
        hits = [
            {
                "confidence": min(w["confidence"] for w in run),
                "start": run[0]["start"],
                "end": run[-1]["end"],
                "snippet": " ".join(w["punctuated_word"] for w in run),
            }
            for run in runs
        ]
        out.append({"query": term, "hits": hits})
    return out


def paragraphs(words: list[dict[str, Any]]) -> dict[str, Any]:
    """Deepgram's ``paragraphs`` of an alternative: its sentences joined until a pause of
    1.5 s or another speaker, each paragraph with its sentences, words and times, and the
    transcript as paragraphs (``Speaker N:`` before each when diarized)."""
    runs = grouping.sentences(words, "punctuated_word")
    out, texts = [], []
    for group in grouping.paragraphs(runs, grouping.PARAGRAPH_PAUSE_S):
        said = [
            {
                "text": " ".join(w["punctuated_word"] for w in run),
                "start": run[0]["start"],
                "end": run[-1]["end"],
            }
            for run in group
        ]
        para: dict[str, Any] = {
            "sentences": said,
            "num_words": sum(len(run) for run in group),
            "start": said[0]["start"],
            "end": said[-1]["end"],
        }
        text = " ".join(s["text"] for s in said)
        if "speaker" in group[0][0]:
            para["speaker"] = group[0][0]["speaker"]
            text = f"Speaker {para['speaker']}: {text}"
        out.append(para)
        texts.append(text)
    return {"transcript": "".join("\n" + t + "\n" for t in texts), "paragraphs": out}
