"""A small client for a deployed worker: RunPod's public API (`/run`, `/runsync`, `/status`,
`/stream`, `/cancel`) through `requests`, and the `python -m whisper_client` command.

`Client(endpoint_id).transcribe("talk.mp3")` sends a local file inline as base64 when the
request fits the platform's body limit and refuses it before sending otherwise (upload it
and pass an https:// or s3:// URL, or give ``upload_to="s3://bucket/prefix/"``: the client
puts the file there with the caller's AWS credentials, sends a presigned URL and deletes
the object when the job ends). Every failure, from the platform or from the worker,
is one `ClientError` whose `str()` is ``CODE: message``. Runs against the local emulator
too: pass its `base_url`.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import requests

from handler.contract import TERMINAL_JOB_STATES

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.runpod.ai/v2"
# The platform's documented body limits ("10 MB", "20 MB"); decimal megabytes are the
# stricter reading, so a request we send is never refused for size.
RUN_LIMIT_BYTES = 10_000_000
RUNSYNC_LIMIT_BYTES = 20_000_000
TERMINAL = TERMINAL_JOB_STATES
URL_SCHEMES = ("http://", "https://", "s3://")

_HTTP_CODES = {
    401: ("UNAUTHORIZED", "the API key was refused; set RUNPOD_API_KEY to a key for this endpoint"),
    403: ("FORBIDDEN", "the API key may not use this endpoint"),
    404: (
        "NOT_FOUND",
        "no such endpoint or job (results are kept 30 min after /run, 1 min after /runsync)",
    ),
    413: ("PAYLOAD_TOO_LARGE", "the platform refused the request body as too large"),
    429: ("RATE_LIMITED", "too many requests; try again later"),
}
_CODE_PREFIX = re.compile(r"^([A-Z][A-Z0-9_]{2,}): (.+)$", re.DOTALL)

ProgressFn = Callable[[float], None]
PartialFn = Callable[[dict[str, Any]], None]
StatusFn = Callable[[dict[str, Any]], None]


class ClientError(Exception):
    """A failed call or job: a stable `code` and a one-line `message` without secrets."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        job_id: str | None = None,
        retryable: bool | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.job_id = job_id
        self.retryable = retryable
        self.http_status = http_status


def is_url(audio: str | os.PathLike[str]) -> bool:
    return isinstance(audio, str) and audio.lower().startswith(URL_SCHEMES)


def request_size(job_input: Mapping[str, Any], extra_b64_chars: int = 0) -> int:
    """Bytes of the `{"input": ...}` body, plus base64 text not yet in `job_input`.

    Base64 characters need no JSON escaping, so the sum is exact.
    """
    return len(json.dumps({"input": job_input}).encode()) + extra_b64_chars


def audio_input(
    audio: str | os.PathLike[str], options: Mapping[str, Any], *, limit: int, sync: bool
) -> dict[str, Any]:
    """The job input for `audio` (a URL or a local file); refuses an inline file that would
    make the request larger than `limit`, before reading or encoding it."""
    if is_url(audio):
        return {"audio_url": str(audio), **options}
    path = Path(audio)
    if not path.is_file():
        raise ClientError("INPUT_NOT_FOUND", f"no such file: {path}")
    size = path.stat().st_size
    b64_chars = 4 * math.ceil(size / 3)
    body = request_size({"audio_base64": "", **options}, b64_chars)
    if body > limit:
        hint = ""
        if not sync and body <= RUNSYNC_LIMIT_BYTES:
            hint = " or use --sync / sync=True (20 MB limit)"
        raise ClientError(
            "INPUT_TOO_LARGE",
            f"{path.name} is {size / 1e6:.1f} MB; sent inline as base64 the request would be "
            f"{body / 1e6:.1f} MB, over the platform's {limit / 1e6:.0f} MB limit for "
            f"{'/runsync' if sync else '/run'}. Upload it and pass an https:// URL (a presigned "
            f"URL works) or an s3:// URL instead, or let the client do it with --upload-to "
            f"s3://bucket/prefix/ (upload_to=){hint}.",
        )
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"audio_base64": encoded, **options}


