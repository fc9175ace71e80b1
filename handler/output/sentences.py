"""A transcript's words grouped into sentences and paragraphs, for the faces that answer
them (AssemblyAI's ``/sentences`` and ``/paragraphs``, Deepgram's ``paragraphs``), and
searched for phrases (AssemblyAI's word search, Deepgram's ``search``).

Pure functions over word dicts, whatever their face's shape: the keys that hold a word's
text, times and speaker are named by the caller.
"""

from __future__ import annotations

import re
from typing import Any

SENTENCE_END = re.compile(r"[.?!。？！]['\"”’)\]]*$")
"""A word that ends a sentence: its last stop, a closing quote or bracket allowed after."""
PARAGRAPH_PAUSE_S = 1.5
"""A pause this long between two sentences (or another speaker) starts a paragraph."""

Words = list[dict[str, Any]]


def sentences(words: Words, text: str, speaker: str = "speaker") -> list[Words]:
    """Runs of words cut after each one that ends a sentence, and where the speaker
    changes (``words[i][text]``: the word as written)."""
    runs: list[Words] = []
    ended = True
    for w in words:
        if ended or runs[-1][-1].get(speaker) != w.get(speaker):
            runs.append([])
        runs[-1].append(w)
        ended = bool(SENTENCE_END.search(str(w[text])))
    return runs


def paragraphs(runs: list[Words], pause: float, speaker: str = "speaker") -> list[list[Words]]:
    """Sentences (runs of words with ``start`` and ``end``) joined until a pause of
    ``pause`` (in the words' unit of time) or another speaker."""
    groups: list[list[Words]] = []
    for run in runs:
        last = groups[-1][-1] if groups else None
        if (
            last is None
            or last[-1].get(speaker) != run[0].get(speaker)
            or run[0]["start"] - last[-1]["end"] >= pause
        ):
            groups.append([])
        groups[-1].append(run)
    return groups


def find_phrases(spoken: list[str], terms: list[list[str]]) -> list[list[int]]:
    """For each term (a phrase as its words), the indexes in ``spoken`` where it starts.
    Each term is looked for only where its first word is: a 100-term query on a 4-hour
    transcript (40,000 words) costs its matches, not 100 passes of the whole."""
    where: dict[str, list[int]] = {}
    for i, word in enumerate(spoken):
        where.setdefault(word, []).append(i)
    found = []
    for term in terms:
        n = len(term)
        starts = where.get(term[0], []) if term else []
        found.append([i for i in starts if spoken[i : i + n] == term])
    return found
