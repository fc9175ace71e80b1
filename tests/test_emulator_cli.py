"""The emulator's start-up lines give a client command that works as printed."""

from __future__ import annotations

import base64
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from speech_assets.clips import long_clip
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_printed_client_command_reaches_the_endpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runpod_emulator",
            "--workers",
            "0",
            "--port",
            "0",
            "--log-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            lines.append(line)
            if "python -m whisper_client" in line:
                break
        command = next(x for x in lines if "python -m whisper_client" in x)
        args = shlex.split(command)
        key = args[0].split("=", 1)[1]
        base = args[args.index("--base-url") + 1]
        endpoint = args[args.index("--endpoint") + 1]
        assert re.match(r"http://127\.0\.0\.1:\d+/v2$", base), base
        r = requests.get(
            f"{base}/{endpoint}/health", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.e2e
@pytest.mark.model
def test_ctrl_c_cancels_the_running_job_and_stops_promptly(tmp_path: Path) -> None:
    """Stopping the emulator while a real worker was mid-job waited for the
    whole job (then SIGKILL after 30 s, logged three times). Now the running job is
    cancelled first and the worker drains in about a second; the job ends CANCELLED."""
    records = tmp_path / "records.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runpod_emulator",
            "--workers",
            "1",
            "--port",
            "0",
            "--log-dir",
            str(tmp_path),
            "--records",
            str(records),
            "--env",
            "WHISPER_DEVICE=cpu",
            "--env",
            "WHISPER_CPU_THREADS=1",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        url, key = re.match(r"endpoint: (\S+)\s+\(Authorization: Bearer (\S+)\)", first).groups()
        auth = {"Authorization": f"Bearer {key}"}
        audio = base64.b64encode(long_clip(150).wav_bytes()).decode()
        job = requests.post(
            f"{url}/run", json={"input": {"audio_base64": audio}}, headers=auth, timeout=30
        ).json()

        def status() -> str:
            return requests.get(f"{url}/status/{job['id']}", headers=auth, timeout=10).json()[
                "status"
            ]

        wait_for(lambda: status() == "IN_PROGRESS", 240, "the real worker to take the job")
        time.sleep(1.0)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "killing it" not in stderr, stderr[-2000:]
    rec = json.loads(records.read_text())
    assert rec["jobs"][job["id"]]["status"] == "CANCELLED"
    (worker,) = rec["workers"].values()
    assert worker["exit_code"] == 0, worker
    assert took < 25, f"the emulator took {took:.1f} s to stop"  # was the job's whole run
