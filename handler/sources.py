"""Audio sources: untrusted base64, http(s) URLs and s3:// objects into a local file, bounded.

base64 is decoded strictly (a lenient decoder turns a ``data:`` prefix or stray text into
garbage audio); http(s) goes through :mod:`handler.netfetch` (SSRF guard, total deadline,
byte cap); s3:// is read with boto3 from allowlisted buckets only, with the same cap and
deadline. Every failure deletes the partial file and raises a WorkerError whose message
shows the URL only through :func:`redact_url`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import pathlib
import threading
import time
from urllib.parse import urlsplit

from handler.errors import Code, WorkerError
from handler.guard import Guard
from handler.netfetch import CHUNK_BYTES, blocked_reason, fetch_url, redact_url, too_large
from handler.settings import Settings, no_instance_metadata

__all__ = [
    "blocked_reason",
    "decode_base64",
    "fetch_s3",
    "fetch_to_file",
    "fetch_url",
    "redact_url",
]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- base64


def decode_base64(data: str, max_bytes: int) -> bytes:
    """Decode raw base64 or a ``data:<mime>;base64,`` URI, strictly, capped at ``max_bytes``.

    Tolerated: surrounding/line-break whitespace, the URL-safe alphabet and missing padding.
    Whitespace inside the payload must look like line wrapping (lines of at least 16
    characters, the inner ones of equal length; the first may be shorter when a ``data:``
    prefix shared its line), so that plain text ("hello world") is not read as base64.
    """
    if not isinstance(data, str):
        raise WorkerError(Code.INVALID_BASE64, "audio_base64 must be a string")
    # Cheap bound before any copy: even pure line breaks cannot double the length.
    if len(data) > 2 * (max_bytes * 4 // 3 + 4) + 1024:
        raise _too_large_inline(max_bytes)
    text = data.strip()
    if text[:5].lower() == "data:":
        header, sep, text = text.partition(",")
        if not sep or not header.lower().endswith(";base64"):
            raise WorkerError(Code.INVALID_BASE64, "audio_base64 data: URI is not ';base64,'")
    tokens = text.split()
    if len(tokens) > 1:
        inner = {len(t) for t in tokens[1:-1]}
        if min(len(t) for t in tokens[:-1]) < 16 or len(inner) > 1:
            raise WorkerError(
                Code.INVALID_BASE64, "audio_base64 is not base64 (whitespace inside the data)"
            )
    payload = "".join(tokens).rstrip("=")
    if not payload:
        raise WorkerError(Code.INVALID_BASE64, "audio_base64 is empty")
    if len(payload) * 3 // 4 > max_bytes:
        raise _too_large_inline(max_bytes)
    if not payload.isascii() or len(payload) % 4 == 1:
        raise WorkerError(Code.INVALID_BASE64, "audio_base64 is not valid base64")
    payload = payload.replace("-", "+").replace("_", "/") + "=" * (-len(payload) % 4)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise WorkerError(Code.INVALID_BASE64, "audio_base64 is not valid base64") from None


def _too_large_inline(max_bytes: int) -> WorkerError:
    return WorkerError(
        Code.INPUT_TOO_LARGE,
        f"audio_base64 decodes to more than {max_bytes} bytes; "
        "send a URL (audio_url) or s3:// instead",
    )


# --------------------------------------------------------------------------- dispatch


def fetch_to_file(
    source: str, dest: pathlib.Path, settings: Settings, *, cancel: threading.Event | None = None
) -> int:
    """Fetch an http(s):// or s3:// source into ``dest``; any other scheme is refused."""
    try:
        scheme = urlsplit(source.strip()).scheme.lower()
    except (ValueError, AttributeError):
        scheme = ""
    if scheme in ("http", "https"):
        return fetch_url(source, dest, settings, cancel=cancel)
    if scheme == "s3":
        return fetch_s3(source, dest, settings, cancel=cancel)
    raise WorkerError(
        Code.URL_NOT_ALLOWED,
        f"audio_url scheme {scheme + ':' if scheme else '(none)'} is not allowed; "
        "use http://, https:// or s3://",
    )


# --------------------------------------------------------------------------- s3


def fetch_s3(
    url: str, dest: pathlib.Path, settings: Settings, *, cancel: threading.Event | None = None
) -> int:
    """Download ``s3://bucket/key`` (allowlisted buckets only) into ``dest``, capped."""
    red = redact_url(url)
    rest = url.strip()[5:] if url.strip()[:5].lower() == "s3://" else ""
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise WorkerError(Code.INVALID_INPUT, f"s3 URL must be s3://bucket/key: {red}")
    if bucket not in settings.s3_allowed_buckets:
        raise WorkerError(Code.URL_NOT_ALLOWED, f"bucket is not on the allowlist: {red}")
    started = time.monotonic()
    guard = Guard.within(
        settings.download_timeout_s,
        cancel,
        Code.SOURCE_TIMEOUT,
        f"download did not finish within the time limit: {red}",
    )
    try:
        size = _fetch_s3(bucket, key, dest, settings, guard, red)
    except BaseException as exc:
        pathlib.Path(dest).unlink(missing_ok=True)
        if isinstance(exc, WorkerError):
            log.warning("fetch failed: %s (%s)", exc.code.value, red)
        raise
    log.info("fetched %d bytes in %.2fs from %s", size, time.monotonic() - started, red)
    return size


def _fetch_s3(
    bucket: str, key: str, dest: pathlib.Path, settings: Settings, guard: Guard, red: str
) -> int:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    cap = settings.max_download_bytes
    config = Config(
        connect_timeout=settings.connect_timeout_s,
        read_timeout=min(settings.download_timeout_s, 60.0),
        retries={"max_attempts": 3, "mode": "standard"},
    )
    try:
        no_instance_metadata()
        client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)
        head = client.head_object(Bucket=bucket, Key=key)
        size = int(head["ContentLength"])
        if size > cap:
            raise too_large(red, cap)
        guard.check()
        body = client.get_object(Bucket=bucket, Key=key, IfMatch=head["ETag"])["Body"]
        total = 0
        with open(dest, "wb") as out:
            for chunk in body.iter_chunks(CHUNK_BYTES):
                guard.check()
                total += len(chunk)
                if total > cap:
                    raise too_large(red, cap)
                out.write(chunk)
        body.close()
    except ClientError as exc:
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if status >= 500:
            raise WorkerError(Code.SOURCE_HTTP_5XX, f"S3 answered HTTP {status}: {red}") from None
        raise WorkerError(
            Code.SOURCE_HTTP_4XX, f"S3 object not found or access denied (HTTP {status}): {red}"
        ) from None
    except NoCredentialsError:
        raise WorkerError(
            Code.INTERNAL, "no S3 credentials are configured on this worker", retryable=False
        ) from None
    except BotoCoreError:
        guard.check()
        raise WorkerError(Code.SOURCE_UNREACHABLE, f"S3 request failed: {red}") from None
    if total < size:
        raise WorkerError(
            Code.SOURCE_TRUNCATED, f"S3 body ended after {total} of {size} bytes: {red}"
        )
    return total