class Upload:
    """A local file put in the caller's bucket for one job: ``url`` is a presigned GET the
    worker fetches (no bucket allowlist needed on the endpoint); the object is deleted on
    leaving the ``with`` block. boto3 finds the credentials and endpoint as it always does
    (AWS_* variables, profiles, AWS_ENDPOINT_URL for R2 or MinIO)."""

    def __init__(self, path: Path, upload_to: str, ttl_s: int) -> None:
        rest = upload_to[5:] if upload_to[:5].lower() == "s3://" else ""
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise ClientError("INVALID_UPLOAD", "--upload-to wants s3://bucket/prefix/")
        prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.key = f"{prefix}{uuid.uuid4().hex}/{path.name}"
        self.path, self.ttl_s = path, ttl_s
        self.url = ""

    def __enter__(self) -> Upload:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
        from botocore.exceptions import ClientError as S3Error

        # SigV4: every AWS region takes it (SigV2 presigned URLs are refused by newer ones).
        self._s3 = boto3.client("s3", config=Config(signature_version="s3v4"))
        try:
            self._s3.upload_file(str(self.path), self.bucket, self.key)
            self.url = self._s3.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.key},
                ExpiresIn=self.ttl_s,
            )
        except (BotoCoreError, S3Error) as exc:
            raise ClientError(
                "UPLOAD_FAILED",
                f"could not put {self.path.name} in s3://{self.bucket}/: {type(exc).__name__}",
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        from botocore.exceptions import BotoCoreError
        from botocore.exceptions import ClientError as S3Error

        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self.key)
        except (BotoCoreError, S3Error) as err:
            log.warning(
                "could not delete s3://%s/%s: %s", self.bucket, self.key, type(err).__name__
            )


def output_of(status: Mapping[str, Any]) -> dict[str, Any]:
    """The result dict of a finished job's status object; `ClientError` for any failure.

    A streaming worker's aggregated output is the list of what it yielded: segment items,
    then the full result.
    """
    job_id = status.get("id")
    state = status.get("status")
    if state == "COMPLETED":
        output = status.get("output")
        if isinstance(output, list):
            finals = [o for o in output if isinstance(o, dict) and "segment" not in o]
            if finals:
                return finals[-1]
            segments = [o["segment"] for o in output if isinstance(o, dict) and "segment" in o]
            return {"text": "".join(s.get("text", "") for s in segments).strip()}
        if isinstance(output, dict):
            return output
        raise ClientError(
            "NO_OUTPUT",
            f"job {job_id} completed without output (a result over the platform's size "
            "limit is dropped)",
            job_id=job_id,
        )
    if state == "FAILED":
        raise _job_error(status)
    if state == "CANCELLED":
        raise ClientError("CANCELLED", f"job {job_id} was cancelled", job_id=job_id)
    if state == "TIMED_OUT":
        raise ClientError(
            "TIMED_OUT",
            f"job {job_id} timed out on the platform (execution timeout, queue TTL, or its "
            "worker was lost)",
            job_id=job_id,
            retryable=True,
        )
    raise ClientError("NOT_FINISHED", f"job {job_id} is {state}", job_id=job_id)


def result_of(output: Any) -> dict[str, Any] | None:
    """The result dict in what the runpod SDK's ``Endpoint.run_sync`` or ``Job.output()``
    returns: the dict itself, or, from a streaming worker (``WHISPER_STREAM=true``), the
    last full result of the list it aggregated (segment items come first). None when there
    is none (the SDK returns None for a failed streaming job: ask ``Job.status()``)."""
    if isinstance(output, dict):
        return output
    if isinstance(output, list):
        finals = [o for o in output if isinstance(o, dict) and "segment" not in o]
        return finals[-1] if finals else None
    return None


