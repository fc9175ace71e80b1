"""A live session's audio since its last commit, on the session's clock (milliseconds since
its first sample): what a turn's decode reads, cut at each commit, trimmed while nobody
speaks so an open microphone costs bounded memory."""

from __future__ import annotations

import numpy as np

from handler.contract import SAMPLE_RATE


class LiveBuffer:
    """Held in one array that grows by doubling, the held samples a window of it: an append
    copies only itself (a concatenation per append copied the whole turn each time: a
    120-s turn in 20-ms chunks copied 23 GB on the event loop)."""

    def __init__(self) -> None:
        self._data = np.empty(0, dtype=np.float32)
        self._head = 0
        self._end = 0
        self.start_ms = 0
        """Session ms of the first sample held."""
        self.received_ms = 0
        """Session ms of all the audio received (the end of what is held)."""

    @property
    def samples(self) -> np.ndarray:
        return self._data[self._head : self._end]

    def __len__(self) -> int:
        return self._end - self._head

    def add(self, samples: np.ndarray) -> None:
        n = len(samples)
        if self._end + n > len(self._data):  # full: move what is held to a new array
            held = self.samples
            data = np.empty(max(2 * (len(held) + n), SAMPLE_RATE), dtype=np.float32)
            data[: len(held)] = held
            self._data, self._head, self._end = data, 0, len(held)
        self._data[self._end : self._end + n] = samples
        self._end += n
        self.received_ms += n * 1000 // SAMPLE_RATE

    def between(self, from_ms: int, to_ms: int) -> np.ndarray:
        a = max(0, (from_ms - self.start_ms) * SAMPLE_RATE // 1000)
        b = max(a, (to_ms - self.start_ms) * SAMPLE_RATE // 1000)
        return self.samples[a:b]

    def take(self, from_ms: int, to_ms: int) -> np.ndarray:
        """A copy of the audio from ``from_ms`` to ``to_ms``; nothing before ``to_ms`` is
        held after it (a committed turn)."""
        out = self.between(from_ms, to_ms).copy()
        cut = max(0, (to_ms - self.start_ms) * SAMPLE_RATE // 1000)
        self._head = min(self._end, self._head + cut)
        self.start_ms = to_ms
        return out

    def keep_last(self, keep_s: float) -> None:
        """Before speech: only the last ``keep_s`` (trimmed once twice that is held)."""
        keep = int(keep_s * SAMPLE_RATE)
        if len(self) > 2 * keep:
            cut = len(self) - keep
            self._head += cut
            self.start_ms += cut * 1000 // SAMPLE_RATE

    def clear(self) -> None:
        self._data = np.empty(0, dtype=np.float32)
        self._head = self._end = 0
        self.start_ms = self.received_ms
