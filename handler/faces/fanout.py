"""A split recording's pieces as ordinary jobs on the worker's own endpoint.

The worker that took the job submits each piece to ``{RUNPOD_ENDPOINT_BASE_URL}/
{RUNPOD_ENDPOINT_ID}/run`` with ``RUNPOD_API_KEY`` (the endpoint's own key, which the user
puts in its environment: the platform gives workers none that may submit jobs), so the
platform's queue and autoscaler bring the workers. It polls ``/status`` until every piece
has ended: a piece that fails, is cancelled by someone else or runs past
``PIECE_TIMEOUT_S`` is submitted once more, and a second failure fails the whole job with
``PIECE_FAILED`` naming the piece; never a result with a hole. Cancelling the job cancels
every piece still running.

A piece still in the queue after ``queue_wait_s`` (no worker free and none started: every
slot of the endpoint's workers may be held by split jobs waiting on their pieces) is
cancelled there and run by this worker itself, one at a time, so a split job always ends:
at worst as slowly as unsplit on one worker.

The pieces travel inline (FLAC, base64) or, when larger than a request takes, as s3://
objects of the piece bucket that the job deletes when it ends (``handler.pipeline.split``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from handler.audio.netfetch import fetch_url
from handler.audio.sources import JOB_DIR_PREFIX
from handler.contract import TERMINAL_JOB_STATES
from handler.errors import Code, WorkerError
from handler.pipeline.runtime import PieceDone
from handler.settings import Settings, load_settings

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.runpod.ai/v2"
TERMINAL = TERMINAL_JOB_STATES
PIECE_TIMEOUT_S = 1800.0
QUEUE_WAIT_S = 60.0
TRIES = 2
REQUEST_TIMEOUT_S = 30.0
MAX_PIECE_RESULT_BYTES = 512 * 2**20
"""A piece's uploaded result read back at most this large (a piece of hours, with words)."""

RunHere = Callable[[int], dict[str, Any]]
"""Runs piece i on this worker; its output (an error dict when it failed)."""


@dataclass
class Piece:
    index: int
    input: dict[str, Any]
    job_id: str | None = None
    tries: int = 0
    submitted: float = 0.0
    output: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    here: bool = False
    """Run by this worker (it waited in the queue past queue_wait_s)."""


