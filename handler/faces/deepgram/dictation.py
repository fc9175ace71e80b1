"""Deepgram's ``dictation=true``: spoken punctuation commands as their marks, in Deepgram's
words (files and live). "thank you for your letter period. I will call" -> "... your
letter. I will call"; "tomorrow question mark, new paragraph. Please" -> "tomorrow?\\n\\n
Please" (English, as Deepgram serves it).

Whisper writes a dictated command as words, often with a mark of its own guessing after
it: the said mark replaces the previous word's, and the command's words go. A command
stays a word where it reads as one: after a determiner ("a period of time", "the
colon"), and, for the words that are also nouns (``period``, ``colon``) or at the start
of the words (nothing to attach the mark to), unless Whisper ended it with a mark of its
own, it is the last word, or the next word begins a sentence.
"""

from __future__ import annotations

from typing import Any

from handler.output.formats import plain

COMMANDS: dict[tuple[str, ...], str] = {
    ("comma",): ",",
    ("period",): ".",
    ("full", "stop"): ".",
    ("question", "mark"): "?",
    ("exclamation", "point"): "!",
    ("exclamation", "mark"): "!",
    ("colon",): ":",
    ("semicolon",): ";",
    ("semi", "colon"): ";",
    ("new", "line"): "\n",
    ("new", "paragraph"): "\n\n",
}
"""Each command's words (plain) and the mark it writes."""
NOUNS = {("period",), ("colon",)}
"""Commands that are common words too: converted only where a sentence would end."""
DETERMINERS = frozenset(
    "a an the this that these those each every any some no my your his her its our their "
    "one another same whole".split()
)
TRAILING = ",.;:!?"


def _marked(text: str) -> bool:
    """Whisper ended this word with a mark of its own."""
    mark = text.strip()[-1:]
    return bool(mark) and mark in TRAILING


ENDS = (".", "?", "!", "\n")


def _matches(words: list[dict[str, Any]], i: int) -> tuple[tuple[str, ...], str] | None:
    """The command (its words, its mark) starting at ``words[i]``, the longest first."""
    for size in (2, 1):
        said = tuple(plain(w["punctuated_word"]) for w in words[i : i + size])
        inner = [w["punctuated_word"] for w in words[i : i + size - 1]]
        if len(said) == size and said in COMMANDS and not any(_marked(x) for x in inner):
            return said, COMMANDS[said]
    return None


def _strict(words: list[dict[str, Any]], end: int) -> bool:
    """A command ending at ``words[end - 1]`` where a sentence would end: Whisper marked
    it, it is the last word, or the next word begins with a capital."""
    if _marked(words[end - 1]["punctuated_word"]) or end == len(words):
        return True
    return words[end]["punctuated_word"].strip()[:1].isupper()


def _capital(word: dict[str, Any]) -> dict[str, Any]:
    text = word["punctuated_word"]
    return {**word, "punctuated_word": text[:1].upper() + text[1:]}


def apply(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Deepgram's words with the dictated commands as marks on the words before them."""
    out: list[dict[str, Any]] = []
    i, capital = 0, False
    while i < len(words):
        found = _matches(words, i)
        if found is not None:
            said, mark = found
            before = plain(out[-1]["punctuated_word"]) if out else None
            strict = said in NOUNS or not out
            if before not in DETERMINERS and (not strict or _strict(words, i + len(said))):
                if out:
                    last = out[-1]["punctuated_word"]
                    kept = last if mark.startswith("\n") else last.rstrip(TRAILING)
                    out[-1] = {**out[-1], "punctuated_word": kept + mark}
                i += len(said)
                capital = capital or mark in ENDS or mark.startswith("\n")
                continue
        out.append(_capital(words[i]) if capital else words[i])
        capital = False
        i += 1
    return out


def transcript(words: list[dict[str, Any]]) -> str:
    """The transcript of dictated words: joined by spaces, no space after a line break."""
    joined = " ".join(w["punctuated_word"] for w in words)
    return joined.replace("\n ", "\n")
