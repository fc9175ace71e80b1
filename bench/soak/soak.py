"""Fault soak: many jobs, every bad-input class, injected faults; nothing lost, nothing wrong.

``python -m bench soak [--jobs 1000] [--workers 2]`` runs real ``python -m handler``
workers (tiny.en, the real runpod SDK loop) against the platform emulator, all on
127.0.0.1, and sends a seeded mix of good clips (inline, by URL, by a slow URL) and every
bad-input class of ``shared/bad-inputs.md`` that needs no GPU, each with the outcome it
must get. While it runs it injects faults:

- job-done answered 5xx before the platform stored the result, and after (a re-post),
- a busy worker SIGKILLed (its jobs are requeued by the platform) and one SIGTERMed
  (it drains), each replaced by a fresh worker,
- sources that drip, hang, break off, answer 404 or 500, or never end.

Every 50 answers it samples each live worker's RSS, open fds and ``whisper-*`` temporary
files. At the end it reports jobs submitted, jobs with exactly one outcome, lost (and lost
by a worker that was alive), duplicated (a result from two attempts), wrong (another
clip's text, or a code other than the expected one), late re-posts, and the samples; it
exits 1 on any loss by a live worker, any wrong or duplicated outcome, a temporary file
or fd left by a live worker, or RSS growth over 5 % after warm-up.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import io
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import wave
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.machine import describe, stamp
from handler.contract import TERMINAL_JOB_STATES
from runpod_emulator import Emulator
from speech_assets.clips import DATA, Clip, clips, wer

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = TERMINAL_JOB_STATES
DOWNLOAD_TIMEOUT_S = 4
MAX_DOWNLOAD = 3_000_000


# --------------------------------------------------------------------------- sources


class Sources(http.server.ThreadingHTTPServer):
    daemon_threads = True
    files: dict[str, bytes]
    stop: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # workers hang up on purpose (deadlines, caps): not worth a traceback


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Sources

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _send(self, status: int, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        kind, _, name = self.path.strip("/").partition("/")
        body = self.server.files.get(name, b"")
        try:
            if kind == "ok":
                self._send(200, body)
            elif kind == "slow":  # the whole file in 1.5 s, well inside the deadline
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                step = max(1, len(body) // 10)
                for i in range(0, len(body), step):
                    if self.server.stop.wait(0.15):
                        return
                    self.wfile.write(body[i : i + step])
                    self.wfile.flush()
            elif kind == "drip":  # a byte a second: past the deadline
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                while not self.server.stop.wait(1.0):
                    self.wfile.write(b"\0")
                    self.wfile.flush()
            elif kind == "hang":
                self.server.stop.wait(DOWNLOAD_TIMEOUT_S + 5)
            elif kind == "short":  # breaks off before its Content-Length
                self._send(200, body[:1000], length=len(body))
            elif kind == "endless":
                self.send_response(200)
                self.end_headers()  # no length: read until the cap
                chunk = b"\0" * 65536
                for _ in range(MAX_DOWNLOAD // len(chunk) + 10):
                    self.wfile.write(chunk)
            elif kind == "404":
                self._send(404, b"gone")
            else:
                self._send(500, b"broken")
        except OSError:
            pass  # the worker hung up (deadline, cap): expected


# --------------------------------------------------------------------------- job mix


@dataclass
class Case:
    name: str
    input: dict[str, Any]
    codes: frozenset[str] = frozenset()
    """Expected error codes; empty: a result."""
    clip: Clip | None = None
    """A result must be this clip's text."""
    warns: bool = False
    """A result must carry a warning (never a silently short or empty transcript)."""


def _wav(samples: bytes, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples)
    return buf.getvalue()