class Platform:
    """The endpoint's own queue, as a caller of it sees it."""

    def __init__(
        self,
        base_url: str,
        endpoint_id: str,
        api_key: str,
        *,
        settings: Settings | None = None,
        poll_s: float = 1.0,
        piece_timeout_s: float = PIECE_TIMEOUT_S,
        queue_wait_s: float = QUEUE_WAIT_S,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/{endpoint_id}"
        self.settings = settings if settings is not None else load_settings({})
        self.poll_s = poll_s
        self.piece_timeout_s = piece_timeout_s
        self.queue_wait_s = queue_wait_s
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {api_key}"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        settings: Settings | None = None,
        queue_wait_s: float = QUEUE_WAIT_S,
    ) -> Platform | None:
        """From the worker's environment; None without a key or an endpoint id."""
        env = os.environ if env is None else env
        key, endpoint = env.get("RUNPOD_API_KEY"), env.get("RUNPOD_ENDPOINT_ID")
        if not key or not endpoint:
            return None
        base = env.get("RUNPOD_ENDPOINT_BASE_URL") or DEFAULT_BASE_URL
        return cls(base, endpoint, key, settings=settings, queue_wait_s=queue_wait_s)

    def __call__(
        self,
        inputs: list[dict[str, Any]],
        cancel: threading.Event | None,
        run_here: RunHere | None = None,
        on_done: PieceDone | None = None,
    ) -> list[dict[str, Any]]:
        """Each input run as a job; their outputs (and job ids, tries) in order.
        ``run_here``: how this worker runs a piece that waited too long in the queue;
        ``on_done``: told of each piece's output as soon as that piece has ended."""
        pieces = [Piece(i, inp) for i, inp in enumerate(inputs)]
        try:
            for p in pieces:
                self._submit(p)
            self._wait(pieces, cancel, run_here, on_done)
        except BaseException:
            self._cancel([p for p in pieces if p.output is None and p.job_id and not p.here])
            raise
        return [
            {"output": p.output, "job_id": p.job_id, "tries": p.tries, "here": p.here}
            for p in pieces
        ]

    def _submit(self, p: Piece) -> None:
        p.tries += 1
        try:
            # A piece lives no longer than this job waits for it: one orphaned by a worker
            # that died is dropped by the platform, not run (and billed) hours later.
            policy = {"ttl": int(self.piece_timeout_s * 1000)}
            r = self.http.post(
                f"{self.url}/run",
                json={"input": p.input, "policy": policy},
                timeout=REQUEST_TIMEOUT_S,
            )
            r.raise_for_status()
            p.job_id = str(r.json()["id"])
        except (requests.RequestException, ValueError, KeyError) as exc:
            raise WorkerError(
                Code.PIECE_FAILED,
                f"piece {p.index + 1} could not be submitted to the endpoint: {type(exc).__name__}",
            ) from None
        p.submitted = time.monotonic()
        log.info("piece %d submitted as job %s (try %d)", p.index + 1, p.job_id, p.tries)

    def _status(self, p: Piece) -> dict[str, Any]:
        try:
            r = self.http.get(f"{self.url}/status/{p.job_id}", timeout=REQUEST_TIMEOUT_S)
            r.raise_for_status()
            return dict(r.json())
        except (requests.RequestException, ValueError):
            return {"status": "UNKNOWN"}  # asked again at the next poll

    def _wait(
        self,
        pieces: list[Piece],
        cancel: threading.Event | None,
        run_here: RunHere | None,
        on_done: PieceDone | None,
    ) -> None:
        while live := [p for p in pieces if p.output is None]:
            if cancel is not None and cancel.is_set():
                raise WorkerError(Code.CANCELLED, "the job was cancelled")
            queued: list[Piece] = []
            for p in live:
                status = self._status(p)
                state = status.get("status")
                if state == "IN_QUEUE" and time.monotonic() - p.submitted > self.queue_wait_s:
                    queued.append(p)
                elif state == "COMPLETED":
                    p.output = self._whole(_final(status.get("output")))
                    if p.output is None:
                        self._failed(p, "completed without a result")
                    elif on_done is not None:
                        on_done(p.index, p.output)
                elif state in TERMINAL:
                    self._failed(p, _error_of(status))
                elif time.monotonic() - p.submitted > self.piece_timeout_s:
                    self._cancel([p])
                    self._failed(p, f"still {state} after {self.piece_timeout_s:.0f} s")
            if queued and run_here is not None:
                first = min(queued, key=lambda q: q.submitted)
                self._run_here(first, run_here)
                if first.output is not None and on_done is not None:
                    on_done(first.index, first.output)
            elif any(p.output is None for p in pieces):
                (cancel or threading.Event()).wait(self.poll_s)

    def _run_here(self, p: Piece, run_here: RunHere) -> None:
        """A piece no worker took in time, taken back from the queue and run here."""
        log.info(
            "piece %d waited %.0f s in the queue: running it on this worker",
            p.index + 1,
            time.monotonic() - p.submitted,
        )
        self._cancel([p])
        p.here = True
        output = run_here(p.index)
        if output.get("error_code") == Code.CANCELLED.value:
            raise WorkerError(Code.CANCELLED, "the job was cancelled")
        if "error_code" in output:
            p.here = False  # the next try goes to the queue again
            self._failed(p, f"on this worker: {output['error_code']}")
        else:
            p.output = output

    def _whole(self, output: dict[str, Any] | None) -> dict[str, Any] | None:
        """A piece's result as its worker made it: one over the platform's size limit was
        uploaded to the result bucket and is read back from its presigned URL, through the
        same guard as audio URLs (no private address but the deployment's own S3 endpoint,
        a byte cap, a deadline)."""
        if output is None or "result_url" not in output:
            return output
        url = str(output["result_url"])
        bounded = self.settings.model_copy(update={"max_download_bytes": MAX_PIECE_RESULT_BYTES})
        own_s3 = self.settings.s3_endpoint_url
        trusted = own_s3 is not None and _origin(url) == _origin(own_s3)
        with tempfile.TemporaryDirectory(prefix=JOB_DIR_PREFIX) as tmp:
            dest = Path(tmp) / "result.json"
            try:
                fetch_url(url, dest, bounded, trusted_origin=trusted, display="a piece's result")
                return dict(json.loads(dest.read_bytes()))
            except WorkerError as exc:
                log.warning("a piece's result could not be read: %s", exc.code.value)
                return None  # failed: submitted again, then PIECE_FAILED
            except (ValueError, TypeError):
                return None

    def _failed(self, p: Piece, why: str) -> None:
        p.errors.append(why)
        log.warning("piece %d (job %s) failed: %s", p.index + 1, p.job_id, why)
        if p.tries >= TRIES:
            raise WorkerError(
                Code.PIECE_FAILED, f"piece {p.index + 1} failed {p.tries} times (last: {why})"
            )
        self._submit(p)

    def _cancel(self, pieces: list[Piece]) -> None:
        for p in pieces:
            try:
                self.http.post(f"{self.url}/cancel/{p.job_id}", timeout=REQUEST_TIMEOUT_S)
            except requests.RequestException:
                log.warning("could not cancel piece %d (job %s)", p.index + 1, p.job_id)


def _final(output: Any) -> dict[str, Any] | None:
    """The result in a status's output: the dict, or a streaming worker's last full one."""
    if isinstance(output, dict) and "error_code" not in output:
        return output
    if isinstance(output, list):
        finals = [o for o in output if isinstance(o, dict) and "segment" not in o]
        return finals[-1] if finals and "error" not in finals[-1] else None
    return None


def _error_of(status: Mapping[str, Any]) -> str:
    output = status.get("output")
    code = output.get("error_code") if isinstance(output, dict) else None
    state = str(status.get("status"))
    return f"{state}: {code}" if code else state


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        parts = urlsplit(url)
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "", "", None
