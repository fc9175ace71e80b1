"""LiteLLM's proxy in front of the worker, as teams that route every model through it run it.

``python -m bench litellm-proxy`` starts the worker in HTTP mode (``python -m handler
serve``, tiny.en) and LiteLLM's proxy (``litellm --config``) on 127.0.0.1, the proxy's
config naming the worker's OpenAI routes as three models (``whisper-1`` and
``gpt-4o-transcribe`` in ``audio_transcription`` mode, ``gpt-realtime-whisper`` in
``realtime`` mode), and then, through the proxy with the openai SDK:

- ``/v1/audio/transcriptions`` for each committed clip (JFK and the LibriVox readings) as
  ``json``, and JFK as ``verbose_json`` with word times, ``srt`` and ``vtt``: the WER beside
  the same requests sent to the worker directly, and the time the proxy adds (p50);
- ``/v1/realtime?intent=transcription`` through the proxy's realtime passthrough: one session
  of the realtime bench's recording (the clips 1.5 s apart, real-time pace, server VAD):
  its turns' WER and end of speech to completed transcript, beside the same session direct.

The proxy's package (``litellm[proxy]``) pins versions of litellm and websockets that the
tests' environment does not take, so it lives in a virtualenv of its own, made on first use
(``--venv``, default ``bench/out/litellm-proxy-venv``; pip from PyPI). Traffic stays on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai

from bench.common.machine import describe
from bench.common.machine import line as machine_line
from bench.common.report import percentile
from bench.common.servers import free_port, start_until_healthy
from bench.speed.realtime import SessionLog, measure, recording, run_session
from speech_assets.clips import clips, wer

ROOT = Path(__file__).resolve().parents[2]
PROXY_PACKAGE = "litellm[proxy]==1.108.7"
FORMATS = ("verbose_json", "srt", "vtt")


def proxy_venv(folder: Path) -> Path:
    """The proxy's own virtualenv (made and filled once); its ``litellm`` command."""
    command = folder / "bin" / "litellm"
    if not command.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, PROXY_PACKAGE], check=True)
    return command


def proxy_config(worker: str) -> str:
    api = {"api_base": worker + "/v1", "api_key": "unused"}
    models = [
        ("whisper-1", "audio_transcription"),
        ("gpt-4o-transcribe", "audio_transcription"),
        ("gpt-realtime-whisper", "realtime"),
    ]
    return json.dumps(
        {
            "model_list": [
                {
                    "model_name": name,
                    "litellm_params": {"model": f"openai/{name}", **api},
                    "model_info": {"mode": mode},
                }
                for name, mode in models
            ]
        }
    )


