"""A split job's pieces in the piece bucket, sealed by the job that cut them.

The parent records each piece's SHA-256 and signs (HMAC-SHA256) the piece's s3:// URL, that
digest and an expiry with a secret every worker of the endpoint shares
(``WHISPER_PIECE_SECRET``, else the endpoint's ``RUNPOD_API_KEY``, which a split needs
anyway). A job reading an object of the piece bucket must carry a valid seal (so no caller
can read another job's piece by its key), and the bytes it downloads must match the digest
(so a piece overwritten in the bucket while the job runs is refused, not stitched in).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from handler.errors import Code, WorkerError
from handler.settings import Settings


def secret_of(settings: Settings, env: Mapping[str, str] | None = None) -> bytes | None:
    env = os.environ if env is None else env
    if settings.piece_secret is not None:
        return settings.piece_secret.get_secret_value().encode()
    key = env.get("RUNPOD_API_KEY")
    return key.encode() if key else None


def in_piece_bucket(url: str, settings: Settings) -> bool:
    bucket = settings.piece_bucket
    return bool(bucket) and url.strip().lower().startswith(f"s3://{bucket}/".lower())


def _mac(secret: bytes, url: str, sha256: str, expires: int) -> str:
    message = f"whisper-piece\n{url}\n{sha256}\n{expires}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def seal(url: str, data: bytes, ttl_s: float, secret: bytes) -> dict[str, Any]:
    """The ``piece`` field of the job that reads ``url``: its digest, expiry, signature."""
    sha256 = hashlib.sha256(data).hexdigest()
    expires = int(time.time() + ttl_s)
    return {"sha256": sha256, "expires": expires, "sig": _mac(secret, url, sha256, expires)}


def check(url: str, piece: Any, settings: Settings) -> str:
    """The digest ``url``'s bytes must have; URL_NOT_ALLOWED without a valid seal."""
    secret = secret_of(settings)
    refused = "objects of the piece bucket are read only by the pieces this endpoint's jobs cut"
    if piece is None or secret is None:
        raise WorkerError(Code.URL_NOT_ALLOWED, f"{refused} (no valid seal)")
    good = _mac(secret, url.strip(), piece.sha256, piece.expires)
    if not hmac.compare_digest(good, piece.sig):
        raise WorkerError(Code.URL_NOT_ALLOWED, f"{refused} (the seal does not match)")
    if piece.expires < time.time():
        raise WorkerError(Code.URL_NOT_ALLOWED, f"{refused} (the seal has expired)")
    return str(piece.sha256)


def verify_file(path: Path, sha256: str) -> None:
    """The downloaded piece is the one its parent cut, byte for byte."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if not hmac.compare_digest(h.hexdigest(), sha256):
        raise WorkerError(
            Code.INVALID_INPUT,
            "the piece in the bucket is not the one its job was cut with (it changed after "
            "it was put there): refused",
        )
