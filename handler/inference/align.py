"""Word times from a forced aligner: the recognised words, aligned again to the audio.

Whisper's word times come from its cross-attention and are off by 80-110 ms on average
(a constant bias per model, the worst on a segment's first word). An HMM forced aligner
given the text places word starts within 50 ms for most words. This pass runs after a
job's segments are decoded, on CPU threads, never inside a model slot or a batch.

The aligner is PocketSphinx 5 (BSD): its wheel ships an en-us acoustic model and a
134k-word pronouncing dictionary, so nothing is fetched and nothing needs torch. Each
segment's words are aligned inside that segment's window only (from the end of the
previous segment's last aligned word, to the next segment's first word, which rides along
as an anchor so that the last word cannot swallow the audio after it): time and memory
stay linear in the audio, one window (at most ``MAX_WINDOW_S``) per job at a time.

The text never changes: every word keeps its characters and its place. A word the
dictionary cannot spell (digits, other scripts) keeps Whisper's times, shifted by its
aligned neighbours' offset; a segment the aligner cannot align keeps Whisper's times.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handler.contract import SAMPLE_RATE, Segment, Word
from handler.guard import Guard

METHODS = ("whisper", "forced", "auto")
"""``word_alignment`` values: Whisper's own times, the forced aligner, or forced where an
aligner for the segment's language is installed."""
LANGUAGES = frozenset({"en"})
"""Languages an aligner is installed for (PocketSphinx's en-us model)."""
MARGIN_S = 0.3
"""Audio before a segment's first word given to the aligner (Whisper's first-word start
is its least exact time)."""
MAX_WINDOW_S = 45.0
"""The longest window aligned at once (a segment is at most 30 s): 1.4 MB of samples."""
_FILLERS = ("<", "[", "+")
_DIGITS = "zero one two three four five six seven eight nine".split()


def available() -> bool:
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Outcome:
    """What the pass did to one job's words."""

    method: dict[str, str] = field(default_factory=dict)
    """Per language of the job: ``forced`` or ``whisper``."""
    aligned: int = 0
    kept: int = 0
    """Words that kept Whisper's (shifted) times."""
    seconds: float = 0.0


class Aligner:
    """A few PocketSphinx decoders shared by every job: a job takes one for its whole pass
    (a decoder is not thread-safe), so at most ``threads`` jobs align at a time."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = max(1, threads)
        self._free: queue.LifoQueue[Any] = queue.LifoQueue()
        self._made = 0
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Build one decoder now (about 0.4 s: the dictionary), not on the first job."""
        with self.decoder(Guard()):
            pass

    @contextlib.contextmanager
    def decoder(self, guard: Guard) -> Iterator[Any]:
        dec = self._take(guard)
        try:
            yield dec
        finally:
            self._free.put(dec)

    def _take(self, guard: Guard) -> Any:
        with self._lock:
            if self._free.empty() and self._made < self.threads:
                self._made += 1
                return _new_decoder()
        while True:
            guard.check()
            try:
                return self._free.get(timeout=0.2)
            except queue.Empty:
                continue

    def align(
        self,
        segments: list[Segment],
        samples: np.ndarray,
        languages: Sequence[str],
        guard: Guard,
    ) -> Outcome:
        """Align the words of ``segments`` (whose language is ``languages[i]``) in place."""
        out = Outcome()
        t = time.perf_counter()
        wanted = [i for i, s in enumerate(segments) if s.get("words") and languages[i] in LANGUAGES]
        for lang in dict.fromkeys(languages):
            out.method[lang] = "forced" if lang in LANGUAGES else "whisper"
        if wanted:
            with self.decoder(guard) as dec:
                prev_end = 0.0
                for n, i in enumerate(wanted):
                    guard.check()
                    following = segments[wanted[n + 1]] if n + 1 < len(wanted) else None
                    prev_end = _align_segment(dec, segments[i], following, samples, prev_end, out)
        out.seconds = time.perf_counter() - t
        return out


def _new_decoder() -> Any:
    import os

    from pocketsphinx import Decoder, get_model_path

    model = os.path.join(get_model_path(), "en-us")
    return Decoder(
        hmm=os.path.join(model, "en-us"),
        dict=os.path.join(model, "cmudict-en-us.dict"),
        samprate=SAMPLE_RATE,
        loglevel="FATAL",
    )


def spoken(dec: Any, word: str) -> list[str] | None:
    """The dictionary words that say ``word`` (its own entry, or a split of it into
    entries, digits one by one); None where none does (another script, a symbol)."""
    text = unicodedata.normalize("NFKD", word.lower().replace("\u2019", "'"))
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.strip(" \t\"'.,!?;:()[]{}-\u2026\u00bf\u00a1")
    if not text:
        return None
    if dec.lookup_word(text) is not None:
        return [text]
    parts: list[str] = []
    for chunk in "".join(c if c.isalnum() or c == "'" else " " for c in text).split():
        if chunk.isdigit():
            parts += [_DIGITS[int(d)] for d in chunk]
        elif (split := _split(dec, chunk)) is not None:
            parts += split
        else:
            return None
    return parts or None


def _split(dec: Any, chunk: str) -> list[str] | None:
    """``chunk`` as the fewest dictionary words that spell it (Dashwood: dash wood)."""
    if not chunk.isascii() or len(chunk) > 40:
        return None
    best: list[list[str] | None] = [[]] + [None] * len(chunk)
    for end in range(1, len(chunk) + 1):
        for start in range(max(0, end - 20), end):
            head = best[start]
            piece = chunk[start:end]
            if head is None or (len(piece) < 2 and piece not in ("a", "i")):
                continue
            if dec.lookup_word(piece) is not None:
                cand = head + [piece]
                if best[end] is None or len(cand) < len(best[end] or []):
                    best[end] = cand
    return best[-1]


