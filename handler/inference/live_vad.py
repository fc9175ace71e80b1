"""Server VAD for live audio: Silero's speech probability per 32-ms window, as it arrives,
and OpenAI's ``server_vad`` turn rules over it.

The probabilities are faster-whisper's own Silero model (the same ONNX session as its file
VAD): each 512-sample window is scored with the 64 samples before it as context and the
network's state carried from the window before, across chunks, so scoring windows as they
arrive gives what scoring the whole stream at once gives (tests/test_realtime.py; the file
VAD alone zeroes the end of its very last window). Turn rules, OpenAI's names:
``threshold`` (speech from this probability), ``prefix_padding_ms`` (audio kept before the
start), ``silence_duration_ms`` (silence that ends a turn, below ``threshold - 0.15`` as
faster-whisper's VAD counts silence).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from handler.contract import SAMPLE_RATE

WINDOW = 512
CONTEXT = 64
WINDOW_MS = WINDOW * 1000 // SAMPLE_RATE  # 32


class StreamVad:
    """Speech probabilities of a live 16-kHz stream, one per complete 512-sample window."""

    def __init__(self) -> None:
        from faster_whisper.vad import get_vad_model

        self._session = get_vad_model().session  # Silero's ONNX session, as the file VAD's
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.empty(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the windows ``samples`` completes (possibly none)."""
        self._pending = np.concatenate([self._pending, samples.astype(np.float32)])
        n = len(self._pending) // WINDOW
        if not n:
            return np.empty(0, dtype=np.float32)
        rows = self._pending[: n * WINDOW].reshape(n, WINDOW)
        self._pending = self._pending[n * WINDOW :]
        batch = np.empty((n, CONTEXT + WINDOW), dtype=np.float32)
        batch[:, CONTEXT:] = rows
        batch[0, :CONTEXT] = self._context
        batch[1:, :CONTEXT] = rows[:-1, -CONTEXT:]
        # The network's state runs from window to window: carried across pushes.
        out, self._h, self._c = self._session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._context = rows[-1, -CONTEXT:].copy()
        return np.asarray(out, dtype=np.float32).reshape(-1)


@dataclass
class TurnRules:
    """OpenAI's server_vad parameters (their defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass
class TurnDetector:
    """Speech start and stop, in ms of the session's audio, from window probabilities."""

    rules: TurnRules = field(default_factory=TurnRules)
    position_ms: int = 0
    speaking: bool = False
    start_ms: int = 0
    stopped_ms: int = 0
    """Where the last turn's speech ended (its ``stopped`` event's ms)."""
    _silence_ms: int = 0

    @property
    def silence_ms(self) -> int:
        """The silence since speech was last heard in the turn under way (0 outside one)."""
        return self._silence_ms if self.speaking else 0

    @property
    def speech_end_ms(self) -> int:
        """Where the speech last heard ends, in ms of the session's audio."""
        return self.position_ms - self.silence_ms

    def feed(self, probs: np.ndarray) -> Iterator[tuple[str, int]]:
        """``("started", audio_start_ms)`` and ``("stopped", audio_end_ms)`` events."""
        low = max(self.rules.threshold - 0.15, 0.01)
        for p in probs:
            if not self.speaking and p >= self.rules.threshold:
                self.speaking, self._silence_ms = True, 0
                self.start_ms = self.position_ms
                yield "started", self.start_ms
            elif self.speaking:
                self._silence_ms = self._silence_ms + WINDOW_MS if p < low else 0
                if self._silence_ms >= self.rules.silence_duration_ms:
                    self.speaking = False
                    self.stopped_ms = self.position_ms + WINDOW_MS - self._silence_ms
                    yield "stopped", self.stopped_ms
            self.position_ms += WINDOW_MS