class _Partials:
    """Segments handed to a caller's `on_partial`, each once, in order (by segment id)."""

    def __init__(self, on_partial: PartialFn) -> None:
        self.on_partial = on_partial
        self.seen: set[Any] = set()

    def _give(self, segment: dict[str, Any]) -> bool:
        key = segment.get("id", ("text", segment.get("start"), segment.get("text")))
        if key in self.seen:
            return False
        self.seen.add(key)
        self.on_partial(segment)
        return True

    def feed(self, chunk: Mapping[str, Any]) -> int:
        """The segments of one `/stream` answer; returns how many were new."""
        given = 0
        for item in chunk.get("stream") or []:
            out = item.get("output") if isinstance(item, dict) else None
            if isinstance(out, dict) and isinstance(out.get("segment"), dict):
                given += self._give(out["segment"])
        return given

    def complete(self, segments: list[Any]) -> None:
        """The result's segments the stream did not carry, shaped as streamed ones."""
        for seg in segments:
            if isinstance(seg, dict) and seg.get("id") not in self.seen:
                self._give({k: seg[k] for k in ("id", "start", "end", "text") if k in seg})


def _job_error(status: Mapping[str, Any]) -> ClientError:
    job_id = status.get("id")
    error = str(status.get("error") or "the job failed")
    raw_output = status.get("output")
    output: Mapping[str, Any] = raw_output if isinstance(raw_output, dict) else {}
    code = output.get("error_code")
    if not code and (m := _CODE_PREFIX.match(error)):
        # A streaming worker can only send one string: "CODE: message".
        code, error = m.group(1), m.group(2)
    if not code:
        code = "WORKER_EXCEPTION"
        try:
            # The SDK reports a handler exception as JSON with a traceback and hostname:
            # keep only the message.
            error = str(json.loads(error)["error_message"])
        except (ValueError, KeyError, TypeError):
            error = error.removeprefix("handler: ").split("\n")[0].strip()
    return ClientError(str(code), error[:500], job_id=job_id, retryable=output.get("retryable"))


def _progress_of(status: Mapping[str, Any]) -> float | None:
    output = status.get("output")
    if isinstance(output, dict):
        output = output.get("progress")
    if isinstance(output, (int, float)) and not isinstance(output, bool):
        return float(output)
    return None