def _align_segment(
    dec: Any,
    seg: Segment,
    following: Segment | None,
    samples: np.ndarray,
    prev_end: float,
    out: Outcome,
) -> float:
    """Align one segment's words; returns where its last word ends (for the next one)."""
    words = seg["words"] or []
    says = [spoken(dec, w["word"]) for w in words]
    tokens = [t for s in says if s for t in s]
    if not tokens:
        out.kept += len(words)
        return max(prev_end, words[-1]["end"])
    start = max(prev_end, words[0]["start"] - MARGIN_S, 0.0)
    end = min(words[-1]["end"] + MARGIN_S, len(samples) / SAMPLE_RATE)
    anchor = _anchor(dec, following)
    if anchor is not None:
        tokens.append(anchor[0])
        end = min(max(end, anchor[1] + MARGIN_S / 3), len(samples) / SAMPLE_RATE)
    if end - start > MAX_WINDOW_S or end - start < 0.1:
        out.kept += len(words)
        return max(prev_end, words[-1]["end"])
    placed = force_align(dec, samples, start, end, tokens)
    if placed is not None and anchor is not None and len(placed) == len(tokens) - 1:
        placed.append(placed[-1])  # the anchor fell outside the window: its words stand
    if placed is None or len(placed) != len(tokens):
        out.kept += len(words)
        return max(prev_end, words[-1]["end"])
    _apply(words, says, placed, out)
    seg["start"] = min(seg["start"], words[0]["start"])
    seg["end"] = max(seg["end"], words[-1]["end"])
    return max(prev_end, words[-1]["end"])


def _anchor(dec: Any, following: Segment | None) -> tuple[str, float] | None:
    """The next segment's first word (its spelling and Whisper's end), when the
    dictionary can say it in one entry."""
    if following is None or not following.get("words"):
        return None
    first = (following["words"] or [])[0]
    said = spoken(dec, first["word"])
    if said is None or len(said) != 1:
        return None
    return said[0], first["end"]


def force_align(
    dec: Any, samples: np.ndarray, start: float, end: float, tokens: list[str]
) -> list[tuple[float, float]] | None:
    """(start, end) seconds of the tokens aligned in samples[start:end], in order; None on
    failure. The aligner may stop before the last tokens (audio too short for them): the
    list is then shorter, and only the tokens it names are timed."""
    a, b = int(start * SAMPLE_RATE), int(end * SAMPLE_RATE)
    pcm = (np.clip(samples[a:b], -1.0, 1.0) * 32767).astype("<i2").tobytes()
    try:
        dec.set_align_text(" ".join(tokens))
        dec.start_utt()
        dec.process_raw(pcm, full_utt=True)
        dec.end_utt()
        found = dec.seg()  # None: the words could not be aligned to this audio
    except (RuntimeError, ValueError):
        return None
    if found is None:
        return None
    segs = list(found)
    named = [s for s in segs if not s.word.startswith(_FILLERS)]
    if [s.word.split("(")[0] for s in named] != tokens[: len(named)]:
        return None
    # Frame n covers [n / frate, n / frate + wlen): two frames meet halfway between their
    # centres, (wlen - 1 / frate) / 2 after the later one starts (7.8 ms with the model's
    # 25.6-ms window every 10 ms), which is where a word that begins at a frame begins.
    step = 1.0 / float(dec.config["frate"])
    lag = start + (float(dec.config["wlen"]) - step) / 2
    return [(lag + s.start_frame * step, lag + (s.end_frame + 1) * step) for s in named]


def _apply(
    words: list[Word],
    says: list[list[str] | None],
    placed: list[tuple[float, float]],
    out: Outcome,
) -> None:
    """Each word gets the span of its tokens; a spelled-out number or an unsayable word
    keeps Whisper's times shifted by its neighbours' offset, inside their new times."""
    spans: list[tuple[float, float] | None] = []
    k = 0
    for w, said in zip(words, says, strict=True):
        if said is None:
            spans.append(None)
            continue
        first, last = placed[k], placed[k + len(said) - 1]
        k += len(said)
        plain = "".join(c for c in w["word"] if c.isalnum())
        spans.append(None if plain.isdigit() else (first[0], last[1]))
    shifts = [s[0] - w["start"] if s else None for w, s in zip(words, spans, strict=True)]
    for i, w in enumerate(words):
        span = spans[i]
        if span is None:
            near = [x for x in (_nearest(shifts, i, -1), _nearest(shifts, i, 1)) if x is not None]
            shift = sum(near) / len(near) if near else 0.0
            lo = words[i - 1]["end"] if i else 0.0
            span = (max(lo, w["start"] + shift), max(lo, w["end"] + shift))
            out.kept += 1
        else:
            out.aligned += 1
        w["start"], w["end"] = round(span[0], 3), round(max(span), 3)
    for i in range(len(words) - 1):
        # a kept word may overlap the next aligned one: never out of order
        if words[i]["end"] > words[i + 1]["start"]:
            words[i]["end"] = max(words[i]["start"], words[i + 1]["start"])


def _nearest(shifts: list[float | None], i: int, step: int) -> float | None:
    j = i + step
    while 0 <= j < len(shifts):
        if shifts[j] is not None:
            return shifts[j]
        j += step
    return None
