"""The client (whisper_client/) against the local RunPod emulator on 127.0.0.1.

Fake SDK workers (tests/fake_workers/client_worker.py) answer like the transcription
worker without a model, so most tests take well under a second; one test runs the real
worker (`python -m handler`, tiny.en on the CPU, streaming on) on jfk.mp3. The three
worker processes start together once per module because `import runpod` costs seconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runpod_emulator import Emulator
from whisper_client.client import Client, ClientError, main, output_of

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parent.parent
FAKE_WORKER = Path(__file__).parent / "fake_workers" / "client_worker.py"
READY_S = 90.0  # import runpod (and, for the real worker, the model) on a loaded machine
JOB_S = 30.0
SECRET_KEY = "sk-test-never-printed-4711"


@dataclass
class Endpoints:
    fake: Emulator  # async handler, returns a dict
    gen: Emulator  # async generator: segments on /stream, aggregated list on /status
    real: Emulator  # python -m handler with WHISPER_STREAM=true
    real_worker: str


def _emulator(tmp: Path, **overrides: Any) -> Emulator:
    settings: dict[str, Any] = {
        "api_key": SECRET_KEY,
        "worker_command": [sys.executable, str(FAKE_WORKER)],
        "ping_interval_ms": 1000,
        "stop_grace_s": 15.0,
        "log_dir": str(tmp),
    }
    settings.update(overrides)
    return Emulator(**settings).start()


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    started: list[Emulator] = []
    try:
        fake = _emulator(tmp_path_factory.mktemp("fake"), endpoint_id="fake-ep")
        started.append(fake)
        gen = _emulator(
            tmp_path_factory.mktemp("gen"), endpoint_id="gen-ep", worker_env={"FAKE_MODE": "gen"}
        )
        started.append(gen)
        real = _emulator(tmp_path_factory.mktemp("real"), endpoint_id="real-ep")
        started.append(real)
        real_worker = real.start_worker(
            {
                "WHISPER_DEVICE": "cpu",
                "WHISPER_STREAM": "true",
                "WHISPER_WARMUP": "false",
                "HF_HUB_OFFLINE": "1",
            },
            command=[sys.executable, "-m", "handler"],
            cwd=str(ROOT),
        )
        workers = [(fake, fake.start_worker()), (gen, gen.start_worker())]
        for em, worker_id in workers:
            em.wait_worker(worker_id, "idle", READY_S)
        yield Endpoints(fake, gen, real, real_worker)
    finally:
        for em in started:
            em.stop(timeout=15)


def client_for(em: Emulator, **kw: Any) -> Client:
    return Client(em.config.endpoint_id, kw.pop("api_key", em.api_key), em.base_url, **kw)


@pytest.fixture
def audio(tmp_path: Path) -> Path:
    """A file whose "transcript" (for the fake workers) is its own text."""
    path = tmp_path / "hello.txt"
    path.write_text("hello there world")
    return path


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def job_record(em: Emulator, job_id: str) -> dict[str, Any]:
    return em.records()["jobs"][job_id]


# --------------------------------------------------------------------------- Python API
def test_run_then_poll_with_progress(endpoints: Endpoints, audio: Path) -> None:
    ids: list[str] = []
    states: list[str] = []
    progress: list[float] = []
    # Polled every 0.2 s over the job's 2.4 s of progress: with the default backoff (0.25 s
    # doubling) a loaded CI machine once saw IN_PROGRESS before the first progress post and
    # then COMPLETED, and no progress at all.
    with client_for(endpoints.fake, poll_initial_s=0.1, poll_max_s=0.2) as client:
        result = client.transcribe(
            audio,
            language="en",
            fake_progress=[10, 50, 90],
            fake_gap=0.8,
            on_submit=ids.append,
            on_status=lambda s: states.append(s["status"]),
            on_progress=progress.append,
        )
    assert result["text"] == "hello there world"
    assert result["received"]["language"] == "en"
    assert job_record(endpoints.fake, ids[0])["kind"] == "run"
    assert states[-1] == "COMPLETED" and "IN_PROGRESS" in states
    assert progress and set(progress) <= {10, 50, 90} and progress == sorted(progress)


def test_runsync_returns_the_result(endpoints: Endpoints, audio: Path) -> None:
    ids: list[str] = []
    with client_for(endpoints.fake) as client:
        result = client.transcribe(audio, sync=True, on_submit=ids.append, output=["text", "srt"])
    assert result["text"] == "hello there world" and "-->" in result["srt"]
    assert job_record(endpoints.fake, ids[0])["kind"] == "runsync"


def test_runsync_wait_running_out_falls_back_to_polling(endpoints: Endpoints, audio: Path) -> None:
    states: list[str] = []
    with client_for(endpoints.fake) as client:
        started = time.monotonic()
        status = client.runsync({"audio_url": "https://x.test/a.mp3", "fake_sleep": 2.5}, 1000)
        assert status["status"] in ("IN_QUEUE", "IN_PROGRESS")
        assert time.monotonic() - started < 2.4
        result = client.transcribe(
            audio,
            sync=True,
            wait_ms=1000,
            fake_sleep=2.5,
            on_status=lambda s: states.append(s["status"]),
        )
    assert result["text"] == "hello there world"
    # on_status is only fed by wait()'s /status polls: the fallback ran.
    assert states and states[-1] == "COMPLETED"


def test_stream_partials_arrive_while_running_and_join_into_the_result(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    audio = tmp_path / "words.txt"
    audio.write_text("one two three four five")
    ids: list[str] = []
    partials: list[tuple[str, str]] = []  # (text, job status on the emulator at arrival)
    progress: list[float] = []

    def on_partial(segment: dict[str, Any]) -> None:
        partials.append((segment["text"], endpoints.gen.status(ids[0])["status"]))

    with client_for(endpoints.gen) as client:
        result = client.transcribe(
            audio,
            stream=True,
            fake_gap=0.3,
            fake_progress=[20, 40, 60, 80],
            on_submit=ids.append,
            on_partial=on_partial,
            on_progress=progress.append,
        )
    assert [t for t, _ in partials] == [" one", " two", " three", " four", " five"]
    assert partials[0][1] == "IN_PROGRESS"  # before the job ended
    assert "".join(t for t, _ in partials).strip() == result["text"] == "one two three four five"
    assert result["segments"][0]["text"] == " one"  # the full result, not the stream list
    assert progress and set(progress) <= {20, 40, 60, 80}


def test_cancel_through_the_api(endpoints: Endpoints) -> None:
    em = endpoints.fake
    with client_for(em) as client:
        job_id = client.run({"audio_url": "https://x.test/a.mp3", "fake_sleep": 20})
        wait_for(lambda: em.status(job_id)["status"] == "IN_PROGRESS", JOB_S, "job running")
        assert client.cancel(job_id)["status"] == "CANCELLED"
        status = client.wait(job_id, timeout=5)
    assert status["status"] == "CANCELLED"
    with pytest.raises(ClientError) as caught:
        output_of(status)
    assert caught.value.code == "CANCELLED"
    wait_for(lambda: job_record(em, job_id)["stop_delivered_at"], 10, "job-stop to the worker")
    assert job_record(em, job_id)["done_posts"] == 0


def test_timeout_gives_up_and_cancels_the_job(endpoints: Endpoints, audio: Path) -> None:
    ids: list[str] = []
    with client_for(endpoints.fake) as client:
        started = time.monotonic()
        with pytest.raises(ClientError) as caught:
            client.transcribe(audio, fake_sleep=20, timeout=1.0, on_submit=ids.append)
    assert caught.value.code == "TIMEOUT" and 1.0 <= time.monotonic() - started < 5
    assert endpoints.fake.status(ids[0])["status"] == "CANCELLED"


def test_too_large_input_is_refused_before_sending(
    endpoints: Endpoints, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    em = endpoints.fake
    caplog.set_level(logging.DEBUG, logger="runpod_emulator.server")
    big = tmp_path / "big.wav"
    with open(big, "wb") as f:
        f.truncate(8_000_000)  # sparse: the client must refuse from the size alone
    huge = tmp_path / "huge.wav"
    with open(huge, "wb") as f:
        f.truncate(16_000_000)
    jobs_before = len(em.records()["jobs"])
    with client_for(em) as client:
        client.health()  # control: the log below does show requests that were made
        with pytest.raises(ClientError) as run_too_big:
            client.transcribe(big)
        with pytest.raises(ClientError) as sync_too_big:
            client.transcribe(huge, sync=True)
        with pytest.raises(ClientError) as raw_too_big:
            client.run({"audio_base64": "A" * 10_000_000})
    for caught in (run_too_big, sync_too_big, raw_too_big):
        assert caught.value.code == "INPUT_TOO_LARGE"
    message = str(run_too_big.value)
    assert "10.7 MB" in message and "https://" in message and "s3://" in message
    assert "--sync" in message and "--sync" not in str(sync_too_big.value)
    requests_seen = [r.getMessage() for r in caplog.records if r.name == "runpod_emulator.server"]
    assert any("/health" in line for line in requests_seen)
    assert not any("/run" in line for line in requests_seen)
    assert len(em.records()["jobs"]) == jobs_before


def test_worker_errors_surface_with_their_code(endpoints: Endpoints, audio: Path) -> None:
    for em in (endpoints.fake, endpoints.gen):  # error_code in output / "CODE: msg" string
        with client_for(em) as client, pytest.raises(ClientError) as caught:
            client.transcribe(audio, fake_error="NO_AUDIO_STREAM", stream=em is endpoints.gen)
        assert caught.value.code == "NO_AUDIO_STREAM"
        assert str(caught.value) == "NO_AUDIO_STREAM: fake failure"
        assert caught.value.job_id


def test_platform_errors_are_one_clear_line(endpoints: Endpoints, audio: Path) -> None:
    em = endpoints.fake
    with client_for(em, api_key="wrong-key") as client, pytest.raises(ClientError) as caught:
        client.transcribe(audio)
    assert caught.value.code == "UNAUTHORIZED" and caught.value.http_status == 401
    assert "RUNPOD_API_KEY" in str(caught.value) and "wrong-key" not in str(caught.value)
    missing = Client("no-such-endpoint", em.api_key, em.base_url)
    with pytest.raises(ClientError) as caught:
        missing.status("abc")
    assert caught.value.code == "NOT_FOUND"
    with client_for(em) as client, pytest.raises(ClientError) as caught:
        client.status("no-such-job")
    assert caught.value.code == "NOT_FOUND"


class _Flaky(BaseHTTPRequestHandler):
    """Answers /run with 503, then 429, then a job id."""

    answers: list[int] = []
    seen = 0

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen += 1
        code = type(self).answers.pop(0) if type(self).answers else 200
        body = json.dumps({"id": "job-1", "status": "IN_QUEUE"} if code == 200 else {}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_transient_http_errors_are_retried() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v2"
    try:
        _Flaky.answers, _Flaky.seen = [503, 429], 0
        client = Client("ep", "k", base, retry_backoff_s=0.01)
        assert client.run({"audio_url": "https://x.test/a.mp3"}) == "job-1"
        assert _Flaky.seen == 3
        _Flaky.answers, _Flaky.seen = [503, 503, 503], 0
        with pytest.raises(ClientError) as caught:
            Client("ep", "k", base, retries=2, retry_backoff_s=0.01).run({"a": 1})
        assert caught.value.code == "PLATFORM_ERROR" and _Flaky.seen == 3
    finally:
        server.shutdown()
        server.server_close()
    # Nothing listens there any more: refused connections are retried, then reported.
    with pytest.raises(ClientError) as caught:
        Client("ep", "k", base, retries=1, retry_backoff_s=0.01).run({"a": 1})
    assert caught.value.code == "CONNECTION_ERROR"


def test_output_of_reads_every_result_shape() -> None:
    final = {"text": "hi", "segments": []}
    stream = [{"segment": {"id": 0, "text": " hi"}}, final]
    assert output_of({"id": "j", "status": "COMPLETED", "output": stream}) == final
    assert output_of({"id": "j", "status": "COMPLETED", "output": stream[:1]}) == {"text": "hi"}
    sdk_exception = json.dumps(
        {
            "error_type": "<class 'RuntimeError'>",
            "error_message": "boom",
            "error_traceback": "Traceback ...",
            "hostname": "host-1",
        }
    )
    for status, code, message in (
        ({"status": "COMPLETED"}, "NO_OUTPUT", "without output"),
        ({"status": "FAILED", "error": sdk_exception}, "WORKER_EXCEPTION", "boom"),
        ({"status": "FAILED", "error": "handler: bad\ntraceback: ..."}, "WORKER_EXCEPTION", "bad"),
        ({"status": "TIMED_OUT"}, "TIMED_OUT", "timed out"),
    ):
        with pytest.raises(ClientError) as caught:
            output_of({"id": "j", **status})
        assert caught.value.code == code and message in caught.value.message
        assert "host-1" not in str(caught.value) and "Traceback" not in str(caught.value)


# --------------------------------------------------------------------------- command line
def cli(em: Emulator, *args: str) -> list[str]:
    return ["--endpoint", em.config.endpoint_id, "--base-url", em.base_url, *args]


def test_cli_prints_text_and_exits_zero(
    endpoints: Endpoints, audio: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", endpoints.fake.api_key)
    assert main([str(audio), *cli(endpoints.fake, "--language", "en")]) == 0
    out, err = capsys.readouterr()
    assert out == "hello there world\n"
    assert "submitted" in err and SECRET_KEY not in out + err
    assert main([str(audio), *cli(endpoints.fake, "--sync", "--output", "json")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"] == "hello there world" and result["segments"]


def test_cli_draws_a_progress_bar_on_a_terminal(
    endpoints: Endpoints, audio: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    master, slave = os.openpty()
    os.set_blocking(master, False)
    terminal = os.fdopen(slave, "w")
    monkeypatch.setenv("RUNPOD_API_KEY", endpoints.fake.api_key)
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        options = ("--option", "fake_progress=[50]", "--option", "fake_gap=0.8")
        assert main([str(audio), *cli(endpoints.fake, *options)]) == 0
        terminal.flush()
        drawn = os.read(master, 65536).decode()
    finally:
        terminal.close()
        os.close(master)
    assert "\x1b[K" in drawn and "[##########..........]  50%" in drawn
    assert capsys.readouterr().out == "hello there world\n"


def test_cli_stream_prints_partial_text_as_it_arrives(
    endpoints: Endpoints, audio: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", endpoints.gen.api_key)
    assert main([str(audio), *cli(endpoints.gen, "--stream", "--option", "fake_gap=0.1")]) == 0
    assert capsys.readouterr().out.split() == ["hello", "there", "world"]


def test_cli_job_error_and_bad_key_exit_one(
    endpoints: Endpoints, audio: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    em = endpoints.fake
    monkeypatch.setenv("RUNPOD_API_KEY", em.api_key)
    assert main([str(audio), *cli(em, "--option", "fake_error=EMPTY_AUDIO")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == "error: EMPTY_AUDIO: fake failure"
    monkeypatch.setenv("RUNPOD_API_KEY", "sk-wrong-" + SECRET_KEY)
    assert main([str(audio), *cli(em)]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("error: UNAUTHORIZED: ") and SECRET_KEY not in err
    assert main([str(audio) + ".missing", *cli(em)]) == 1
    assert "INPUT_NOT_FOUND" in capsys.readouterr().err


def test_cli_ctrl_c_cancels_the_job_and_exits_130(
    endpoints: Endpoints, audio: Path, tmp_path: Path
) -> None:
    em = endpoints.fake
    before = set(em.records()["jobs"])
    env = {**os.environ, "RUNPOD_API_KEY": em.api_key}
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "whisper_client",
                str(audio),
                *cli(em, "--option", "fake_sleep=30"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            # A shell without job control starts background commands with SIGINT ignored,
            # and Python then installs no KeyboardInterrupt handler: the CLI would be
            # deaf to Ctrl-C only because of how the tests were started (seen: `.ci/run &`).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:

            def running_job() -> str | None:
                jobs = em.records()["jobs"]
                fresh = [j for j in jobs.values() if j["id"] not in before]
                return fresh[0]["id"] if fresh and fresh[0]["status"] == "IN_PROGRESS" else None

            job_id = wait_for(running_job, JOB_S, "the CLI's job running")
            # The worker can take the job before the CLI has read /run's answer: wait until
            # the CLI knows the id too, or Ctrl-C rightly reports "before ... a job id".
            wait_for(lambda: "submitted" in err_path.read_text(), JOB_S, "the CLI to see the id")
            proc.send_signal(signal.SIGINT)
            try:
                # Generous: the cancel call goes to an emulator in this busy test process.
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"no exit 60 s after Ctrl-C: {err_path.read_text()}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 130, err
    assert f"error: CANCELLED: interrupted; job {job_id} cancelled" in err
    assert em.status(job_id)["status"] == "CANCELLED" and out == ""


# --------------------------------------------------------------------------- real worker
def test_real_worker_transcribes_jfk_streaming_and_sync(
    endpoints: Endpoints, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    em = endpoints.real
    em.wait_worker(endpoints.real_worker, "idle", READY_S)
    jfk = Path(__file__).parent / "data" / "jfk.mp3"
    partials: list[dict[str, Any]] = []
    with client_for(em) as client:
        result = client.transcribe(jfk, stream=True, on_partial=partials.append)
    assert "ask not what your country can do for you" in result["text"].lower()
    assert partials and "".join(p["text"] for p in partials).strip() == result["text"]
    assert result["segments"] and result["language"] == "en"

    monkeypatch.setenv("RUNPOD_API_KEY", em.api_key)
    assert main([str(jfk), *cli(em, "--sync", "--output", "srt")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "1\n00:00:00,000 --> "
    ) and "ask not what your country" in out.lower().replace("\n", " ")


def test_result_of_reads_what_the_runpod_sdk_returns() -> None:
    from whisper_client import result_of

    full = {"text": "one two", "segments": []}
    assert result_of(full) is full
    streamed = [
        {"segment": {"id": 1, "text": " one"}},
        {"segment": {"id": 2, "text": " two"}},
        full,
    ]
    assert result_of(streamed) is full
    assert result_of([{"segment": {"id": 1, "text": " one"}}]) is None
    assert result_of(None) is None


# --------------------------------------------------------------------------- stream races
class HandWorker:
    """The test plays the worker over the emulator's worker routes, as the SDK does: take a
    job, post stream items, post the result; so the test can land a post exactly between
    two reads of the caller (the race a busy machine makes by chance)."""

    def __init__(self, em: Emulator) -> None:
        import requests

        self.em, self.http, self.wid = em, requests.Session(), "hand-worker"
        self.prefix = f"{em.base_url}/{em.config.endpoint_id}"
        self.http.headers["Authorization"] = em.api_key

    def take(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = self.http.get(f"{self.prefix}/job-take/{self.wid}?gpu=emulated", timeout=10)
            if r.status_code == 200 and r.content:
                return str(r.json()["id"])
        raise AssertionError("no job to take")

    def post(self, route: str, job_id: str, body: dict[str, Any], stream: bool) -> None:
        url = (
            f"{self.prefix}/{route}/{self.wid}/{job_id}?gpu=emulated&isStream={str(stream).lower()}"
        )
        r = self.http.post(url, data=json.dumps(body), timeout=10)
        assert r.status_code == 200, r.text

    def finish(self, job_id: str, segments: list[dict[str, Any]]) -> None:
        """The last segment, then the whole result, back to back."""
        self.post("job-stream", job_id, {"output": {"segment": segments[-1]}}, True)
        result = {"text": "".join(s["text"] for s in segments).strip(), "segments": segments}
        self.post(
            "job-done", job_id, {"output": [*({"segment": s} for s in segments), result]}, True
        )


SEGMENTS = [
    {"id": 1, "start": 0.0, "end": 4.0, "text": " And so my fellow Americans,"},
    {"id": 2, "start": 4.0, "end": 8.0, "text": " ask not what your country can do for you."},
]


def test_the_clients_stream_never_misses_the_last_segment(tmp_path: Path) -> None:
    """On a busy machine `transcribe(stream=True, on_partial=...)` delivered one
    partial while the result held two. The race, made certain: the last segment and the
    result land right after the client's read of the stream, before its read of the status."""
    em = Emulator(api_key=SECRET_KEY, log_dir=str(tmp_path)).start()
    try:
        worker = HandWorker(em)
        partials: list[dict[str, Any]] = []
        with client_for(em) as client:
            real_stream = client.stream
            state: dict[str, Any] = {}

            def stream_then_race(job_id: str) -> dict[str, Any]:
                chunk = real_stream(job_id)
                if chunk.get("stream") and not state.get("raced"):
                    state["raced"] = True
                    worker.finish(job_id, SEGMENTS)
                return chunk

            client.stream = stream_then_race  # type: ignore[method-assign]

            def play() -> None:
                job_id = worker.take()
                worker.post("job-stream", job_id, {"output": {"segment": SEGMENTS[0]}}, True)

            player = threading.Thread(target=play)
            player.start()
            result = client.transcribe(
                Path(__file__).parent / "data" / "jfk.mp3", stream=True, on_partial=partials.append
            )
            player.join(30)
        assert state.get("raced"), "the race was not staged"
        assert [p["id"] for p in partials] == [1, 2]
        assert "".join(p["text"] for p in partials).strip() == result["text"]
    finally:
        em.stop()