class Client:
    """One endpoint of RunPod's public API (or the local emulator's)."""

    def __init__(
        self,
        endpoint_id: str,
        api_key: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        *,
        retries: int = 3,
        retry_backoff_s: float = 0.5,
        poll_initial_s: float = 0.25,
        poll_max_s: float = 5.0,
        timeout_s: float = 60.0,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", endpoint_id or ""):
            raise ClientError("INVALID_ENDPOINT", "an endpoint id is letters, digits, - or _")
        key = api_key if api_key is not None else os.environ.get("RUNPOD_API_KEY")
        if not key:
            raise ClientError("NO_API_KEY", "set RUNPOD_API_KEY to your RunPod API key")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ClientError("INVALID_BASE_URL", "the base URL must be http(s)://host/...")
        # Query strings and user info never go into a URL we build or print.
        self._host = parts.hostname or "?"
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/{endpoint_id}"
        self.endpoint_id = endpoint_id
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.poll_initial_s = poll_initial_s
        self.poll_max_s = poll_max_s
        self.timeout_s = timeout_s
        self._session = requests.Session()
        self._session.headers.update(
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        )

    def __repr__(self) -> str:
        return f"Client(endpoint_id={self.endpoint_id!r}, host={self._host!r})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ raw calls
    def run(
        self,
        job_input: Mapping[str, Any],
        *,
        webhook: str | None = None,
        policy: Mapping[str, Any] | None = None,
    ) -> str:
        """`POST /run`; returns the job id."""
        body = self._body(job_input, RUN_LIMIT_BYTES, "/run", webhook, policy)
        answer = self._call("POST", "run", body=body, resend=True)
        return str(answer["id"])

    def runsync(
        self,
        job_input: Mapping[str, Any],
        wait_ms: int = 60_000,
        *,
        policy: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`POST /runsync?wait=`: the status object, finished or as it was when the wait
        ran out (1 s to 300 s)."""
        wait_ms = min(max(int(wait_ms), 1000), 300_000)
        body = self._body(job_input, RUNSYNC_LIMIT_BYTES, "/runsync", None, policy)
        return self._call(
            "POST",
            f"runsync?wait={wait_ms}",
            body=body,
            resend=True,
            read_timeout=wait_ms / 1000 + self.timeout_s,
        )

    def status(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"status/{_job_path(job_id)}")

    def stream(self, job_id: str) -> dict[str, Any]:
        """`GET /stream`: `{"status", "stream": [{"output": item}, ...]}`, new items only."""
        return self._call("GET", f"stream/{_job_path(job_id)}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"cancel/{_job_path(job_id)}")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "health")

    # ------------------------------------------------------------------ waiting
    def wait(
        self,
        job_id: str,
        *,
        on_progress: ProgressFn | None = None,
        on_partial: PartialFn | None = None,
        on_status: StatusFn | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; returns its final status object (see `output_of`).

        `/status` is polled with exponential backoff. With `on_partial`, `/stream` is
        read instead (it answers as soon as a segment arrives) and `/status` only as
        often as the backoff allows, for progress. `ClientError("TIMEOUT")` after
        `timeout` seconds; the job keeps running.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = self.poll_initial_s
        next_status = 0.0
        last_state = None
        last_progress = None
        partials = _Partials(on_partial) if on_partial is not None else None
        while True:
            status: dict[str, Any] | None = None
            if partials is not None:
                chunk = self.stream(job_id)
                partials.feed(chunk)
                if chunk.get("status") in TERMINAL:
                    status = self.status(job_id)
            if status is None and time.monotonic() >= next_status:
                status = self.status(job_id)
                next_status = time.monotonic() + delay
            if status is not None:
                state = status.get("status")
                if state != last_state and on_status is not None:
                    on_status(status)
                last_state = state
                if state in TERMINAL:
                    if partials is not None:
                        self._finish_partials(job_id, status, partials)
                    return status
                progress = _progress_of(status) if state == "IN_PROGRESS" else None
                if progress is not None and progress != last_progress and on_progress:
                    on_progress(progress)
                    last_progress = progress
            if deadline is not None and time.monotonic() >= deadline:
                raise ClientError(
                    "TIMEOUT",
                    f"job {job_id} still {last_state} after {timeout:g} s",
                    job_id=job_id,
                )
            # The stream read already waited server-side; a short pause keeps a platform
            # that answers /stream at once from being polled in a tight loop.
            pause = min(delay, 1.0) if on_partial is not None else delay
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 2, self.poll_max_s)

    def _finish_partials(self, job_id: str, status: dict[str, Any], partials: _Partials) -> None:
        """The job ended: hand over what the stream still holds, then any segment of the
        result the stream never carried. A /status read can see the job done before the
        /stream read that would have carried its last segments (the caller showed
        a transcript that stopped short of the result)."""
        for _ in range(3):  # a finished job's /stream answers at once; an empty one ends it
            try:
                chunk = self.stream(job_id)
            except ClientError:
                break
            if not partials.feed(chunk):
                break
        if status.get("status") == "COMPLETED":
            result = result_of(status.get("output"))
            if result is not None:
                partials.complete(result.get("segments") or [])

    def transcribe(
        self,
        audio: str | os.PathLike[str],
        *,
        output: list[str] | None = None,
        sync: bool = False,
        stream: bool = False,
        wait_ms: int = 60_000,
        timeout: float | None = None,
        on_submit: Callable[[str], None] | None = None,
        on_progress: ProgressFn | None = None,
        on_partial: PartialFn | None = None,
        on_status: StatusFn | None = None,
        split: int | str | None = None,
        upload_to: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Transcribe a local file or a URL; returns the worker's result dict.

        `split` (2-32 or "auto": a piece per 4 min) has the worker fan the recording out
        as that many jobs of the same endpoint, run by as many workers as the platform
        brings, and stitch one result (the endpoint needs RUNPOD_API_KEY in its
        environment; docs/platform.md). `upload_to` ("s3://bucket/prefix/"): a local file
        goes there (the caller's AWS credentials) and the job gets a presigned URL to it;
        the object is deleted when the job ends. `options` are job input fields (language, model,
        beam_size, ...). `stream=True`
        reads partial segments into `on_partial` (needs a worker deployed with
        WHISPER_STREAM=true; uses /run even when `sync`). `sync=True` uses /runsync and
        falls back to polling when its wait runs out. On Ctrl-C or `timeout` the job is
        cancelled (it would otherwise run and bill on) and the exception propagates.
        """
        if upload_to is not None and not is_url(audio):
            path = Path(audio)
            if not path.is_file():
                raise ClientError("INPUT_NOT_FOUND", f"no such file: {path}")
            ttl = max(3600, int(timeout or 0) + 600)
            with Upload(path, upload_to, ttl) as up:
                return self.transcribe(
                    up.url,
                    output=output,
                    sync=sync,
                    stream=stream,
                    wait_ms=wait_ms,
                    timeout=timeout,
                    on_submit=on_submit,
                    on_progress=on_progress,
                    on_partial=on_partial,
                    on_status=on_status,
                    split=split,
                    **options,
                )
        sync = sync and not stream
        if output is not None:
            options["output"] = list(output)
        if split is not None:
            options["split"] = split
        limit = RUNSYNC_LIMIT_BYTES if sync else RUN_LIMIT_BYTES
        job_input = audio_input(audio, options, limit=limit, sync=sync)
        deadline = None if timeout is None else time.monotonic() + timeout
        job_id: str | None = None
        try:
            if sync:
                if timeout is not None:
                    wait_ms = min(wait_ms, max(1000, int(timeout * 1000)))
                status = self.runsync(job_input, wait_ms)
                job_id = str(status.get("id"))
                if on_submit:
                    on_submit(job_id)
                if status.get("status") in TERMINAL:
                    return output_of(status)
            else:
                job_id = self.run(job_input)
                if on_submit:
                    on_submit(job_id)
            del job_input  # the base64 copy can be large; the wait can be long
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            status = self.wait(
                job_id,
                on_progress=on_progress,
                on_status=on_status,
                timeout=left,
                on_partial=on_partial if stream else None,
            )
            return output_of(status)
        except (KeyboardInterrupt, ClientError) as exc:
            if job_id is not None and (isinstance(exc, KeyboardInterrupt) or exc.code == "TIMEOUT"):
                self._cancel_quietly(job_id)
            raise

    # ------------------------------------------------------------------ plumbing
    def _cancel_quietly(self, job_id: str) -> None:
        try:
            self.cancel(job_id)
            log.info("cancelled job %s", job_id)
        except ClientError as exc:
            log.warning("could not cancel job %s: %s", job_id, exc)

    def _body(
        self,
        job_input: Mapping[str, Any],
        limit: int,
        route: str,
        webhook: str | None,
        policy: Mapping[str, Any] | None,
    ) -> bytes:
        request: dict[str, Any] = {"input": job_input}
        if webhook:
            request["webhook"] = webhook
        if policy:
            request["policy"] = dict(policy)
        body = json.dumps(request).encode()
        if len(body) > limit:
            raise ClientError(
                "INPUT_TOO_LARGE",
                f"the request is {len(body) / 1e6:.1f} MB, over the platform's "
                f"{limit / 1e6:.0f} MB limit for {route}; pass large audio as a URL",
            )
        return body

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        resend: bool = False,
        read_timeout: float | None = None,
    ) -> dict[str, Any]:
        """One API call with retries on 429, 5xx and connection failures.

        `resend`: the call queues a job. It is retried only when the request surely did
        not reach the platform (connect failure) or the platform said so (429/5xx): a
        reset after the body went out may already have queued it.
        """
        route = "/" + path.split("?")[0]
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            started = time.monotonic()
            try:
                response = self._session.request(
                    method,
                    f"{self.url}/{path}",
                    data=body,
                    timeout=(10.0, read_timeout or self.timeout_s),
                )
            except requests.ConnectionError as exc:
                sent = not _not_sent(exc)
                if last or (resend and sent):
                    raise ClientError(
                        "CONNECTION_ERROR",
                        f"{method} {route}: cannot reach {self._host} "
                        f"({type(_root(exc)).__name__})",
                    ) from None
                self._backoff(attempt, None)
                continue
            except requests.Timeout:
                # Sent but unanswered: only a call that queues nothing is safe to repeat.
                if last or resend:
                    raise ClientError(
                        "REQUEST_TIMEOUT", f"{method} {route}: no answer from {self._host} in time"
                    ) from None
                self._backoff(attempt, None)
                continue
            log.debug(
                "%s %s -> %d in %.0f ms",
                method,
                route,
                response.status_code,
                (time.monotonic() - started) * 1000,
            )
            code = response.status_code
            if (code == 429 or code >= 500) and not last:
                self._backoff(attempt, response.headers.get("Retry-After"))
                continue
            if code >= 400:
                raise _http_error(response, method, route)
            try:
                return response.json()
            except ValueError:
                raise ClientError(
                    "BAD_RESPONSE",
                    f"{method} {route}: the answer is not JSON (HTTP {code})",
                    http_status=code,
                ) from None
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: str | None) -> None:
        pause = self.retry_backoff_s * 2**attempt
        if retry_after and retry_after.strip().isdigit():
            pause = max(pause, min(float(retry_after), 30.0))
        time.sleep(pause)


