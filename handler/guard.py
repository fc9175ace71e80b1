"""The one "cancelled, or past the deadline?" check that every long phase of a job makes.

Fetch, decode, the wait for a model slot and transcription all stop at the same two
conditions; :class:`Guard` says them once, with the error each raises.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from handler.errors import Code, WorkerError

CANCELLED_MESSAGE = "The job was cancelled."


def raise_if_cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise WorkerError(Code.CANCELLED, CANCELLED_MESSAGE)


@dataclass
class Guard:
    """Cancel event plus an optional monotonic deadline, and the error for passing it."""

    cancel: threading.Event | None = None
    deadline: float | None = None
    timeout_code: Code = Code.INTERNAL
    timeout_message: str = "The job took too long."

    @classmethod
    def within(
        cls, seconds: float, cancel: threading.Event | None, code: Code, message: str
    ) -> Guard:
        return cls(cancel, time.monotonic() + seconds, code, message)

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise CANCELLED, or the timeout error, when either condition holds."""
        raise_if_cancelled(self.cancel)
        if self.expired():
            raise WorkerError(self.timeout_code, self.timeout_message)
