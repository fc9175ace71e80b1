"""What is too large for the platform's requests (10 MB on /run) goes through S3.

Results: the client receives a presigned GET URL for the full result JSON plus the small
fields (language, duration, model, timings). The URL is never logged: its query string is
a credential. A split job's pieces (:class:`PieceStore`): objects its pieces' jobs read as
s3://, deleted when the job ends.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from types import TracebackType
from typing import Any

from handler.errors import Code, WorkerError
from handler.settings import Settings, no_instance_metadata

log = logging.getLogger(__name__)

# Keys small enough to keep inline next to the URL.
SUMMARY_KEYS = ("language", "language_probability", "duration", "model", "device", "warnings")


def result_size(output: dict[str, Any]) -> int:
    return len(json.dumps(output, ensure_ascii=False).encode())


def deliver(output: dict[str, Any], settings: Settings, job_id: str) -> dict[str, Any]:
    """Return ``output`` as is when it fits, else upload it and return a summary with a URL."""
    size = result_size(output)
    if size <= settings.max_result_bytes:
        return output
    if not settings.result_bucket:
        raise WorkerError(
            Code.RESULT_TOO_LARGE,
            f"the result is {size} bytes, over the {settings.max_result_bytes}-byte limit, and "
            "no result bucket is configured (WHISPER_RESULT_BUCKET); ask for fewer formats",
        )
    from botocore.exceptions import BotoCoreError, ClientError

    key = f"results/{job_id}.json"
    try:
        s3 = s3_client(settings)
        s3.put_object(
            Bucket=settings.result_bucket,
            Key=key,
            Body=json.dumps(output, ensure_ascii=False).encode(),
            ContentType="application/json",
        )
        url = s3.generate_presigned_url(
            "get_object",
            Params={"Bucket": settings.result_bucket, "Key": key},
            ExpiresIn=settings.result_url_ttl_s,
        )
    except (BotoCoreError, ClientError) as exc:
        log.warning("result upload failed: %s", type(exc).__name__)
        raise WorkerError(
            Code.INTERNAL, "the result was too large to return and could not be uploaded"
        ) from None
    log.info(
        "job %s: %d-byte result uploaded to s3://%s/%s", job_id, size, settings.result_bucket, key
    )
    summary = {k: output[k] for k in SUMMARY_KEYS if k in output}
    return {**summary, "result_url": url, "result_bytes": size, "timings": output.get("timings")}


class PieceStore:
    """A split job's pieces too large to travel inline, as objects of the piece bucket
    (``WHISPER_PIECE_BUCKET``) under ``pieces/<random>/``; every one is deleted on leaving
    the ``with`` block, whether the job completed, failed or was cancelled. ``put`` may be
    called from several threads at once."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.prefix = f"pieces/{uuid.uuid4().hex}/"
        self.keys: list[str] = []
        self._s3: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> PieceStore:
        return self

    def put(self, index: int, data: bytes, count: int) -> str:
        """Piece ``index`` (FLAC) uploaded; the s3:// URL its job reads."""
        bucket = self.settings.piece_bucket
        if not bucket:
            raise WorkerError(
                Code.INPUT_TOO_LARGE,
                f"piece {index + 1} of {count} is {len(data) * 4 / 3 / 1e6:.1f} MB as base64, "
                "over what one request to the platform takes, and this endpoint has no piece "
                "bucket (WHISPER_PIECE_BUCKET): split into more pieces (or 'auto')",
            )
        from botocore.exceptions import BotoCoreError, ClientError

        key = f"{self.prefix}{index + 1}.flac"
        try:
            self._client().put_object(Bucket=bucket, Key=key, Body=data, ContentType="audio/flac")
        except (BotoCoreError, ClientError) as exc:
            log.warning("piece upload failed: %s", type(exc).__name__)
            raise WorkerError(
                Code.PIECE_FAILED,
                f"piece {index + 1} could not be put in the piece bucket",
                retryable=True,
            ) from None
        self.keys.append(key)
        return f"s3://{bucket}/{key}"

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.keys:
            return
        from botocore.exceptions import BotoCoreError, ClientError

        objects = [{"Key": k} for k in self.keys]
        try:
            self._client().delete_objects(
                Bucket=self.settings.piece_bucket, Delete={"Objects": objects, "Quiet": True}
            )
        except (BotoCoreError, ClientError) as err:
            log.warning(
                "could not delete %d piece objects under %s: %s",
                len(self.keys),
                self.prefix,
                type(err).__name__,
            )

    def _client(self) -> Any:
        with self._lock:  # the pieces are put from several threads; one client serves all
            if self._s3 is None:
                self._s3 = s3_client(self.settings)
            return self._s3


def s3_client(settings: Settings) -> Any:
    """A client for the deployment's S3 (``s3_endpoint_url``), off the metadata service."""
    import boto3

    no_instance_metadata()
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url)