def _job_path(job_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id or ""):
        raise ClientError("INVALID_JOB_ID", "a job id is letters, digits, - or _")
    return job_id


def _root(exc: BaseException) -> BaseException:
    reason = exc.args[0] if exc.args else None
    return getattr(reason, "reason", None) or reason or exc


def _not_sent(exc: requests.ConnectionError) -> bool:
    from urllib3.exceptions import NewConnectionError

    return isinstance(exc, requests.ConnectTimeout) or isinstance(_root(exc), NewConnectionError)


def _http_error(response: requests.Response, method: str, route: str) -> ClientError:
    code = response.status_code
    name, text = _HTTP_CODES.get(code, (f"HTTP_{code}", f"HTTP {code}"))
    if code >= 500:
        name, text = "PLATFORM_ERROR", f"the platform answered HTTP {code}"
    try:
        detail = response.json().get("error")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str) and detail and code not in (401, 403):
        text = f"{text} ({detail[:200]})"
    return ClientError(name, f"{method} {route}: {text}", http_status=code)


# ---------------------------------------------------------------------- command line
class _Reporter:
    """Status, progress and partial text on stderr: a redrawn bar on a terminal, plain
    lines otherwise (logs, CI)."""

    def __init__(self, err: IO[str], out: IO[str], *, partial_to_out: bool) -> None:
        self.err, self.out = err, out
        self.tty = err.isatty()
        self.partial_to_out = partial_to_out
        self.job_id = "-"
        self.state = "SUBMITTING"
        self.percent: float | None = None
        self.segments = 0
        self.started = time.monotonic()
        self._drawn = False

    def submitted(self, job_id: str) -> None:
        self.job_id = job_id
        self._line(f"job {job_id} submitted")

    def status(self, status: dict[str, Any]) -> None:
        self.state = str(status.get("status"))
        if not self.tty and self.state not in TERMINAL:
            self._line(f"job {self.job_id}: {self.state}")
        self._draw()

    def progress(self, percent: float) -> None:
        self.percent = max(0.0, min(100.0, percent))
        if not self.tty:
            self._line(f"job {self.job_id}: {self.percent:.0f}%")
        self._draw()

    def partial(self, segment: dict[str, Any]) -> None:
        self.segments += 1
        text = str(segment.get("text", "")).strip()
        self._clear()
        if self.partial_to_out:
            print(text, file=self.out, flush=True)
        else:
            start = float(segment.get("start") or 0.0)
            print(f"[{int(start // 60):02d}:{start % 60:05.2f}] {text}", file=self.err, flush=True)
        self._draw()

    def done(self) -> None:
        self._clear()

    def _line(self, text: str) -> None:
        self._clear()
        print(text, file=self.err, flush=True)
        self._draw()

    def _draw(self) -> None:
        if not self.tty:
            return
        elapsed = time.monotonic() - self.started
        bar = ""
        if self.percent is not None:
            filled = int(self.percent / 5)
            bar = f" [{'#' * filled}{'.' * (20 - filled)}] {self.percent:3.0f}%"
        segs = f"  {self.segments} segments" if self.segments else ""
        self.err.write(f"\r\x1b[K{self.state}{bar}  {elapsed:.1f}s{segs}")
        self.err.flush()
        self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._drawn = False


