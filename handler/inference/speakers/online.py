"""Speakers of a live session, turn by turn: each finished turn's voice (one CAM++
embedding of its speech, the diarizer's ``clip_embedding``) joins the nearest speaker heard
so far when it is alike enough, or starts a new one.

A live answer cannot wait for the whole recording, so this is the online half of
diarization: a label once sent stands (the offline clustering of a file job may regroup
phrases after the fact; a live turn's speaker is said with its transcript). A turn is one
voice: the voice-agent and contact-centre streams this serves take turns; a change of
speaker within one turn is not found.

Measured on built conversations of 2 to 5 real voices (``python -m bench live-speakers``,
bench/README.md), turn by turn as a live stream ends them.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from handler.contract import SAMPLE_RATE

THRESHOLD = 0.70
"""Cosine between a turn's voice and a speaker's (the mean of its turns') to join it."""
SHORT_S = 1.5
"""A turn shorter than this joins the nearest speaker, whatever its likeness: a 1.5-s
window is the diarizer's own, and a shorter turn's voice ("yes", "okay") is too little to
start a speaker on (starting one for it split voices: bench/README.md)."""
MIN_S = 0.3
"""A turn shorter than this is given no speaker at all (no voice to embed)."""
MAX_SPEAKERS = 20
"""Speakers one session may hold: past them, a turn joins the nearest (bounds the work and
the memory of a session whose audio is noise)."""


class LiveSpeakers:
    """One session's speakers; ``assign`` a turn at a time (in the order turns end)."""

    def __init__(self, diarizer: Any, max_speakers: int | None = None) -> None:
        self.diarizer = diarizer
        self.cap = min(max_speakers or MAX_SPEAKERS, MAX_SPEAKERS)
        self._sums: list[np.ndarray] = []
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self._sums)

    def assign(self, samples: np.ndarray) -> tuple[int, float] | None:
        """(the speaker's index from 0, the turn's likeness to it) for a turn's 16-kHz
        samples; None for a turn too short to carry a voice."""
        seconds = len(samples) / SAMPLE_RATE
        if seconds < MIN_S:
            return None
        voice = np.asarray(self.diarizer.clip_embedding(samples), dtype=np.float64)
        with self._lock:
            return self._join(voice, seconds)

    def _join(self, voice: np.ndarray, seconds: float) -> tuple[int, float]:
        if self._sums:
            likeness = [float(voice @ (s / np.linalg.norm(s))) for s in self._sums]
            best = int(np.argmax(likeness))
            if likeness[best] >= THRESHOLD or seconds < SHORT_S or len(self._sums) >= self.cap:
                self._sums[best] = self._sums[best] + voice
                return best, likeness[best]
        self._sums.append(voice.copy())
        return len(self._sums) - 1, 1.0
