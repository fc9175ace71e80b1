"""OpenAI's error bodies and statuses: a job's error code as OpenAI's HTTP status and
``error`` object, and the body for a route this server does not serve."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handler.errors import Code

HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_INPUT: 400,
    Code.INVALID_BASE64: 400,
    Code.URL_NOT_ALLOWED: 400,
    Code.UNSUPPORTED_FOR_MODEL: 400,
    Code.DIARIZATION_UNAVAILABLE: 400,
    Code.SPLIT_UNAVAILABLE: 400,
    Code.SOURCE_HTTP_4XX: 400,
    Code.INPUT_TOO_LARGE: 413,
    Code.SOURCE_TOO_LARGE: 413,
    Code.AUDIO_TOO_LONG: 413,
    Code.RESULT_TOO_LARGE: 413,
    Code.UNSUPPORTED_OR_CORRUPT_MEDIA: 415,
    Code.NO_AUDIO_STREAM: 415,
    Code.CORRUPT_MEDIA: 422,
    Code.EMPTY_AUDIO: 422,
    Code.DECODE_TIMEOUT: 422,
    Code.SOURCE_HTTP_5XX: 502,
    Code.SOURCE_UNREACHABLE: 502,
    Code.SOURCE_TRUNCATED: 502,
    Code.PIECE_FAILED: 502,
    Code.WORKER_LOST: 422,
    Code.EMPTY_TRANSCRIPT: 503,
    Code.LANGUAGE_UNCERTAIN: 422,
    Code.TOO_LITTLE_SPEECH: 422,
    Code.SOURCE_TIMEOUT: 504,
    Code.COMPUTE_BUDGET_EXCEEDED: 422,
    Code.MEMORY_BUDGET_EXCEEDED: 413,
    Code.QUEUE_FULL: 429,
    Code.NOT_READY: 503,
    Code.GPU_OOM: 503,
    Code.CANCELLED: 499,
    Code.INTERNAL: 500,
}
_TYPES = {
    400: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
}


def error_body(error: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, OpenAI's error body) for a job's error result."""
    code = Code(error["error_code"])
    status = HTTP_STATUS[code]
    kind = _TYPES.get(status, "rate_limit_error" if status == 429 else "server_error")
    return status, {
        "error": {
            "message": error["error"],
            "type": kind,
            "param": None,
            "code": code.value,
            "retryable": bool(error.get("retryable")),
        }
    }


NOT_ROUTED = {404: "not_found", 405: "method_not_allowed"}


def request_error(message: str, code: str) -> dict[str, Any]:
    """OpenAI's body for a request it refuses (``invalid_request_error``)."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": code,
        }
    }


def not_routed(method: str, path: str, status: int) -> dict[str, Any]:
    """OpenAI's error body for a path or method this server does not serve."""
    what = "unknown route" if status == 404 else f"method {method} not allowed on"
    return request_error(
        f"{what} {path}; see /v1/models and /v1/audio/transcriptions",
        NOT_ROUTED.get(status, "invalid_request"),
    )
