"""The JavaScript clients, as a web or Node.js app runs them, against the HTTP mode.

Voice and web apps call a transcription service from Node.js as often as from Python: the
OpenAI Node SDK, the Vercel AI SDK's ``transcribe()``, Deepgram's and AssemblyAI's
JavaScript SDKs. Each is the real package from npm (``tests/js/package.json``, versions
pinned in its lock file, installed by ``npm ci`` on the first run), configured as its docs
show with only the base URL pointed at the worker (``python -m handler serve`` on 127.0.0.1
with tiny.en). A script per client (``tests/js/*.mjs``) prints what the client handed back
as one JSON line; the assertions are here.

What they found: the OpenAI form field ``temperature`` arrives as text (``"0.2"``) from
every SDK and was refused as "not a number" (tests/test_http.py has its Python SDK test).
AssemblyAI's and the OpenAI SDK's live clients insist on ``wss://`` (they build the URL
themselves), so their live sockets are not run here against a plain 127.0.0.1 server:
tests/test_assemblyai.py and tests/test_voice_clients.py run those protocols.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import srt

from tests.helpers import DATA, JFK_TEXT, wer
from tests.test_http import Server

pytestmark = pytest.mark.e2e

JS = Path(__file__).parent / "js"
JFK = DATA / "jfk.wav"


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the clients installed from the lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("needs Node.js 18+ and npm (apt-get install nodejs npm; .ci/run does)")
    fresh = not (JS / "node_modules" / ".package-lock.json").exists()
    cmd = [npm, "ci" if fresh else "install", "--no-audit", "--no-fund", "--no-save"]
    done = subprocess.run(cmd, cwd=JS, capture_output=True, text=True, timeout=600)
    if done.returncode:
        # No registry here: not the worker's failure. Said in the skip, with npm's words.
        pytest.skip(f"npm could not install the clients: {done.stderr.strip()[-300:]}")
    return node


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server({"WHISPER_MAX_CONCURRENCY": "2", "WHISPER_WARMUP": "true"})
    yield srv
    srv.stop()


def run_js(node: str, script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(JS / script), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_openais_node_sdk(node: str, server: Server) -> None:
    got = run_js(node, "openai_node.mjs", server.url, str(JFK))
    assert wer(got["json"]["text"], JFK_TEXT) < 0.15
    assert got["json"]["usage"] == {"type": "duration", "seconds": pytest.approx(11.0, abs=0.1)}
    verbose = got["verbose"]
    assert verbose["language"] == "english"
    assert verbose["duration"] == pytest.approx(11.0, abs=0.1)
    # temperature 0.2 was sent as the text "0.2", and the decoder started there.
    assert verbose["segments"] and {s["temperature"] for s in verbose["segments"]} <= {
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
    }
    words = verbose["words"]
    assert [w[0].strip(",.").lower() for w in words[:3]] == ["and", "so", "my"]
    assert all(a[1] <= b[1] and a[1] <= a[2] for a, b in zip(words, words[1:], strict=False))
    cues = list(srt.parse(got["srt"]))
    assert cues and cues[-1].end.total_seconds() <= 11.1
    events = got["events"]
    assert [e["type"] for e in events][-1] == "transcript.text.done"
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta")
    assert deltas == events[-1]["text"] and wer(deltas, JFK_TEXT) < 0.15
    assert got["error"] == {
        "status": 415,
        "code": "UNSUPPORTED_OR_CORRUPT_MEDIA",
        "type": "invalid_request_error",
        "name": "APIError",
    }


def test_the_vercel_ai_sdks_transcribe(node: str, server: Server) -> None:
    got = run_js(node, "ai_sdk.mjs", server.url, str(JFK))
    plain = got["plain"]
    assert wer(plain["text"], JFK_TEXT) < 0.15
    assert plain["duration"] == pytest.approx(11.0, abs=0.1)  # read from usage.seconds
    assert plain["warnings"] == []
    options = got["options"]
    assert wer(options["text"], JFK_TEXT) < 0.15
    # The SDK maps verbose_json's language name to its code: "english" -> "en".
    assert options["language"] == "en"
    assert options["duration"] == pytest.approx(11.0, abs=0.1)
    segments = options["segments"]
    assert segments and segments[-1]["endSecond"] <= 11.1
    assert wer(" ".join(s["text"] for s in segments), JFK_TEXT) < 0.15


def test_deepgrams_javascript_sdk_files_and_live(node: str, server: Server) -> None:
    ws = server.url.replace("http://", "ws://")
    got = run_js(node, "deepgram.mjs", server.url, ws, str(JFK))
    file = got["file"]
    assert wer(file["transcript"], JFK_TEXT) < 0.15
    assert file["words"] >= 20 and file["utterances"] >= 1
    assert file["duration"] == pytest.approx(11.0, abs=0.1)
    # A URL the worker never fetches (file:): Deepgram's error body, not a crash of the SDK.
    assert got["refused"]["status"] == 400
    assert got["refused"]["body"]["err_code"] == "URL_NOT_ALLOWED"
    live = got["live"]
    assert live["errors"] == [] and live["close"] == 1000
    assert {"Results", "Metadata"} <= set(live["types"])
    assert live["types"][-1] == "Metadata"
    assert wer(" ".join(live["finals"]), JFK_TEXT) < 0.3, live["finals"]


def test_assemblyais_javascript_sdk(node: str, server: Server) -> None:
    got = run_js(node, "assemblyai.mjs", server.url, str(JFK))
    assert got["status"] == "completed" and got["error"] is None
    assert wer(got["text"], JFK_TEXT) < 0.15
    assert got["language_code"] == "en" and got["words"] >= 20
    assert got["audio_duration"] == pytest.approx(11, abs=0.5)
    assert list(srt.parse(got["srt"]))
    assert got["sentences"] and wer(" ".join(got["sentences"]), JFK_TEXT) < 0.15
    assert got["search"] == 2  # "country", twice
    assert got["deleted"] == "Deleted by user."
