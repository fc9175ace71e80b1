"""``profanity_filter``: profane words masked in everything a job returns, as AssemblyAI and
Google do it: the first letter kept, the other letters and digits as asterisks ("shit's" ->
"s***'s"; punctuation, apostrophes and case kept); or, ``"full"``, as Deepgram does it:
every letter ("****'s").

The words come from glin-profanity's dictionaries (MIT; 25 languages, with its own list of
safe phrases: "cum laude", "Moby Dick", "Scunthorpe" are left alone). A transcript is
checked in English and in its own language (each segment of a ``"language": "multi"`` job
in its part's); a language with no dictionary there is checked in English alone, and the
answer's ``warnings`` says so.

The library tells what it masked only as a masked string, so each masked span is found
again from that string (the text between the masks is the text as it was) and checked
against the places the library reported; where the two disagree, each word is checked on
its own instead.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

from handler.contract import Segment

LANGUAGES = {
    "ar": "arabic",
    "zh": "chinese",
    "yue": "chinese",
    "cs": "czech",
    "da": "danish",
    "nl": "dutch",
    "en": "english",
    "eo": "esperanto",
    "fi": "finnish",
    "fr": "french",
    "de": "german",
    "hi": "hindi",
    "hu": "hungarian",
    "it": "italian",
    "ja": "japanese",
    "ko": "korean",
    "no": "norwegian",
    "nn": "norwegian",
    "nb": "norwegian",
    "fa": "persian",
    "pl": "polish",
    "pt": "portuguese",
    "ru": "russian",
    "es": "spanish",
    "sv": "swedish",
    "th": "thai",
    "tr": "turkish",
}
"""Whisper's language codes -> glin-profanity's dictionary names."""

_MARK = "\uffff"  # a noncharacter: never in a transcript (Whisper's tokens cannot spell it)
_lock = threading.Lock()


class Masker:
    """Masks the profane words of English and one more language."""

    def __init__(self, language: str) -> None:
        from glin_profanity import Filter  # imported with the first job that asks

        names = ["english"] + ([LANGUAGES[language]] if language in LANGUAGES else [])
        self._filter = Filter({"languages": list(dict.fromkeys(names)), "replace_with": _MARK})

    def spans(self, text: str) -> list[tuple[int, int]]:
        """[start, end) of each profane run of ``text`` (runs that touch are one)."""
        if not text.strip():
            return []
        result = self._filter.check_profanity(text)
        masked = result.get("processed_text") or text
        if _MARK not in masked:
            return []
        starts = {m["index"] for m in result.get("matches") or [] if "index" in m}
        found = _recover(text, masked.split(_MARK), starts)
        return self._word_by_word(text) if found is None else found

    def _word_by_word(self, text: str) -> list[tuple[int, int]]:
        out, pos = [], 0
        for word in text.split():
            at = text.index(word, pos)
            pos = at + len(word)
            out += [(at + s, at + e) for s, e in self._simple(word)]
        return out

    def _simple(self, word: str) -> list[tuple[int, int]]:
        masked = self._filter.check_profanity(word).get("processed_text") or word
        found = _recover(word, masked.split(_MARK)) if _MARK in masked else []
        return found or []

    def text(self, text: str, keep_first: bool = True) -> str:
        return mask(text, self.spans(text), keep_first)


def _recover(
    text: str, pieces: list[str], starts: set[int] | None = None
) -> list[tuple[int, int]] | None:
    """The masked runs of ``text``, given the text between them (``pieces``) and where the
    library said its hits start (``starts``: each run begins at one); None if they do not
    fit. A run ends where the next piece is found and, after it, the next run starts at a
    hit: a phrase ("2 girls 1 cup") holds the spaces the next piece begins with."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for i, piece in enumerate(pieces[:-1]):
        if not text.startswith(piece, pos):
            return None
        start, after = pos + len(piece), pieces[i + 1]
        if starts is not None and start not in starts:
            return None
        if i + 1 == len(pieces) - 1:
            end = len(text) - len(after)
            if not text.endswith(after) or end <= start:
                return None
        else:
            end = text.find(after, start + 1) if after else -1
            while starts is not None and end >= 0 and end + len(after) not in starts:
                end = text.find(after, end + 1)
            if end < 0:
                return None
        spans.append((start, end))
        pos = end
    return spans


def mask(text: str, spans: Iterable[tuple[int, int]], keep_first: bool = True) -> str:
    """Each span's letters and digits as ``*`` (but the first of each of its words, when
    ``keep_first``)."""
    chars = list(text)
    for start, end in spans:
        first = keep_first
        for i in range(start, end):
            if chars[i].isspace():
                first = keep_first
            elif chars[i].isalnum():
                chars[i] = chars[i] if first else "*"
                first = False
    return "".join(chars)


@functools.lru_cache(maxsize=len(set(LANGUAGES.values())) + 1)
def _masker(language: str) -> Masker:
    return Masker(language)


def masker(language: str | None) -> Masker:
    """The masker for a transcript in ``language`` (None, or a language without a
    dictionary: English alone). Built once per language per process."""
    key = language if language in LANGUAGES else "en"
    with _lock:
        return _masker(key)


def unlisted(languages: Iterable[str | None]) -> str | None:
    """The ``warnings`` entry for languages checked in English alone, if any."""
    missing = sorted({lang for lang in languages if lang and lang not in LANGUAGES})
    if not missing:
        return None
    return (
        f"profanity_filter: no word list for {', '.join(missing)}; "
        "only English words were masked there"
    )


def keeps_first(option: bool | str | None) -> bool:
    """Whether a job's ``profanity_filter`` keeps each word's first letter (``"full"``:
    Deepgram's every letter)."""
    return option != "full"


def segment(seg: Segment, language: str | None, keep_first: bool = True) -> Segment:
    """The segment with its text and words masked, checked in ``language`` (a copy, when
    anything was); a masked segment's ``tokens`` are emptied: they spell the words unmasked."""
    m = masker(language)
    text = seg["text"]
    spans = m.spans(text)
    words = seg.get("words")
    joined = "".join(w["word"] for w in words) if words else None
    if not spans and (joined is None or joined == text):
        return seg
    out: Segment = {**seg, "text": mask(text, spans, keep_first), "tokens": []}
    if words:
        if joined == text:
            masked_words = _slice(out["text"], [len(w["word"]) for w in words])
        else:
            masked_words = [m.text(w["word"], keep_first) for w in words]
        out["words"] = [{**w, "word": t} for w, t in zip(words, masked_words, strict=True)]
    if out["words"] == words and out["text"] == text:
        return seg
    return out


def _slice(text: str, lengths: list[int]) -> list[str]:
    out, pos = [], 0
    for n in lengths:
        out.append(text[pos : pos + n])
        pos += n
    return out


def channels(
    entries: list[dict[str, Any]], translated: bool, keep_first: bool = True
) -> list[dict[str, Any]]:
    """A multichannel answer's ``channels``: each channel's text, in its own language (in
    English when ``translated``)."""
    out = []
    for c in entries:
        m = masker("en" if translated else c.get("language"))
        out.append({**c, "text": m.text(c.get("text") or "", keep_first)})
    return out
