"""Flux's eager mode: how much sooner a voice agent hears each turn, and what it costs.

``python -m bench flux-eager`` starts HTTP mode (``python -m handler serve``, tiny.en) on
127.0.0.1 and streams the committed real clips (JFK and the LibriVox readings, 1.5 s apart)
through ``/v2/listen`` at real-time pace in 100-ms chunks, twice: ``eot_threshold=0.7``
alone, then with ``eager_eot_threshold=0.5``. For each turn it reports the time from the end
of its speech (the moment the chunk holding its last word was sent) to its ``EndOfTurn``,
and (eager) to its ``EagerEndOfTurn`` (a clip's pauses may cut it into several turns: its
last turn's); how many EagerEndOfTurn were withdrawn
(``TurnResumed``); the WER of the EndOfTurn transcripts; the server's CPU seconds. Traffic
stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common.machine import describe
from bench.common.machine import line as machine_line
from bench.common.report import percentile
from speech_assets.clips import Clip, clips, wer

ROOT = Path(__file__).resolve().parents[2]
RATE = 16000
CHUNK_S = 0.1
GAP_S = 1.5
MODES = {
    "eot_threshold 0.7": "eot_threshold=0.7",
    "+ eager_eot_threshold 0.5": "eot_threshold=0.7&eager_eot_threshold=0.5",
}


def recording(order: list[Clip]) -> tuple[bytes, list[tuple[int, int]]]:
    """16-kHz PCM of the clips ``GAP_S`` apart after 0.5 s, and where each clip lies (ms)."""
    parts, spans, at = [np.zeros(RATE // 2, np.float32)], [], 500
    for c in order:
        end = at + int(len(c.samples) * 1000 / RATE)
        spans.append((at, end))
        parts += [c.samples, np.zeros(int(GAP_S * RATE), np.float32)]
        at = end + int(GAP_S * 1000)
    pcm = (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()
    return pcm, spans


def stream(url: str, pcm: bytes, timeout: float = 120) -> tuple[dict[int, float], list[Any]]:
    """(audio ms -> wall time its chunk was sent, [(arrival, message)]) for one session."""
    from websockets.sync.client import connect

    sent: dict[int, float] = {}
    got: list[tuple[float, dict[str, Any]]] = []
    with connect(url, open_timeout=60, max_size=None) as ws:

        def reader() -> None:
            try:
                while True:
                    message = ws.recv(timeout=timeout)
                    got.append((time.time(), json.loads(message)))  # stamped on arrival
            except Exception:  # closed: what arrived is in ``got``
                return

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        step, start = int(RATE * 2 * CHUNK_S), time.time()
        for n, i in enumerate(range(0, len(pcm), step)):
            time.sleep(max(0.0, start + n * CHUNK_S - time.time()))  # real-time pace
            ws.send(pcm[i : i + step])
            sent[int((n + 1) * CHUNK_S * 1000)] = time.time()
        ws.send(json.dumps({"type": "CloseStream"}))
        thread.join(timeout)
    return sent, got


def latencies(
    sent: dict[int, float], got: list[Any], spans: list[tuple[int, int]]
) -> dict[str, Any]:
    """Per clip (a clip's pauses may cut it into several turns): from its last chunk sent
    to the EndOfTurn of the last turn that began in it, and to that turn's last
    EagerEndOfTurn before its end."""
    infos = [(t, m) for t, m in got if m.get("type") == "TurnInfo"]
    began = {m["turn_index"]: 1000 * m["audio_window_start"] for _, m in infos
             if m["event"] == "StartOfTurn"}  # fmt: skip
    turn_ends = [(t, m) for t, m in infos if m["event"] == "EndOfTurn"]
    to_end, to_eager = [], []
    for a, b in spans:
        mine = [(t, m) for t, m in turn_ends if a - 400 <= began.get(m["turn_index"], -1) < b]
        later = [v for k, v in sent.items() if k >= b]
        if not mine or not later:
            continue
        t, m = mine[-1]
        to_end.append(t - min(later))
        eager = [u for u, e in infos if e["event"] == "EagerEndOfTurn"
                 and e["turn_index"] == m["turn_index"] and u <= t]  # fmt: skip
        if eager:
            to_eager.append(eager[-1] - min(later))
    events = [m["event"] for _, m in infos]
    return {
        "turns": len(turn_ends),
        "to_end": to_end,
        "to_eager": to_eager,
        "eager": events.count("EagerEndOfTurn"),
        "resumed": events.count("TurnResumed"),
        "text": " ".join(m["transcript"] for _, m in turn_ends),
    }


def run_mode(base: str, query: str, order: list[Clip], pid: int) -> dict[str, Any]:
    pcm, spans = recording(order)
    url = base.replace("http://", "ws://") + "/v2/listen?model=flux-general-en"
    url += f"&encoding=linear16&sample_rate={RATE}&{query}"
    proc = psutil.Process(pid)
    cpu0 = sum(proc.cpu_times()[:2])
    sent, got = stream(url, pcm)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    out = latencies(sent, got, spans)
    reference = " ".join(c.text for c in order)
    ms = [round(1000 * x) for x in out["to_end"]]
    eager_ms = [round(1000 * x) for x in out["to_eager"]]
    return {
        "turns": out["turns"],
        "clips_timed": f"{len(out['to_end'])}/{len(order)}",
        "end_p50_ms": round(percentile(ms, 50)) if ms else None,
        "end_max_ms": max(ms) if ms else None,
        "eager_p50_ms": round(percentile(eager_ms, 50)) if eager_ms else None,
        "eager": out["eager"],
        "resumed": out["resumed"],
        "wer": round(wer(reference, out["text"]), 4),
        "cpu_s": round(cpu, 1),
        "end_ms": ms,
        "mean_end_ms": round(statistics.mean(ms)) if ms else None,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.soak.http_soak import start_server

    parser = argparse.ArgumentParser(
        prog="python -m bench flux-eager", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "flux_eager.json"))
    args = parser.parse_args(argv)
    order, machine, rows = clips(), describe(), {}
    with tempfile.TemporaryDirectory(prefix="flux-eager-") as tmp:
        proc, base = start_server(Path(tmp), {"WHISPER_REALTIME_MAX_SESSIONS": "2"})
        try:
            for name, query in MODES.items():
                rows[name] = run_mode(base, query, order, proc.pid)
                print(json.dumps({name: rows[name]}), flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    print(machine_line(machine, describe()["load_1m"]))
    print(f"{len(order)} clips, {GAP_S} s apart, real-time pace, tiny.en")
    head = ("mode", "turns", "clips", "speech end -> EndOfTurn p50 ms", "max ms",
            "-> EagerEndOfTurn p50 ms", "eager", "withdrawn", "WER", "CPU s")  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, r in rows.items():
        cells = (name, r["turns"], r["clips_timed"], r["end_p50_ms"], r["end_max_ms"],
                 r["eager_p50_ms"] or "-", r["eager"], r["resumed"], f"{100 * r['wer']:.1f} %",
                 r["cpu_s"])  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