_OUTPUTS = {"text": ["text"], "srt": ["srt"], "vtt": ["vtt"], "json": None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m whisper_client",
        description="Send audio to a deployed worker and print the transcript. The API key "
        "comes from RUNPOD_API_KEY.",
    )
    p.add_argument("audio", help="local audio file (sent inline), or an http(s):// or s3:// URL")
    p.add_argument("--endpoint", required=True, help="RunPod endpoint id")
    p.add_argument(
        "--base-url",
        default=os.environ.get("RUNPOD_ENDPOINT_BASE_URL", DEFAULT_BASE_URL),
        help="API base (default $RUNPOD_ENDPOINT_BASE_URL or %(default)s); "
        "the local emulator prints its own",
    )
    p.add_argument("--sync", action="store_true", help="use /runsync (falls back to polling)")
    p.add_argument("--output", choices=sorted(_OUTPUTS), default="text")
    p.add_argument(
        "--stream",
        action="store_true",
        help="print partial text as segments arrive (worker deployed with WHISPER_STREAM=true)",
    )
    p.add_argument(
        "--split",
        type=_split_arg,
        help="fan a long recording out as N jobs (2-32) or 'auto' (a piece per 4 min) on "
        "the endpoint's workers; one stitched result",
    )
    p.add_argument(
        "--upload-to",
        metavar="S3_URL",
        help="put a local file in s3://bucket/prefix/ (your AWS credentials), send the job a "
        "presigned URL to it, delete it when the job ends: for files over the 10 MB inline limit",
    )
    p.add_argument("--language")
    p.add_argument("--model")
    p.add_argument("--task", choices=["transcribe", "translate"])
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other job input field; VALUE is JSON or a plain string (repeatable)",
    )
    p.add_argument("--timeout", type=float, help="give up (and cancel the job) after S seconds")
    p.add_argument("--wait-ms", type=int, default=60_000, help="/runsync wait (1000-300000)")
    return p


