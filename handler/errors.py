"""Stable error codes and the one exception type the worker raises for a failed job.

Every failed job ends as ``{"error": <sentence>, "error_code": <CODE>, "retryable": bool}``;
``error`` is always a string because the platform only marks a job FAILED for a string.
"""

from __future__ import annotations

from enum import Enum


class Code(str, Enum):
    INVALID_INPUT = "INVALID_INPUT"
    INVALID_BASE64 = "INVALID_BASE64"
    INPUT_TOO_LARGE = "INPUT_TOO_LARGE"
    URL_NOT_ALLOWED = "URL_NOT_ALLOWED"
    SOURCE_HTTP_4XX = "SOURCE_HTTP_4XX"
    SOURCE_HTTP_5XX = "SOURCE_HTTP_5XX"
    SOURCE_TRUNCATED = "SOURCE_TRUNCATED"
    SOURCE_TIMEOUT = "SOURCE_TIMEOUT"
    SOURCE_TOO_LARGE = "SOURCE_TOO_LARGE"
    SOURCE_UNREACHABLE = "SOURCE_UNREACHABLE"
    UNSUPPORTED_OR_CORRUPT_MEDIA = "UNSUPPORTED_OR_CORRUPT_MEDIA"
    CORRUPT_MEDIA = "CORRUPT_MEDIA"
    NO_AUDIO_STREAM = "NO_AUDIO_STREAM"
    EMPTY_AUDIO = "EMPTY_AUDIO"
    AUDIO_TOO_LONG = "AUDIO_TOO_LONG"
    DECODE_TIMEOUT = "DECODE_TIMEOUT"
    UNSUPPORTED_FOR_MODEL = "UNSUPPORTED_FOR_MODEL"
    DIARIZATION_UNAVAILABLE = "DIARIZATION_UNAVAILABLE"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    GPU_OOM = "GPU_OOM"
    COMPUTE_BUDGET_EXCEEDED = "COMPUTE_BUDGET_EXCEEDED"
    MEMORY_BUDGET_EXCEEDED = "MEMORY_BUDGET_EXCEEDED"
    QUEUE_FULL = "QUEUE_FULL"
    NOT_READY = "NOT_READY"
    CANCELLED = "CANCELLED"
    SPLIT_UNAVAILABLE = "SPLIT_UNAVAILABLE"
    PIECE_FAILED = "PIECE_FAILED"
    WORKER_LOST = "WORKER_LOST"
    EMPTY_TRANSCRIPT = "EMPTY_TRANSCRIPT"
    LANGUAGE_UNCERTAIN = "LANGUAGE_UNCERTAIN"
    TOO_LITTLE_SPEECH = "TOO_LITTLE_SPEECH"
    INTERNAL = "INTERNAL"


# Codes a client may simply resubmit: the fault was transient or on our side.
RETRYABLE: frozenset[Code] = frozenset(
    {
        Code.SOURCE_HTTP_5XX,
        Code.SOURCE_TIMEOUT,
        Code.SOURCE_TRUNCATED,
        Code.SOURCE_UNREACHABLE,
        Code.GPU_OOM,
        Code.EMPTY_TRANSCRIPT,
        Code.QUEUE_FULL,
        Code.NOT_READY,
        Code.PIECE_FAILED,
        Code.INTERNAL,
    }
)


def is_oom(exc: BaseException) -> bool:
    """Whether an exception from the model is CUDA running out of memory."""
    text = str(exc).lower()
    return "out of memory" in text or "cuda_error_out_of_memory" in text


class WorkerError(Exception):
    """A job failure with a stable code and a message safe to show to the client.

    The message must never contain a URL query string, a credential, a hostname of this
    machine, a traceback or transcript text.
    """

    def __init__(self, code: Code, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.code = Code(code)
        self.message = message
        self.retryable = self.code in RETRYABLE if retryable is None else retryable

    def to_result(self) -> dict:
        """The error result. ``message`` repeats ``error`` because the platform moves
        ``error`` out of the job's output: without it the runpod SDK's ``run_sync`` and
        ``Job.output()`` hand their callers the code and no sentence."""
        return {
            "error": self.message,
            "error_code": self.code.value,
            "retryable": self.retryable,
            "message": self.message,
        }
