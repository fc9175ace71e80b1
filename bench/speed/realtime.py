"""Live audio: latency and accuracy of /v1/realtime with 1, 4 and 8 sessions at once.

``python -m bench realtime [--sessions 1,4,8]`` starts HTTP mode (``python -m handler
serve``, tiny.en unless ``--model``) on 127.0.0.1 and streams, from each session at real-time
pace in 100-ms chunks (24-kHz PCM, OpenAI's default input), a recording of several turns:
the committed real clips (JFK and the LibriVox readings) 1.5 s apart. For each clip it
reports the time from the end of its speech (the moment its last chunk was sent) to the
last ``completed`` transcript of the items that began within it, and from the start of its
speech to the first delta (when one came); the WER of all completed turns against the
clips' references beside the same clips sent as files (``/v1/audio/transcriptions``); the
server's CPU seconds per session-second; and, with ``--files``, file jobs sent beside the
sessions, which must all complete. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

from bench.common.machine import describe
from bench.common.machine import line as machine_line
from bench.common.report import percentile
from speech_assets.clips import Clip, clips, long_clip, wer

ROOT = Path(__file__).resolve().parents[2]
RATE_IN = 24000
CHUNK_S = 0.1
GAP_S = 1.5


def pcm24(samples16: np.ndarray) -> bytes:
    t = np.arange(int(len(samples16) * RATE_IN / 16000)) / RATE_IN
    x = np.interp(t, np.arange(len(samples16)) / 16000, samples16)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


@dataclass
class Stream:
    """One session's recording: clips between silences, and where each clip lies (ms)."""

    pcm: bytes
    spans: list[tuple[int, int, Clip]]


def recording(order: list[Clip]) -> Stream:
    parts, spans, at = [np.zeros(int(0.5 * 16000), np.float32)], [], 500
    for c in order:
        ms = int(len(c.samples) / 16)
        spans.append((at, at + ms, c))
        parts += [c.samples, np.zeros(int(GAP_S * 16000), np.float32)]
        at += ms + int(GAP_S * 1000)
    return Stream(pcm24(np.concatenate(parts)), spans)


@dataclass
class SessionLog:
    sent_at: dict[int, float] = field(default_factory=dict)
    """Audio ms -> wall time when the chunk ending there was sent."""
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None


def run_session(
    url: str,
    stream: Stream,
    log: SessionLog,
    timeout: float,
    headers: dict[str, str] | None = None,
    silence_ms: int | None = None,
) -> None:
    from websockets.sync.client import connect

    turns: dict[str, Any] = {"type": "server_vad"}
    if silence_ms is not None:
        turns["silence_duration_ms"] = silence_ms

    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": RATE_IN},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": turns,
            }
        },
    }
    try:
        with connect(url, open_timeout=60, max_size=None, additional_headers=headers) as ws:
            ws.send(json.dumps({"type": "session.update", "session": session}))
            done = threading.Event()

            def reader() -> None:
                try:
                    while True:
                        ev = json.loads(ws.recv(timeout=timeout))
                        log.events.append((time.time(), ev))
                except Exception:  # closed or timed out: the log says what arrived
                    done.set()

            threading.Thread(target=reader, daemon=True).start()
            step = int(RATE_IN * 2 * CHUNK_S)
            start = time.time()
            for n, i in enumerate(range(0, len(stream.pcm), step)):
                time.sleep(max(0.0, start + n * CHUNK_S - time.time()))  # real-time pace
                ws.send(
                    json.dumps(
                        {
                            "type": "input_audio_buffer.append",
                            "audio": base64.b64encode(stream.pcm[i : i + step]).decode(),
                        }
                    )
                )
                log.sent_at[int((n + 1) * CHUNK_S * 1000)] = time.time()
            deadline = time.time() + 60
            while time.time() < deadline and not _settled(log):
                time.sleep(0.1)
    except Exception as exc:
        log.error = f"{type(exc).__name__}: {exc}"


def _settled(log: SessionLog) -> bool:
    committed = {e["item_id"] for _, e in log.events if e["type"] == "input_audio_buffer.committed"}
    ended = {
        e["item_id"]
        for _, e in log.events
        if e["type"].startswith("conversation.item.input_audio_transcription.")
        and e["type"].rsplit(".", 1)[1] in ("completed", "failed")
    }
    return bool(committed) and committed <= ended and (time.time() - log.events[-1][0]) > 2


