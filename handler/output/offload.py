"""Results too large for the platform (10 MB on /run) go to S3 and come back as a URL.

The client receives a presigned GET URL for the full result JSON plus the small fields
(language, duration, model, timings). The URL is never logged: its query string is a
credential.
"""

from __future__ import annotations

import json
import logging
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
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    key = f"results/{job_id}.json"
    try:
        no_instance_metadata()
        s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url)
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