def _split_arg(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("a number of pieces (2-32) or auto") from None
    if not 1 <= n <= 32:
        raise argparse.ArgumentTypeError("a number of pieces (2-32) or auto")
    return n


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name in ("language", "model", "task", "split"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    for item in args.option:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ClientError("INVALID_OPTION", f"--option wants KEY=VALUE, not {item!r}")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def main(argv: list[str] | None = None) -> int:
    """`python -m whisper_client ...`: 0 done, 1 error (one line on stderr), 130 interrupted."""
    args = build_parser().parse_args(argv)
    out, err = sys.stdout, sys.stderr
    streaming_text = args.stream and args.output == "text"
    reporter = _Reporter(err, out, partial_to_out=streaming_text)
    try:
        options = _options(args)
        with Client(args.endpoint, base_url=args.base_url) as client:
            result = client.transcribe(
                args.audio,
                output=_OUTPUTS[args.output],
                sync=args.sync,
                stream=args.stream,
                wait_ms=args.wait_ms,
                timeout=args.timeout,
                on_submit=reporter.submitted,
                on_status=reporter.status,
                on_progress=reporter.progress,
                on_partial=reporter.partial if args.stream else None,
                upload_to=args.upload_to,
                **options,
            )
    except ClientError as exc:
        reporter.done()
        print(f"error: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        reporter.done()
        what = (
            f"job {reporter.job_id} cancelled"
            if reporter.job_id != "-"
            else "before the platform returned a job id"
        )
        print(f"error: CANCELLED: interrupted; {what}", file=err)
        return 130
    reporter.done()
    if args.output == "json":
        print(json.dumps(result, indent=2, ensure_ascii=False), file=out)
    elif streaming_text and reporter.segments:
        pass  # the text went out segment by segment
    else:
        text = result.get(args.output)
        if not isinstance(text, str):
            print(f"error: NO_OUTPUT: the result has no {args.output!r}", file=err)
            return 1
        print(text, file=out, end="" if text.endswith("\n") else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
