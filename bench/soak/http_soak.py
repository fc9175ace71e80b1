"""HTTP soak: many requests from several clients, every bad-input class, disconnects, bursts.

``python -m bench http-soak [--requests 1000] [--clients 6]`` starts the real HTTP mode
(``python -m handler serve``, tiny.en, ``WHISPER_MAX_CONCURRENCY`` 2 and 2 waiting places)
on 127.0.0.1 and sends a seeded mix, each request with the answer it must get:

- good clips as OpenAI multipart uploads (json, verbose_json, srt, a stream) and as our job
  JSON on ``/v1/jobs`` (inline and by URL from a local source server);
- every bad-input class of the queue soak (bench/soak/soak.py: not base64, not audio, a PNG,
  hours declared, private and metadata URLs, 404/500/short/dripping/hanging/endless
  sources, ...) through ``/v1/jobs``, and the HTTP face's own: a body over the upload cap,
  a form that is not multipart, an unknown model, a refused field, an unknown route, a
  sender slower than the receive deadline (408) and endless headers (431);
- disconnects: mid-upload (half a body, then the socket closed), mid-transcription (a long
  clip with a one-second client timeout), mid-stream (the first event read, then closed);
- bursts past the admission limit (8 requests at once against 4 places: 429 with
  Retry-After for the rest). Every other request that gets 429 (the clients outnumber the
  places) comes back after a short pause, as the OpenAI SDK does, until it is served.

Every answer is judged (status, OpenAI error code, the clip's own text); a request that
needed an answer and got none is lost. The server's RSS is sampled every 50 answers. At
the end every slot must be free (``/metrics``: nothing running or waiting) and the server
must serve at full concurrency (a round of good requests, none refused). Exits 1 on any
wrong or lost answer, a leaked slot, or RSS growth over 10 % after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.common.servers import free_port, start_until_healthy
from bench.soak.soak import DOWNLOAD_TIMEOUT_S, MAX_DOWNLOAD, Handler, Sources, cases
from speech_assets.clips import DATA, clips, long_clip, wer

ROOT = Path(__file__).resolve().parents[2]
UPLOAD_CAP = 2_000_000
RECEIVE_TIMEOUT_S = 3  # the soak's slow sender is cut off in seconds, not the default 20
CONCURRENCY, WAITING = 2, 2
RETRIES_429 = 600
"""A refused request comes back this many times at most (0.2-0.5 s apart): minutes."""
TRANSCRIBE = "/v1/audio/transcriptions"
REFERENCES = [c.text for c in clips()]


@dataclass
class Probe:
    """One kind of request and the answer it must get."""

    name: str
    send: Callable[[str], Any]
    """Sends to the server's base URL; returns (status, body) or raises."""
    expect: set[int]
    """Acceptable statuses; empty: no answer is due (a disconnect)."""
    code: set[str] | None = None
    """Acceptable OpenAI error codes (``error.code``), for error statuses."""
    text: str | None = None
    """A 200 must carry this clip's text (as the queue soak judges it)."""


def _post_form(path: str, fields: dict[str, str], audio: bytes, timeout: float = 180) -> Any:
    def send(base: str) -> tuple[int, Any]:
        r = requests.post(
            base + path, data=fields, files={"file": ("a.wav", audio)}, timeout=timeout
        )
        return r.status_code, _body(r)

    return send


def _post_job(job: dict[str, Any], timeout: float = 180) -> Callable[[str], Any]:
    def send(base: str) -> tuple[int, Any]:
        r = requests.post(base + "/v1/jobs", json={"input": job}, timeout=timeout)
        return r.status_code, _body(r)

    return send