def _declares_hours() -> bytes:
    # 300 KB of real 8 Hz samples: 5.2 hours, past the 4-hour cap (about 1.2 GB of 16 kHz
    # float PCM if it were decoded). The header is honest; FFmpeg clamps a lying one.
    return _wav(b"\0\0" * 150_000, rate=8)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def cases(url: str) -> tuple[list[Case], list[Case]]:
    """(good cases, bad cases); ``url`` is the sources server's base."""
    good: list[Case] = []
    for c in clips():
        wav = c.wav_bytes()
        good.append(Case(f"inline:{c.name}", {"audio_base64": _b64(wav)}, clip=c))
        good.append(Case(f"url:{c.name}", {"audio_url": f"{url}/ok/{c.name}.wav"}, clip=c))
    jfk = clips()[0]
    good.append(Case("slow-url", {"audio_url": f"{url}/slow/jfk.wav"}, clip=jfk))
    good.append(
        Case(
            "null-options",
            {"audio_base64": _b64(jfk.wav_bytes()), "beam_size": None, "temperature": None},
            clip=jfk,
        )
    )
    mp3 = (DATA / "jfk.mp3").read_bytes()
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")
    invalid = frozenset({"INVALID_INPUT"})
    bad = [
        Case("tiny-audio", {"audio_base64": _b64(_wav(b"\1\0" * 160))}, warns=True),
        Case("no-audio-field", {"language": "en"}, invalid),
        Case("unknown-field", {"audio_base64": _b64(jfk.wav_bytes()), "bogus": 1}, invalid),
        Case("beam-zero", {"audio_base64": _b64(jfk.wav_bytes()), "beam_size": 0}, invalid),
        Case(
            "temperature-bomb",
            {"audio_base64": _b64(jfk.wav_bytes()), "temperature_increment_on_fallback": 1e-8},
            invalid,
        ),
        Case("unknown-model", {"audio_base64": _b64(jfk.wav_bytes()), "model": "nope"}, invalid),
        Case(
            "bad-base64", {"audio_base64": "this is not base64 !!"}, frozenset({"INVALID_BASE64"})
        ),
        Case(
            "text-not-audio",
            {"audio_base64": _b64(b"<html>not audio</html>" * 20)},
            frozenset({"UNSUPPORTED_OR_CORRUPT_MEDIA"}),
        ),
        Case(
            "png",
            {"audio_base64": _b64(png)},
            frozenset({"UNSUPPORTED_OR_CORRUPT_MEDIA", "NO_AUDIO_STREAM"}),
        ),
        Case(
            "header-only-wav",
            {"audio_base64": _b64(_wav(b""))},
            frozenset({"EMPTY_AUDIO", "UNSUPPORTED_OR_CORRUPT_MEDIA"}),
        ),
        Case(
            "declares-hours",
            {"audio_base64": _b64(_declares_hours())},
            frozenset({"AUDIO_TOO_LONG"}),
        ),
        Case("truncated-mp3", {"audio_base64": _b64(mp3[: len(mp3) // 2])}, warns=True),
        Case(
            "translate-en-model",
            {"audio_base64": _b64(jfk.wav_bytes()), "task": "translate"},
            frozenset({"UNSUPPORTED_FOR_MODEL"}),
        ),
        Case(
            "metadata-url",
            {"audio_url": "http://169.254.169.254/latest/meta-data"},
            frozenset({"URL_NOT_ALLOWED"}),
        ),
        Case("file-url", {"audio_url": "file:///etc/passwd"}, frozenset({"URL_NOT_ALLOWED"})),
        Case(
            "s3-not-allowed",
            {"audio_url": "s3://not-allowed/a.wav"},
            frozenset({"URL_NOT_ALLOWED"}),
        ),
        Case("http-404", {"audio_url": f"{url}/404/x.wav"}, frozenset({"SOURCE_HTTP_4XX"})),
        Case("http-500", {"audio_url": f"{url}/500/x.wav"}, frozenset({"SOURCE_HTTP_5XX"})),
        Case("short-body", {"audio_url": f"{url}/short/jfk.wav"}, frozenset({"SOURCE_TRUNCATED"})),
        Case("drip", {"audio_url": f"{url}/drip/x.wav"}, frozenset({"SOURCE_TIMEOUT"})),
        Case("hang", {"audio_url": f"{url}/hang/x.wav"}, frozenset({"SOURCE_TIMEOUT"})),
        Case("endless", {"audio_url": f"{url}/endless/x.wav"}, frozenset({"SOURCE_TOO_LARGE"})),
    ]
    return good, bad


# --------------------------------------------------------------------------- the run


@dataclass
class Sent:
    case: Case
    job_id: str
    sent_at: float
    status: dict[str, Any] | None = None


@dataclass
class WorkerSlot:
    index: int
    tmpdir: Path
    wid: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)


def _proc_stats(pid: int, tmpdir: Path) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    temps = sum(1 for p in tmpdir.iterdir() if p.name.startswith("whisper-"))
    return {"rss_mib": round(rss, 1), "fds": fds, "temp_files": temps}


def judge(sent: Sent, all_clips: list[Clip]) -> str | None:
    """None when the outcome is the expected one, else why it is wrong."""
    st = sent.status or {}
    status = st.get("status")
    out: dict[str, Any] = st["output"] if isinstance(st.get("output"), dict) else {}
    if sent.case.codes:
        if status != "FAILED":
            return f"expected {sorted(sent.case.codes)}, got {status}"
        code = out.get("error_code") if out else None
        if code is None:  # the SDK puts our error dict's rest under output
            try:
                code = json.loads(st.get("error", "{}")).get("error_code")
            except (ValueError, AttributeError):
                code = None
        return (
            None if code in sent.case.codes else f"expected {sorted(sent.case.codes)}, got {code}"
        )
    if status != "COMPLETED":
        return f"expected a result, got {status} {str(st.get('error'))[:120]}"
    if sent.case.warns and not out.get("warnings"):
        return "a result without the warning it must carry"
    clip = sent.case.clip
    if clip is not None:
        text = out.get("text", "")
        own = wer(clip.text, text)
        best = min(all_clips, key=lambda c: wer(c.text, text))
        if own > 0.35 or (best.name != clip.name and wer(best.text, text) < own):
            return f"text of another clip or garbled (WER {own:.2f}, closest {best.name})"
    return None


def run(
    jobs: int = 1000,
    workers: int = 2,
    seed: int = 0,
    fault_every: int = 100,
    kill_every: int = 250,
    sample_every: int = 50,
    outstanding: int = 8,
    job_timeout_s: float = 240.0,
    log: Any = None,
) -> dict[str, Any]:
    log = log or (lambda *_: None)
    rng = random.Random(seed)
    all_clips = clips()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        server = Sources(("127.0.0.1", 0), Handler)
        server.files = {f"{c.name}.wav": c.wav_bytes() for c in all_clips}
        server.stop = threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        good, bad = cases(f"http://127.0.0.1:{server.server_port}")
        mix = [rng.choice(good) if rng.random() < 0.6 else rng.choice(bad) for _ in range(jobs)]
        em = Emulator(log_dir=str(Path(tmp) / "logs"), ping_interval_ms=2000, stop_grace_s=60.0)
        em.start()
        slots = [WorkerSlot(i, Path(tmp) / f"w{i}") for i in range(workers)]
        events: list[str] = []
        killed: set[str] = set()

        def start(slot: WorkerSlot) -> None:
            # A fresh folder per worker: what a SIGKILLed one left is not its successor's.
            slot.tmpdir = Path(tmp) / f"w{slot.index}-{len(events)}"
            slot.tmpdir.mkdir(exist_ok=True)
            env = {
                "WHISPER_DEVICE": "cpu",
                "WHISPER_CPU_THREADS": "1",
                "WHISPER_MAX_CONCURRENCY": "2",
                "WHISPER_ALLOW_PRIVATE_URLS": "true",
                "WHISPER_DOWNLOAD_TIMEOUT_S": str(DOWNLOAD_TIMEOUT_S),
                "WHISPER_MAX_DOWNLOAD_BYTES": str(MAX_DOWNLOAD),
                "WHISPER_S3_ALLOWED_BUCKETS": "soak-bucket",
                "WHISPER_RESULT_RETRY_S": "60",
                "TMPDIR": str(slot.tmpdir),
                "HF_HUB_OFFLINE": "1",
            }
            slot.wid = em.start_worker(
                env, command=[sys.executable, "-m", "handler"], cwd=str(ROOT)
            )
            slot.samples = []

        def pid_of(wid: str) -> int | None:
            return em.records()["workers"].get(wid, {}).get("pid")

        def sample(answered: int) -> None:
            for slot in slots:
                pid = pid_of(slot.wid)
                stats = _proc_stats(pid, slot.tmpdir) if pid else None
                if stats:
                    slot.samples.append({"answered": answered, **stats})
                    log(f"  {slot.wid}: {stats}")

        try:
            for slot in slots:
                start(slot)
            for slot in slots:
                em.wait_worker(slot.wid, {"idle", "busy"}, 180)
            sent: list[Sent] = []
            waiting: list[Sent] = []
            answered = 0
            next_sample = sample_every
            started = time.monotonic()
            i = 0
            while i < len(mix) or waiting:
                while i < len(mix) and len(waiting) < outstanding:
                    case = mix[i]
                    s = Sent(case, em.submit(case.input), time.monotonic())
                    sent.append(s)
                    waiting.append(s)
                    i += 1
                    if i % fault_every == 0:
                        em.fail_job_done(3, status=503)
                        events.append(f"job {i}: job-done 503 x3 before commit")
                    if i % fault_every == fault_every // 2:
                        em.fail_job_done(2, status=502, after_commit=True)
                        events.append(f"job {i}: job-done 502 x2 after commit")
                    if i % kill_every == 0 or i % kill_every == kill_every // 2:
                        # Slot 0 is never stopped: its RSS, fds and temp files are followed
                        # over the whole run; the others are killed and replaced in turn.
                        victims = slots[1:] or slots
                        slot = victims[(i // (kill_every // 2)) % len(victims)]
                        try:  # mid-job if it gets one soon; a fresh worker may still start
                            em.wait_worker(slot.wid, "busy", 30)
                        except TimeoutError:
                            pass
                        hard = i % kill_every == 0
                        state = em.worker_state(slot.wid)
                        if hard:
                            em.kill_worker(slot.wid)
                            killed.add(slot.wid)
                        else:
                            em.stop_worker(slot.wid, graceful=True)
                        events.append(
                            f"job {i}: {'SIGKILL' if hard else 'SIGTERM'} {slot.wid} ({state})"
                        )
                        log(events[-1])
                        old = slot.wid
                        start(slot)
                        events.append(f"job {i}: {slot.wid} replaces {old}")
                for s in list(waiting):
                    st = em.status(s.job_id)
                    if st and st.get("status") in TERMINAL:
                        s.status = st
                        waiting.remove(s)
                        answered += 1
                    elif time.monotonic() - s.sent_at > job_timeout_s:
                        s.status = st
                        waiting.remove(s)
                        answered += 1
                if answered >= next_sample:
                    log(f"{answered}/{len(mix)} answered, {time.monotonic() - started:.0f} s")
                    sample(answered)
                    next_sample += sample_every
                time.sleep(0.05)
            time.sleep(1.0)
            sample(answered)
            wall = time.monotonic() - started
            records = em.records()
        finally:
            em.stop()
            server.stop.set()
            server.shutdown()
    return report(sent, records, slots, killed, events, wall, all_clips)


def report(sent, records, slots, killed, events, wall, all_clips) -> dict[str, Any]:
    jobs = records["jobs"]
    lost, lost_live, dup, wrong, one = [], [], [], [], 0
    for s in sent:
        rec = jobs.get(s.job_id, {})
        attempts = rec.get("attempts", [])
        results = [a for a in attempts if a.get("end") in ("COMPLETED", "FAILED")]
        status = (s.status or {}).get("status")
        if (
            status not in TERMINAL
            or status == "TIMED_OUT"
            or "worker lost" in str((s.status or {}).get("error"))
        ):
            lost.append(s.job_id)
            if not any(a.get("end") == "lost" for a in attempts):
                lost_live.append(s.job_id)
            continue
        if len(results) > 1:
            dup.append(s.job_id)
        else:
            one += 1
        why = judge(s, all_clips)
        if why:
            wrong.append({"job": s.job_id, "case": s.case.name, "why": why})
    by_case = Counter(s.case.name.split(":")[0] for s in sent)
    growth = {}
    leaks = []
    for slot in slots:
        samples = slot.samples
        if samples and samples[-1]["temp_files"]:
            leaks.append(f"{slot.wid}: {samples[-1]['temp_files']} temporary files")
        if len(samples) >= 4:
            base = statistics.median(x["rss_mib"] for x in samples[1:3])
            end = statistics.median(x["rss_mib"] for x in samples[-2:])
            growth[slot.wid] = round(100 * (end / base - 1), 1)
            if samples[-1]["fds"] > samples[1]["fds"] + 8:
                leaks.append(f"{slot.wid}: fds {samples[1]['fds']} -> {samples[-1]['fds']}")
    late = sum(j.get("late_posts", 0) for j in jobs.values())
    out = {
        "submitted": len(sent),
        "exactly_one_outcome": one,
        "lost": len(lost),
        "lost_by_live_worker": len(lost_live),
        "duplicated": len(dup),
        "wrong": wrong,
        "late_reposts": late,
        "requeued": sum(1 for j in jobs.values() if j.get("requeues")),
        "rss_growth_pct": growth,
        "leaks": leaks,
        "events": events,
        "cases": dict(by_case),
        "samples": {slot.wid: slot.samples for slot in slots},
        "wall_s": round(wall, 1),
    }
    bad_growth = [w for w, g in growth.items() if g > 5.0]
    out["ok"] = not (lost_live or wrong or dup or leaks or bad_growth)
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        "| submitted | one outcome | lost | lost by a live worker | duplicated | wrong |"
        " late re-posts | requeued | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {r['submitted']} | {r['exactly_one_outcome']} | {r['lost']} |"
        f" {r['lost_by_live_worker']} | {r['duplicated']} | {len(r['wrong'])} |"
        f" {r['late_reposts']} | {r['requeued']} | {r['wall_s']} |",
        "",
        "| worker | samples | RSS MiB first -> last | growth after warm-up | fds | temp files |",
        "|---|---|---|---|---|---|",
    ]
    for wid, samples in r["samples"].items():
        if not samples:
            continue
        lines.append(
            f"| {wid} | {len(samples)} | {samples[0]['rss_mib']} -> {samples[-1]['rss_mib']} |"
            f" {r['rss_growth_pct'].get(wid, '-')} % | {samples[0]['fds']} -> "
            f"{samples[-1]['fds']} | {samples[-1]['temp_files']} |"
        )
    for w in r["wrong"][:20]:
        lines.append(f"wrong: {w['case']}: {w['why']}")
    for leak in r["leaks"]:
        lines.append(f"leak: {leak}")
    lines.append("faults: " + "; ".join(r["events"]))
    lines.append("verdict: " + ("ok" if r["ok"] else "FAILED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-every", type=int, default=100, help="job-done faults every N jobs")
    parser.add_argument(
        "--kill-every",
        type=int,
        default=250,
        help="SIGKILL a worker every N jobs, SIGTERM one half-way",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "soak.json"))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the emulator stops its workers first

    signal.signal(signal.SIGTERM, stop)
    machine = describe()
    result = run(
        jobs=args.jobs,
        workers=args.workers,
        seed=args.seed,
        fault_every=args.fault_every,
        kill_every=args.kill_every,
        log=None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True)),
    )
    print(render(result))
    stamp(result, machine)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"json    {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
