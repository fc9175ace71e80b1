"""Audio sources: untrusted base64, http(s) URLs and s3:// objects into a local file, bounded.

base64 is decoded strictly (a lenient decoder turns a ``data:`` prefix or stray text into
garbage audio); http(s) goes through :mod:`handler.audio.netfetch` (SSRF guard, total deadline,
byte cap); s3:// objects of allowlisted buckets only are signed by boto3 and fetched
through the same netfetch, with the same cap and deadline. Every failure deletes the
partial file and raises a WorkerError whose message shows the URL only through
:func:`redact_url` (an s3:// source as ``s3://bucket/key``, never its signed query).
"""

from __future__ import annotations

import base64
import binascii
import logging
import pathlib
import threading
import time
from urllib.parse import urlsplit

from handler.audio.netfetch import blocked_reason, fetch_url, redact_url
from handler.errors import Code, WorkerError
from handler.settings import Settings, no_instance_metadata

__all__ = [
    "JOB_DIR_PREFIX",
    "blocked_reason",
    "decode_base64",
    "fetch_s3",
    "fetch_to_file",
    "fetch_url",
    "redact_url",
]

log = logging.getLogger(__name__)

JOB_DIR_PREFIX = "whisper-job-"
"""A job's temporary folder (its fetched audio, a reference clip): swept at start-up when a
killed worker left one behind (handler.pipeline.runtime.sweep_stale_job_dirs)."""


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


def s3_display(bucket: str, key: str) -> str:
    """The ``s3://`` form messages name: the bucket exactly as sent (not lowercased), the
    key cut at 200 characters, nothing unprintable."""
    key = key if len(key) <= 200 else key[:200] + "..."
    return "".join(c if c.isprintable() else "?" for c in f"s3://{bucket}/{key}")


def fetch_s3(
    url: str, dest: pathlib.Path, settings: Settings, *, cancel: threading.Event | None = None
) -> int:
    """Download ``s3://bucket/key`` (allowlisted buckets only) into ``dest``, capped.

    boto3 signs a short-lived GET locally (no request, so no wait), and the object is
    fetched through :func:`handler.audio.netfetch.fetch_url`: the same total deadline (against a
    dripping or hanging endpoint too), cap and cancel as an http(s) source. The signed
    query never appears in a message or a log line.
    """
    rest = url.strip()[5:] if url.strip()[:5].lower() == "s3://" else ""
    bucket, _, key = rest.partition("/")
    red = s3_display(bucket, key) if bucket else redact_url(url)
    if not bucket or not key:
        raise WorkerError(Code.INVALID_INPUT, f"s3 URL must be s3://bucket/key: {red}")
    if bucket not in settings.s3_allowed_buckets:
        raise WorkerError(Code.URL_NOT_ALLOWED, f"bucket is not on the allowlist: {red}")
    deadline = time.monotonic() + settings.download_timeout_s
    signed = _presign(bucket, key, settings)
    try:
        return fetch_url(
            signed,
            dest,
            settings,
            cancel=cancel,
            trusted_origin=settings.s3_endpoint_url is not None,
            display=red,
            deadline=deadline,
        )
    except WorkerError as exc:
        if exc.code is Code.SOURCE_HTTP_4XX and exc.retryable is False:
            raise WorkerError(
                Code.SOURCE_HTTP_4XX,
                f"S3 object not found or access denied ({exc.message.split(' from ')[0]};"
                f" a bucket outside this worker's AWS region needs AWS_REGION): {red}",
            ) from None
        raise


def _presign(bucket: str, key: str, settings: Settings) -> str:
    import boto3
    import boto3.session
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, NoCredentialsError

    no_instance_metadata()
    try:
        session = boto3.session.Session()
        if session.get_credentials() is None:
            # Signing without credentials yields an unsigned URL, not an error.
            raise NoCredentialsError()
        client = session.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            config=Config(signature_version="s3v4"),
        )
        # Valid a little past the download deadline: the GET starts at once.
        expires = int(settings.download_timeout_s) + 60
        return client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
        )
    except NoCredentialsError:
        raise WorkerError(
            Code.INTERNAL, "no S3 credentials are configured on this worker", retryable=False
        ) from None
    except BotoCoreError as exc:
        raise WorkerError(
            Code.INTERNAL,
            f"cannot sign the S3 request ({type(exc).__name__}): check the worker's AWS settings",
            retryable=False,
        ) from None