def _body(r: requests.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def _stream(audio: bytes) -> Callable[[str], Any]:
    def send(base: str) -> tuple[int, Any]:
        with requests.post(
            base + TRANSCRIBE,
            data={"model": "whisper-1", "stream": "true"},
            files={"file": ("a.wav", audio)},
            stream=True,
            timeout=180,
        ) as r:
            if r.status_code != 200:
                return r.status_code, _body(r)
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: ")]
        done = events[-1] if events else {}
        if "error" in done:  # an error in a 200 stream is the answer, with its code
            return 200, done
        return 200, {"text": done.get("text", ""), "type": done.get("type")}

    return send


def _abandon_stream(audio: bytes) -> Callable[[str], Any]:
    def send(base: str) -> None:
        with requests.post(
            base + TRANSCRIBE,
            stream=True,
            timeout=180,
            files={"file": ("a.wav", audio)},
            data={"model": "whisper-1", "stream": "true", "batch_size": "1"},
        ) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    break  # the first event, then the connection closes

    return send


def _give_up(audio: bytes) -> Callable[[str], Any]:
    def send(base: str) -> None:
        try:
            requests.post(
                base + TRANSCRIBE,
                data={"model": "whisper-1"},
                files={"file": ("a.wav", audio)},
                timeout=1.0,
            )
        except requests.RequestException:
            pass  # the client gives up mid-transcription and closes the connection

    return send


def _half_upload(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = (
            f"POST {TRANSCRIBE} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            "boundary=zz\r\nContent-Length: 500000\r\n\r\n--zz\r\n"
        )
        s.sendall(head.encode() + b"x" * 100_000)  # then the socket closes, mid-body


def _cut_off(first: bytes, rest: bytes, piece: int, gap_s: float) -> Callable[[str], Any]:
    """Send ``first``, then ``rest`` ``piece`` bytes every ``gap_s`` until the server
    closes the connection; (status of its answer, None)."""

    def send(base: str) -> tuple[int, Any]:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.settimeout(gap_s)
            s.sendall(first)
            got = b""
            for at in range(0, len(rest), piece):
                try:
                    s.sendall(rest[at : at + piece])
                    got += s.recv(4096)  # times out (nothing yet) until the server answers
                except TimeoutError:
                    continue
                except OSError:
                    break
                if got:
                    break
            s.settimeout(10)
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except OSError:
                pass
        return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0, None

    return send


def _raw(method: str, path: str, **kw: Any) -> Callable[[str], Any]:
    def send(base: str) -> tuple[int, Any]:
        r = requests.request(method, base + path, timeout=60, **kw)
        return r.status_code, _body(r)

    return send


def probes(source_url: str) -> tuple[list[Probe], list[Probe], list[Probe]]:
    """(good, bad, disconnects)."""
    all_clips = clips()
    good: list[Probe] = []
    for c in all_clips:
        wav = c.wav_bytes()
        for fmt in ("json", "verbose_json"):
            good.append(
                Probe(
                    f"upload-{fmt}:{c.name}",
                    _post_form(TRANSCRIBE, {"model": "whisper-1", "response_format": fmt}, wav),
                    {200},
                    text=c.text,
                )
            )
        good.append(Probe(f"stream:{c.name}", _stream(wav), {200}, text=c.text))
    good_jobs, bad_jobs = cases(source_url)
    for case in good_jobs:
        good.append(
            Probe(
                f"job-{case.name}",
                _post_job(case.input),
                {200},
                text=case.clip.text if case.clip else None,
            )
        )
    bad: list[Probe] = []
    for case in bad_jobs:
        expect = {200} if not case.codes else {400, 413, 415, 422, 502, 504}
        bad.append(
            Probe(f"job-{case.name}", _post_job(case.input), expect, code=set(case.codes) or None)
        )
    jfk = (DATA / "jfk.wav").read_bytes()
    bad += [
        Probe(
            "upload-too-large",
            _post_form(TRANSCRIBE, {"model": "whisper-1"}, b"\0" * (UPLOAD_CAP + 1)),
            {413},
            {"INPUT_TOO_LARGE"},
        ),
        Probe(
            "not-multipart",
            _raw("POST", TRANSCRIBE, data=b"{}", headers={"Content-Type": "application/json"}),
            {400},
            {"INVALID_INPUT"},
        ),
        Probe(
            "unknown-model",
            _post_form(TRANSCRIBE, {"model": "nope"}, jfk),
            {400},
            {"INVALID_INPUT"},
        ),
        Probe(
            "refused-field",  # logprobs are served with json only, as OpenAI serves them
            _post_form(TRANSCRIBE, {"include[]": "logprobs", "response_format": "srt"}, jfk),
            {400},
            {"INVALID_INPUT"},
        ),
        Probe(
            "png-upload",
            _post_form(TRANSCRIBE, {}, bytes.fromhex("89504e470d0a1a0a") * 10),
            {415},
            {"UNSUPPORTED_OR_CORRUPT_MEDIA", "NO_AUDIO_STREAM"},
        ),
        Probe("unknown-route", _raw("GET", "/v1/nothing"), {404}, {"not_found"}),
        Probe(  # slower than the receive deadline allows (RECEIVE_TIMEOUT_S here)
            "slow-headers",
            _cut_off(f"POST {TRANSCRIBE} HTTP/1.1\r\n".encode(), b"X-Slow: " + b"a" * 400, 1, 0.5),
            {408},
        ),
        Probe(  # past the 64-KiB cap on the request line and headers
            "endless-headers",
            _cut_off(b"GET /ping HTTP/1.1\r\n", b"X-Pad: " + b"a" * 1_000_000, 16_384, 0.05),
            {431},
        ),
    ]
    long_wav = long_clip(90).wav_bytes()
    gone = [
        Probe("gone-mid-upload", _half_upload, set()),
        Probe("gone-mid-transcription", _give_up(long_wav), set()),
        Probe("gone-mid-stream", _abandon_stream(long_wav), set()),
    ]
    return good, bad, gone


def judge(probe: Probe, answer: Any, burst: bool = False) -> str | None:
    """None when the answer is right, else why not. ``burst``: one of a burst past the
    admission limit, for which 429 is a right answer (other requests retry past it)."""
    if not probe.expect:
        return None  # a disconnect: the server owes no answer, only its health (checked after)
    if not isinstance(answer, tuple):
        return f"no answer: {answer}"
    status, body = answer
    if status == 429 and burst:
        return None  # admission refused it with Retry-After: a right answer to a burst
    if status not in probe.expect:
        return f"status {status}, expected {sorted(probe.expect)}: {str(body)[:160]}"
    if status != 200:
        # OpenAI's body on the audio routes, our job's error result on /v1/jobs.
        err = body.get("error") if isinstance(body, dict) else None
        code = err.get("code") if isinstance(err, dict) else None
        if code is None and isinstance(body, dict):
            code = body.get("error_code")
        if probe.code is not None and code not in probe.code:
            return f"code {code}, expected {sorted(probe.code)}"
        return None
    if probe.text is not None:
        out = body.get("output", body) if isinstance(body, dict) else {}
        text = out.get("text", "") if isinstance(out, dict) else str(out)
        # As the queue soak judges: its own clip's text, not another's, not garbled.
        own = wer(probe.text, text)
        closest = min(REFERENCES, key=lambda ref: wer(ref, text))
        if own > 0.35 or (closest != probe.text and wer(closest, text) < own):
            return f"text of another clip or garbled (WER {own:.2f}): {text[:60]!r}"
    return None


def start_server(tmp: Path, extra: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``python -m handler serve`` on a free port, tiny.en; returns (process, base URL)."""
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "WHISPER_DEVICE": "cpu",
        "WHISPER_MAX_CONCURRENCY": str(CONCURRENCY),
        "WHISPER_HTTP_MAX_QUEUE": str(WAITING),
        "WHISPER_MAX_UPLOAD_BYTES": str(UPLOAD_CAP),
        "WHISPER_ALLOW_PRIVATE_URLS": "true",
        "WHISPER_DOWNLOAD_TIMEOUT_S": str(DOWNLOAD_TIMEOUT_S),
        "WHISPER_MAX_DOWNLOAD_BYTES": str(MAX_DOWNLOAD),
        "WHISPER_HTTP_RECEIVE_TIMEOUT_S": str(RECEIVE_TIMEOUT_S),
        "TMPDIR": str(tmp),
        **(extra or {}),
    }
    argv = [sys.executable, "-m", "handler", "serve"]
    base = f"http://127.0.0.1:{port}"
    return start_until_healthy(argv, env, tmp / "server.log", base + "/ping", cwd=ROOT), base


def _gauge(base: str, name: str) -> float:
    for line in requests.get(base + "/metrics", timeout=30).text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run(requests_n: int = 1000, clients: int = 6, seed: int = 0, log: Any = None) -> dict[str, Any]:
    log = log or (lambda *_: None)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="http-soak-") as tmp:
        sources = Sources(("127.0.0.1", 0), Handler)
        sources.files = {f"{c.name}.wav": c.wav_bytes() for c in clips()}
        sources.stop = threading.Event()
        threading.Thread(target=sources.serve_forever, daemon=True).start()
        good, bad, gone = probes(f"http://127.0.0.1:{sources.server_port}")
        plan: list[Probe | str] = []
        while len(plan) < requests_n:
            r = rng.random()
            plan.append(
                "burst"
                if r < 0.02
                else rng.choice(gone)
                if r < 0.08
                else rng.choice(bad)
                if r < 0.45
                else rng.choice(good)
            )
        plan[len(plan) // 2] = "burst"  # at least one, whatever the seed
        proc, base = start_server(Path(tmp))
        try:
            return _drive(plan, good, base, proc, clients, log)
        finally:
            sources.stop.set()
            sources.shutdown()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _drive(
    plan: list[Probe | str],
    good: list[Probe],
    base: str,
    proc: subprocess.Popen,
    clients: int,
    log: Any,
) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    rss: list[float] = []
    lock = threading.Lock()
    server = psutil.Process(proc.pid)
    answered = [0]
    start = time.time()

    def one(p: Probe, burst: bool = False) -> None:
        # A client past the admission limit gets 429 with Retry-After and comes back, as
        # the OpenAI SDK does; only a burst's requests take the 429 as their answer.
        for _attempt in range(RETRIES_429):
            try:
                answer = p.send(base)
            except requests.RequestException as exc:
                answer = type(exc).__name__
            if burst or not (isinstance(answer, tuple) and answer[0] == 429):
                break
            with lock:
                outcomes["429 (retried)"] += 1
            time.sleep(0.2 + 0.3 * random.random())
        why = judge(p, answer, burst)
        with lock:
            status = answer[0] if isinstance(answer, tuple) else "none"
            outcomes[f"{'gone' if not p.expect else status}"] += 1
            if why:
                wrong.append(f"{p.name}: {why}")
            answered[0] += 1
            if answered[0] % 50 == 0:
                rss.append(server.memory_info().rss / 2**20)
                log(f"{answered[0]} answered, {len(wrong)} wrong, rss {rss[-1]:.0f} MiB")

    def burst() -> None:
        jfk = good[0]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: one(p, burst=True), [jfk] * 8))

    with ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(one, item) if isinstance(item, Probe) else pool.submit(burst)
            for item in plan
        ]
    for f in futures:
        if f.exception() is not None:  # the harness itself failed: count it, never hide it
            wrong.append(
                f"harness: no answer judged: {type(f.exception()).__name__}: {f.exception()}"
            )
    wall = time.time() - start
    # Every slot free again, then a round at full concurrency with none refused.
    deadline = time.time() + 120
    while time.time() < deadline and (
        _gauge(base, "whisper_jobs_running") or _gauge(base, "whisper_jobs_waiting")
    ):
        time.sleep(0.5)
    leaked = _gauge(base, "whisper_jobs_running") + _gauge(base, "whisper_jobs_waiting")
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        final = list(pool.map(lambda p: p.send(base), good[:CONCURRENCY]))
    refused_after = sum(1 for a in final if a[0] != 200)
    return report(outcomes, wrong, rss, leaked, refused_after, wall, len(plan), proc.poll())


def report(
    outcomes: Counter[str],
    wrong: list[str],
    rss: list[float],
    leaked: float,
    refused_after: int,
    wall: float,
    planned: int,
    exit_code: int | None,
) -> dict[str, Any]:
    warm = rss[len(rss) // 4 :] if len(rss) >= 4 else rss
    growth = (max(warm) / warm[0] - 1) if len(warm) >= 2 else 0.0
    lost = [w for w in wrong if w.split(": ", 1)[1].startswith("no answer")]
    return {
        "requests": planned,
        "outcomes": dict(sorted(outcomes.items(), key=str)),
        "wrong": [w for w in wrong if w not in lost],
        "lost": lost,
        "leaked_slots": leaked,
        "refused_at_full_concurrency_after": refused_after,
        "server_alive": exit_code is None,
        "rss_mib": [round(x, 1) for x in rss],
        "rss_growth_after_warmup": round(growth, 4),
        "rss_median_mib": round(statistics.median(rss), 1) if rss else None,
        "wall_s": round(wall, 1),
    }


def failed(r: dict[str, Any], rss_limit: float = 0.10) -> list[str]:
    why = []
    if r["wrong"]:
        why.append(f"{len(r['wrong'])} wrong")
    if r["lost"]:
        why.append(f"{len(r['lost'])} lost")
    if r["leaked_slots"] or r["refused_at_full_concurrency_after"]:
        why.append("slots leaked")
    if not r["server_alive"]:
        why.append("the server died")
    if r["rss_growth_after_warmup"] > rss_limit:
        why.append(f"RSS grew {100 * r['rss_growth_after_warmup']:.1f} % after warm-up")
    return why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench http-soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "http_soak.json"))
    args = parser.parse_args(argv)
    r = run(
        args.requests, args.clients, args.seed, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(json.dumps({k: v for k, v in r.items() if k != "rss_mib"}, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(r, indent=2))
    problems = failed(r)
    print("OK" if not problems else "FAILED: " + "; ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
