"""A live session's audio since its last commit, on the session's clock (milliseconds since
its first sample): what a turn's decode reads, cut at each commit, trimmed while nobody
speaks so an open microphone costs bounded memory."""

from __future__ import annotations

import numpy as np

from handler.contract import SAMPLE_RATE


class LiveBuffer:
    def __init__(self) -> None:
        self.samples = np.empty(0, dtype=np.float32)
        self.start_ms = 0
        """Session ms of the first sample held."""
        self.received_ms = 0
        """Session ms of all the audio received (the end of what is held)."""

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, samples: np.ndarray) -> None:
        self.samples = np.concatenate([self.samples, samples])
        self.received_ms += len(samples) * 1000 // SAMPLE_RATE

    def between(self, from_ms: int, to_ms: int) -> np.ndarray:
        a = max(0, (from_ms - self.start_ms) * SAMPLE_RATE // 1000)
        b = max(a, (to_ms - self.start_ms) * SAMPLE_RATE // 1000)
        return self.samples[a:b]

    def take(self, from_ms: int, to_ms: int) -> np.ndarray:
        """A copy of the audio from ``from_ms`` to ``to_ms``; nothing before ``to_ms`` is
        held after it (a committed turn)."""
        out = self.between(from_ms, to_ms).copy()
        cut = max(0, (to_ms - self.start_ms) * SAMPLE_RATE // 1000)
        self.samples = self.samples[cut:]
        self.start_ms = to_ms
        return out

    def keep_last(self, keep_s: float) -> None:
        """Before speech: only the last ``keep_s`` (trimmed once twice that is held)."""
        keep = int(keep_s * SAMPLE_RATE)
        if len(self.samples) > 2 * keep:
            cut = len(self.samples) - keep
            self.samples = self.samples[cut:]
            self.start_ms += cut * 1000 // SAMPLE_RATE

    def clear(self) -> None:
        self.samples = np.empty(0, dtype=np.float32)
        self.start_ms = self.received_ms
