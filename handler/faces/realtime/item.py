"""One conversation item of a live session: the words of a turn sent as deltas, and its
transcript, so that a turn's deltas add up to its transcript exactly."""

from __future__ import annotations

import asyncio
import difflib
from typing import Any

from handler.faces.openai_api import logprobs
from handler.inference.loops import bare


class LiveItem:
    """One conversation item: a turn's interim decodes, the words sent of it, its transcript."""

    def __init__(self, item_id: str, start_ms: int) -> None:
        self.item_id = item_id
        self.start_ms = start_ms
        self.emitted: list[str] = []
        """Words already sent as deltas (never taken back)."""
        self.previous: list[str] | None = None
        """The last interim decode's words: a word is sent once two decodes agree on it."""
        self.interim_at = 0
        """Samples of the turn when its last interim decode started."""
        self.interim: asyncio.Future | None = None
        self.audio_from_ms = start_ms
        """Where the committed turn's samples begin in the session's audio."""
        self.tail_ms = 0
        """The silence after its speech that the committed turn's samples end with."""

    def agreed_delta(self, words: list[str]) -> str:
        """The words this decode and the previous one agree on beyond those already sent;
        nothing from a turn's first decode alone. The words sent stand in the turn's
        transcript (its deltas add up to it), so a word the first decode got wrong would
        stay wrong: sending the first decode's words lifted the live WER from 4.3 % to 8.6 %
        (``python -m bench realtime --sessions 1``); waiting for agreement keeps 4.3 %."""
        prev, self.previous = self.previous, words
        if prev is None:
            return ""
        agreed = 0
        while agreed < min(len(prev), len(words)) and prev[agreed] == words[agreed]:
            agreed += 1
        return self._advance(words[:agreed])

    def final(self, words: list[str]) -> tuple[str, str]:
        """(the turn's last delta, its completed transcript) from the final decode's
        words. The deltas of a turn add up to its transcript exactly, as OpenAI's do: the
        words already sent stand (a final decode may change their case or punctuation:
        "that agent" sent, "That agent is..." decoded), and the final decode gives what
        follows them, found by aligning the two (difflib, on words without case or
        punctuation)."""
        rest = words[_end_of(self.emitted, words) :]
        delta = (" " if self.emitted else "") + " ".join(rest) if rest else ""
        self.emitted = self.emitted + rest
        return delta, " ".join(self.emitted)

    def _advance(self, words: list[str]) -> str:
        n = len(self.emitted)
        if len(words) <= n or words[:n] != self.emitted:
            return ""
        new = words[n:]
        self.emitted = list(words)
        return (" " if n else "") + " ".join(new)

    def timed_words(self, result: dict[str, Any]) -> dict[str, Any]:
        """A session with ``word_alignment`` set: the turn's words, timed in seconds from
        the start of the session's audio (as ``audio_start_ms`` counts), and how. The
        times are the final decode's; each word is written as the transcript writes it
        (its words sent as deltas stand) when the two have as many words."""
        offset = self.audio_from_ms / 1000
        # Whisper may time a turn's last word past the turn's audio: no word ends after it.
        limit = offset + float(result.get("duration", float("inf")))
        timed = result["words"]
        said = (
            self.emitted if len(self.emitted) == len(timed) else [w["word"].strip() for w in timed]
        )
        return {
            "words": [
                {
                    "word": text,
                    "start": round(min(offset + w["start"], limit), 3),
                    "end": round(min(offset + w["end"], limit), 3),
                }
                for text, w in zip(said, timed, strict=True)
            ],
            "word_alignment": result.get("word_alignment", "whisper"),
        }


def delta_logprobs(result: dict[str, Any], start: int, end: int) -> list | None:
    """A delta's ``logprobs``: those of a decode's words ``start:end`` (a negative ``start``:
    its last words), one per word as a completed event's; none where the decode's timed
    words are not its text's words one for one (nothing to pair them with)."""
    words = result.get("words")
    if not isinstance(words, list) or len(words) != len(result["text"].split()):
        return None
    return logprobs(words[start:end] if start >= 0 else words[start:])


def _end_of(sent: list[str], words: list[str]) -> int:
    """Where in ``words`` the words ``sent`` end: after the last word matched with one of
    them, counting any unmatched ones after it one for one."""
    if not sent:
        return 0
    matcher = difflib.SequenceMatcher(
        None, [bare(w) for w in sent], [bare(w) for w in words], autojunk=False
    )
    best = None
    for a, b, size in matcher.get_matching_blocks():
        if size and a < len(sent):
            best = (a, b, size)
    if best is None:
        return min(len(sent), len(words))
    a, b, size = best
    if a + size >= len(sent):
        return b + (len(sent) - a)
    return min(len(words), b + size + (len(sent) - a - size))