def start_proxy(command: Path, worker: str, tmp: Path, key: str) -> tuple[subprocess.Popen, str]:
    config = tmp / "litellm.json"  # JSON is YAML: the proxy reads it as its config
    config.write_text(proxy_config(worker))
    port = free_port()
    argv = [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR"}
    base = f"http://127.0.0.1:{port}"
    return start_until_healthy(argv, env, tmp / "proxy.log", base + "/health/liveliness"), base


def files_through(base: str, key: str) -> dict[str, Any]:
    """Each clip as json, JFK in the other formats: texts, seconds, what came back."""
    client: Any = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
    texts, seconds = [], []
    for c in clips():
        t0 = time.perf_counter()
        r = client.audio.transcriptions.create(model="whisper-1", file=("c.wav", c.wav_bytes()))
        seconds.append(time.perf_counter() - t0)
        texts.append(r.text)
    jfk = clips()[0]
    shapes = {}
    for fmt in FORMATS:
        extra = {"timestamp_granularities": ["word"]} if fmt == "verbose_json" else {}
        r = client.audio.transcriptions.create(
            model="gpt-4o-transcribe" if fmt != "verbose_json" else "whisper-1",
            file=("jfk.wav", jfk.wav_bytes()),
            response_format=fmt,
            **extra,
        )
        if fmt == "verbose_json":
            shapes[fmt] = f"{len(r.words or [])} words, language {r.language}"
        else:
            body = r if isinstance(r, str) else json.dumps(r.model_dump())
            cues = "-->" in body and body.lstrip().startswith(("1", "WEBVTT"))
            shapes[fmt] = "cues" if cues else f"wrapped in JSON: {body[:30]!r}"
    reference = " ".join(c.text for c in clips())
    return {"wer": wer(reference, " ".join(texts)), "seconds": seconds, "shapes": shapes}


def session_through(url: str, headers: dict[str, str]) -> dict[str, Any]:
    stream = recording(clips())
    log = SessionLog()
    thread = threading.Thread(target=run_session, args=(url, stream, log, 120, headers))
    thread.start()
    thread.join(600)
    got = measure(log, stream)
    reference = " ".join(c.text for c in clips())
    return {
        "wer": wer(reference, got["text"]),
        "turns": got["turns"],
        "p50": statistics.median(got["end_latency"]) if got["end_latency"] else None,
        "p95": percentile(got["end_latency"], 95) if got["end_latency"] else None,
        "errors": [e for _, e in log.events if e["type"] == "error"],
        "failed": log.error,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.soak.http_soak import start_server

    parser = argparse.ArgumentParser(
        prog="python -m bench litellm-proxy", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--venv", default=str(ROOT / "bench" / "out" / "litellm-proxy-venv"))
    args = parser.parse_args(argv)
    command = proxy_venv(Path(args.venv))
    key = "sk-" + secrets.token_hex(24)
    machine = describe()
    with tempfile.TemporaryDirectory(prefix="litellm-proxy-") as name:
        tmp = Path(name)
        worker, worker_base = start_server(tmp, {"WHISPER_REALTIME_MAX_SESSIONS": "4"})
        proxy = None
        try:
            proxy, proxy_base = start_proxy(command, worker_base, tmp, key)
            direct = files_through(worker_base, "unused")
            proxied = files_through(proxy_base, key)
            ws = "/v1/realtime?intent=transcription"
            live_direct = session_through(worker_base.replace("http", "ws") + ws, {})
            live_proxied = session_through(
                proxy_base.replace("http", "ws") + ws + "&model=gpt-realtime-whisper",
                {"Authorization": f"Bearer {key}"},
            )
        finally:
            for p in (proxy, worker):
                if p is not None:
                    p.terminate()
                    p.wait(30)
    report(machine, direct, proxied, live_direct, live_proxied)
    ok = not live_proxied["errors"] and not live_proxied["failed"] and live_proxied["turns"] > 0
    return 0 if ok and proxied["wer"] == direct["wer"] else 1


def _cell(key: str, value: Any) -> str:
    if key == "wer":
        return f"{100 * value:.1f} %"
    if key in ("p50", "p95"):
        return f"{value:.2f}" if value is not None else "-"
    if key == "errors":
        return str(len(value))
    return str(value)


def report(machine: dict[str, Any], direct: dict, proxied: dict, live: dict, live_p: dict) -> None:
    added = [b - a for a, b in zip(direct["seconds"], proxied["seconds"], strict=True)]
    print(machine_line(machine, describe()["load_1m"]))
    print(f"LiteLLM proxy ({PROXY_PACKAGE}) in front of the worker (tiny.en), 127.0.0.1")
    print("| route | direct | through the proxy |\n|---|---|---|")
    n = len(added)
    print(
        f"| transcriptions, {n} clips: WER | {_cell('wer', direct['wer'])} | "
        f"{_cell('wer', proxied['wer'])} |"
    )
    print(f"| transcriptions: proxy's added time p50 | - | {statistics.median(added):.3f} s |")
    for fmt in FORMATS:
        print(f"| {fmt} | {direct['shapes'][fmt]} | {proxied['shapes'][fmt]} |")
    rows = (
        ("realtime: WER", "wer"),
        ("realtime: turns", "turns"),
        ("realtime: end -> completed p50 s", "p50"),
        ("realtime: p95 s", "p95"),
        ("realtime: error events", "errors"),
        ("realtime: session failed", "failed"),
    )
    for label, key in rows:
        print(f"| {label} | {_cell(key, live[key])} | {_cell(key, live_p[key])} |")