def test_the_runpod_sdks_stream_never_misses_the_last_segment(tmp_path: Path, monkeypatch) -> None:
    """The same race for `runpod.Endpoint(...).run(...).stream()`, what most callers use:
    the last segment and the result land the moment the SDK has read the first."""
    import runpod

    em = Emulator(api_key=SECRET_KEY, log_dir=str(tmp_path)).start()
    try:
        worker = HandWorker(em)
        monkeypatch.setattr(runpod, "api_key", em.api_key)
        monkeypatch.setattr(runpod, "endpoint_url_base", em.base_url)
        job = runpod.Endpoint(em.config.endpoint_id).run({"audio_url": "https://x.test/a.mp3"})
        job_id = worker.take()
        worker.post("job-stream", job_id, {"output": {"segment": SEGMENTS[0]}}, True)

        def race() -> None:
            # The moment the SDK's /stream read has handed out the first item.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with em.state.cond:
                    if em.state.jobs[job_id].stream_cursor >= 1:
                        break
                time.sleep(0.001)
            worker.finish(job_id, SEGMENTS)

        racer = threading.Thread(target=race)
        racer.start()
        items = list(job.stream())
        racer.join(30)
        segments = [i["segment"] for i in items if isinstance(i, dict) and "segment" in i]
        assert [s["id"] for s in segments] == [1, 2]
    finally:
        em.stop()
