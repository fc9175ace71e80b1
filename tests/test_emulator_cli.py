"""The emulator's start-up lines give a client command that works as printed (issue 13)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def test_printed_client_command_reaches_the_endpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runpod_emulator", "--workers", "0", "--port", "0",
         "--log-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
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
        r = requests.get(f"{base}/{endpoint}/health", headers={"Authorization": f"Bearer {key}"},
                         timeout=10)  # fmt: skip
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(30)
