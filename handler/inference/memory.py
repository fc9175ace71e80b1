"""Memory admission: a job starts transcribing only when the worker's memory budget has room.

With the bounded features and VAD (handler/inference/features.py) one job needs about 2.5 times its
16 kHz float32 PCM (the PCM, the speech gathered from it, the features) plus a fixed
amount for the decoder, measured by ``python -m bench memory`` (bench/README.md). Jobs run
several at a time, so several long files at once could still pass the memory a container
has, and an OOM kill loses every job the worker holds. Each job reserves its estimate
before it transcribes:

- it fits now: it runs;
- it fits once other jobs finish: it waits (cancel still works; the wait is reported as
  part of ``queue_model``);
- it can never fit in this worker's budget: it fails at once with
  ``MEMORY_BUDGET_EXCEEDED``, not retryable (the message says what it needs and how to
  raise the budget).

The budget is ``WHISPER_MEMORY_BUDGET_MB``, or by default 80 % of the memory limit the
process has (its cgroup's, else the machine's) less what the worker uses when it is
ready (the model).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from handler.contract import SAMPLE_RATE
from handler.errors import Code, WorkerError
from handler.guard import raise_if_cancelled

MIB = 2**20
PCM_FACTOR = 2.5
"""Peak bytes per byte of float32 PCM during transcription (measured: about 2.4)."""
FIXED_BYTES = 64 * MIB
"""Per job whatever its length: decoder state, buffers, one 30-s block's transients."""
AUTO_SHARE = 0.8
MIN_BUDGET_BYTES = 256 * MIB


def job_bytes(seconds: float) -> int:
    """Estimated peak memory of transcribing ``seconds`` of audio."""
    return int(math.ceil(seconds * SAMPLE_RATE * 4 * PCM_FACTOR)) + FIXED_BYTES


def memory_limit_bytes() -> int | None:
    """The cgroup's memory limit (v2, then v1), else the machine's total memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            return int(text)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def auto_budget_bytes(resident_bytes: int) -> int:
    limit = memory_limit_bytes()
    if limit is None:
        return 0  # unknown: no admission control
    return max(MIN_BUDGET_BYTES, int(limit * AUTO_SHARE) - resident_bytes)


class MemoryBudget:
    """Bytes reserved by running jobs against a total; 0 total means no limit."""

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self.used = 0
        self.cond = threading.Condition()

    @contextmanager
    def reserve(
        self, nbytes: int, cancel: threading.Event | None = None, *, what: str = "this audio"
    ) -> Iterator[None]:
        if self.total <= 0:
            yield
            return
        if nbytes > self.total:
            raise WorkerError(
                Code.MEMORY_BUDGET_EXCEEDED,
                f"{what} needs about {nbytes / MIB:.0f} MiB to transcribe, more than this"
                f" worker's memory budget of {self.total / MIB:.0f} MiB; send shorter audio"
                " (split it) or give the worker more memory (WHISPER_MEMORY_BUDGET_MB)",
            )
        with self.cond:
            while self.used + nbytes > self.total:
                raise_if_cancelled(cancel)
                self.cond.wait(0.1)
            self.used += nbytes
        try:
            yield
        finally:
            with self.cond:
                self.used -= nbytes
                self.cond.notify_all()