def measure(log: SessionLog, stream: Stream) -> dict[str, Any]:
    starts = {
        e["item_id"]: e["audio_start_ms"]
        for _, e in log.events
        if e["type"] == "input_audio_buffer.speech_started"
    }
    completed = [
        (t, e)
        for t, e in log.events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    deltas = [
        (t, e)
        for t, e in log.events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    end_latency, first_delta = [], []
    for a, b, _clip in stream.spans:
        mine = [t for t, e in completed if a - 400 <= starts.get(e["item_id"], -1) < b]
        sent = _sent_by(log, b)
        if mine and sent is not None:
            end_latency.append(max(mine) - sent)
        items = {e["item_id"] for _, e in completed if a - 400 <= starts.get(e["item_id"], -1) < b}
        d = [t for t, e in deltas if e["item_id"] in items]
        began = _sent_by(log, a)
        if d and began is not None:
            first_delta.append(min(d) - began)
    text = " ".join(e["transcript"] for _, e in completed)
    return {
        "end_latency": end_latency,
        "first_delta": first_delta,
        "text": text,
        "turns": len(completed),
    }


def _sent_by(log: SessionLog, ms: int) -> float | None:
    later = [k for k in log.sent_at if k >= ms]
    return log.sent_at[min(later)] if later else None


def file_wer(base: str, order: list[Clip]) -> float:
    texts = []
    for c in order:
        r = requests.post(
            base + "/v1/audio/transcriptions",
            data={"model": "whisper-1", "language": "en"},
            files={"file": ("c.wav", c.wav_bytes())},
            timeout=300,
        )
        texts.append(r.json()["text"])
    return wer(" ".join(c.text for c in order), " ".join(texts))


def run_level(
    base: str,
    sessions: int,
    order: list[Clip],
    files: bool,
    pid: int,
    silence_ms: int | None = None,
) -> dict[str, Any]:
    url = base.replace("http", "ws") + "/v1/realtime?intent=transcription"
    stream = recording(order)
    logs = [SessionLog() for _ in range(sessions)]
    proc = psutil.Process(pid)
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.time()
    file_results: list[int] = []
    stop = threading.Event()

    def file_jobs() -> None:  # a 60-s file every few seconds beside the sessions
        wav = long_clip(60).wav_bytes()
        while not stop.is_set():
            r = requests.post(
                base + "/v1/audio/transcriptions",
                data={"model": "whisper-1"},
                files={"file": ("f.wav", wav)},
                timeout=600,
            )
            file_results.append(r.status_code)
            stop.wait(3)

    threads = [
        threading.Thread(target=run_session, args=(url, stream, log, 120, None, silence_ms))
        for log in logs
    ]
    side = threading.Thread(target=file_jobs) if files else None
    for t in threads + ([side] if side else []):
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if side:
        side.join()
    wall = time.time() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    measured = [measure(log, stream) for log in logs]
    ends = [x for m in measured for x in m["end_latency"]]
    firsts = [x for m in measured for x in m["first_delta"]]
    reference = " ".join(c.text for c in order)
    wers = [wer(reference, m["text"]) for m in measured]
    return {
        "sessions": sessions,
        "errors": [log.error for log in logs if log.error],
        "end_to_completed_p50_s": round(percentile(ends, 50), 2) if ends else None,
        "end_to_completed_p95_s": round(percentile(ends, 95), 2) if ends else None,
        "start_to_first_delta_p50_s": round(percentile(firsts, 50), 2) if firsts else None,
        "turns": sum(m["turns"] for m in measured),
        "wer": round(statistics.mean(wers), 4),
        "cpu_s_per_session_s": round(cpu / wall / sessions, 3),
        "file_jobs": {"sent": len(file_results), "ok": file_results.count(200)} if files else None,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.soak.http_soak import start_server

    parser = argparse.ArgumentParser(
        prog="python -m bench realtime", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sessions", default="1,4,8")
    parser.add_argument("--files", action="store_true", help="file jobs beside the sessions")
    parser.add_argument(
        "--silence-ms", type=int, help="silence that ends a turn (the server's default: 500)"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "realtime.json"))
    args = parser.parse_args(argv)
    order = clips()
    machine = describe()
    rows = []
    with tempfile.TemporaryDirectory(prefix="realtime-") as tmp:
        proc, base = start_server(
            Path(tmp), {"WHISPER_REALTIME_MAX_SESSIONS": "16", "WHISPER_MAX_CONCURRENCY": "16"}
        )
        try:
            files_wer = file_wer(base, order)
            for n in (int(x) for x in args.sessions.split(",")):
                rows.append(run_level(base, n, order, args.files, proc.pid, args.silence_ms))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    print(machine_line(machine, describe()["load_1m"]))
    print(
        f"{len(order)} clips per session, {GAP_S} s apart, real-time pace; the same clips "
        f"as files: WER {100 * files_wer:.1f} %"
    )
    head = (
        "sessions",
        "end -> completed p50 s",
        "p95 s",
        "start -> first delta p50 s",
        "turns",
        "WER",
        "CPU s per session-s",
        "file jobs ok",
    )
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        fj = r["file_jobs"]
        print(
            "| "
            + " | ".join(
                str(x)
                for x in (
                    r["sessions"],
                    r["end_to_completed_p50_s"],
                    r["end_to_completed_p95_s"],
                    r["start_to_first_delta_p50_s"],
                    r["turns"],
                    f"{100 * r['wer']:.1f} %",
                    r["cpu_s_per_session_s"],
                    f"{fj['ok']}/{fj['sent']}" if fj else "-",
                )
            )
            + " |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"machine": machine, "files_wer": files_wer, "rows": rows}, indent=2)
    )
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
