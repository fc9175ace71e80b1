"""The RunPod emulator against real runpod SDK worker processes (tests/fake_workers).

Every wait is bounded; workers are stopped before the server (Emulator.stop). Worker
processes are few because `import runpod` costs seconds each: one shared echo worker,
one generator worker, and one endpoint each for the kill and SIGTERM tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runpod_emulator import Emulator, EmulatorConfig, EndpointState
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

FAKE_WORKER = Path(__file__).parent / "fake_workers" / "echo_worker.py"
READY_S = 60.0  # import runpod takes seconds; more on a loaded machine
JOB_S = 30.0


def _emulator(tmp_path: Path, **overrides: Any) -> Emulator:
    settings: dict[str, Any] = {
        "worker_command": [sys.executable, str(FAKE_WORKER)],
        "ping_interval_ms": 1000,
        "webhook_retry_delay_s": 0.2,
        "stop_grace_s": 20.0,
        "log_dir": str(tmp_path),
    }
    settings.update(overrides)
    return Emulator(**settings)


def call(
    em: Emulator,
    method: str,
    path: str,
    body: Any = None,
    *,
    auth: str | None = "bearer",
    raw: bytes | None = None,
    timeout: float = 60.0,
) -> tuple[int, Any]:
    """One HTTP request to the emulator; returns (status, parsed JSON or None)."""
    headers = {"Content-Type": "application/json"}
    if auth == "bearer":
        headers["Authorization"] = f"Bearer {em.api_key}"
    elif auth == "worker":
        headers["Authorization"] = em.api_key
    elif auth is not None:
        headers["Authorization"] = auth
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(
        f"{em.client_url}/{path}", data=data, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text else None


def wait_status(em: Emulator, job_id: str, statuses: set[str], timeout: float = JOB_S) -> dict:
    def check() -> dict | None:
        code, status = call(em, "GET", f"status/{job_id}")
        assert code == 200, status
        return status if status["status"] in statuses else None

    return wait_for(check, timeout, f"job {job_id} in {statuses}")


def job_record(em: Emulator, job_id: str) -> dict:
    return em.records()["jobs"][job_id]


def worker_log(em: Emulator, worker_id: str) -> str:
    return Path(em.records()["workers"][worker_id]["log_path"]).read_text(errors="replace")


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, Emulator]]:
    """An echo endpoint (its worker holds up to 2 jobs) and a generator endpoint, one
    worker each, started together."""
    echo = _emulator(tmp_path_factory.mktemp("echo"), worker_env={"FAKE_CONCURRENCY": "2"})
    echo.start()
    gen = _emulator(tmp_path_factory.mktemp("gen"), worker_env={"FAKE_MODE": "gen"}).start()
    try:
        echo_worker = echo.start_worker()
        gen_worker = gen.start_worker()
        echo.wait_worker(echo_worker, "idle", READY_S)
        gen.wait_worker(gen_worker, "idle", READY_S)
        yield echo, gen
    finally:
        for em in (echo, gen):  # SIGTERM both at once: each drain takes about a second
            for worker_id in em.worker_states():
                em.stop_worker(worker_id)
        echo.stop(timeout=15)
        gen.stop(timeout=15)


@pytest.fixture
def echo(endpoints: tuple[Emulator, Emulator]) -> Emulator:
    return endpoints[0]


def _only_worker(em: Emulator) -> str:
    (worker_id,) = em.worker_states()
    return worker_id


def test_job_completes_with_output_and_timings(echo: Emulator) -> None:
    before = time.time()
    code, answer = call(echo, "POST", "run", {"input": {"hello": "world"}})
    assert code == 200 and answer["status"] == "IN_QUEUE"
    deep = b"[" * 100_000 + b"]" * 100_000  # past Python's recursion limit: refused, no crash
    assert call(echo, "POST", "run", raw=deep)[0] == 400
    status = wait_status(echo, answer["id"], {"COMPLETED", "FAILED"})
    assert status["status"] == "COMPLETED"
    assert status["output"] == {"echo": {"hello": "world"}}
    assert status["workerId"] == _only_worker(echo)
    assert isinstance(status["delayTime"], int) and isinstance(status["executionTime"], int)
    record = job_record(echo, answer["id"])
    assert before <= record["submitted_at"] <= record["taken_at"] <= record["finished_at"]
    assert record["delay_ms"] == status["delayTime"]
    assert record["execution_ms"] == status["executionTime"]
    assert record["done_posts"] == 1 and record["late_posts"] == 0


def test_error_result_and_exception_fail_with_string_error(echo: Emulator) -> None:
    failed = echo.wait_job(echo.submit({"error": "boom"}), JOB_S)
    assert failed["status"] == "FAILED" and failed["error"] == "boom"
    assert failed["output"] == {"detail": "from echo_worker"}
    raised = echo.wait_job(echo.submit({"raise": "bad input"}), JOB_S)
    assert raised["status"] == "FAILED" and isinstance(raised["error"], str)
    assert json.loads(raised["error"])["error_message"] == "bad input"


def test_runsync_returns_result_or_current_status(echo: Emulator) -> None:
    code, status = call(echo, "POST", "runsync?wait=30000", {"input": {"n": 1}})
    assert code == 200 and status["status"] == "COMPLETED"
    assert status["id"].startswith("sync-") and status["output"] == {"echo": {"n": 1}}
    started = time.time()
    code, status = call(echo, "POST", "runsync?wait=10", {"input": {"sleep": 2.5}})
    # wait=10 ms is clamped to the 1 s minimum: the answer is the unfinished status.
    assert code == 200 and status["status"] in ("IN_QUEUE", "IN_PROGRESS")
    assert 0.9 <= time.time() - started < 10
    assert echo.wait_job(status["id"], JOB_S)["status"] == "COMPLETED"


def test_progress_shows_while_running_and_late_progress_is_ignored(echo: Emulator) -> None:
    job_id = echo.submit({"progress": {"pct": 50}, "sleep": 2})

    def progress_or_end() -> dict | None:
        s = echo.status(job_id)
        running = s["status"] == "IN_PROGRESS" and "output" in s
        return s if running or s["status"] in ("COMPLETED", "FAILED") else None

    running = wait_for(progress_or_end, JOB_S, "progress output")
    assert running["status"] == "IN_PROGRESS" and running["output"] == {"pct": 50}
    final = echo.wait_job(job_id, JOB_S)
    assert final["output"]["echo"]["sleep"] == 2
    # A progress post that lands after the result (the SDK sends them from a thread).
    worker_id = final["workerId"]
    code, _ = call(
        echo,
        "POST",
        f"job-done/{worker_id}/{job_id}?gpu=x&isStream=false",
        {"status": "IN_PROGRESS", "output": {"pct": 99}},
        auth="worker",
    )
    assert code == 200
    assert echo.status(job_id) == final


def test_stream_items_handed_out_once_and_aggregated(endpoints: tuple[Emulator, Emulator]) -> None:
    gen = endpoints[1]
    code, answer = call(gen, "POST", "run", {"input": {"items": 5, "gap": 0.3}})
    assert code == 200
    seen: list[Any] = []
    deadline = time.time() + JOB_S
    while time.time() < deadline:
        code, chunk = call(gen, "GET", f"stream/{answer['id']}")
        assert code == 200
        seen += [item["output"] for item in chunk["stream"]]
        if chunk["status"] == "COMPLETED":
            break
    assert seen == [{"i": k} for k in range(5)]
    code, chunk = call(gen, "GET", f"stream/{answer['id']}")
    assert chunk == {"id": answer["id"], "status": "COMPLETED", "stream": []}
    final = gen.wait_job(answer["id"], JOB_S)
    assert final["output"] == [{"i": k} for k in range(5)]  # return_aggregate_stream


def test_one_worker_runs_two_jobs_at_once_via_batch_take(echo: Emulator) -> None:
    ids = [echo.submit({"sleep": 1.5, "k": k}) for k in range(2)]
    finals = [echo.wait_job(job_id, JOB_S) for job_id in ids]
    assert [f["output"]["echo"]["k"] for f in finals] == [0, 1]
    first, second = (job_record(echo, job_id) for job_id in ids)
    assert second["taken_at"] < first["finished_at"]  # they overlapped
    assert echo.records()["workers"][_only_worker(echo)]["takes"]["batch"] > 0


def test_cancel_running_job_delivers_stop_and_no_result(echo: Emulator) -> None:
    job_id = echo.submit({"sleep": 20})
    wait_status(echo, job_id, {"IN_PROGRESS"})
    # A stop signal that reaches the SDK before it has turned the taken job into a
    # task (up to 0.1 s) is dropped by the SDK; cancel a job that is surely running.
    time.sleep(0.5)
    code, answer = call(echo, "POST", f"cancel/{job_id}")
    assert code == 200 and answer == {"id": job_id, "status": "CANCELLED"}
    record = wait_for(
        lambda: (r := job_record(echo, job_id))["stop_delivered_at"] and r, 10, "job-stop"
    )
    worker_id = record["worker_id"]
    # The worker's later heartbeats no longer list the job: its task was cancelled.
    wait_for(
        lambda: any(
            h["t"] > record["stop_delivered_at"] + 0.2 and job_id not in h["job_ids"]
            for h in echo.records()["workers"][worker_id]["heartbeats"]
        ),
        10,
        "a heartbeat without the cancelled job",
    )
    record = job_record(echo, job_id)
    assert record["status"] == "CANCELLED"
    assert record["done_posts"] == 0 and record["late_posts"] == 0
    assert "Job stopped." in worker_log(echo, worker_id)
    assert echo.wait_job(echo.submit({"after": "cancel"}), JOB_S)["status"] == "COMPLETED"


def test_execution_timeout_times_out_and_stops_the_job(echo: Emulator) -> None:
    job_id = echo.submit({"sleep": 20}, policy={"executionTimeout": 1500})
    status = echo.wait_job(job_id, JOB_S)
    assert status["status"] == "TIMED_OUT" and "output" not in status
    wait_for(lambda: job_record(echo, job_id)["stop_delivered_at"], 10, "job-stop")


def test_job_done_5xx_twice_then_success(echo: Emulator) -> None:
    echo.fail_job_done(2, status=503)
    job_id = echo.submit({"n": 5})
    # The SDK retries after 2 s and 3 s (aiohttp_retry FibonacciRetry, 3 attempts).
    status = echo.wait_job(job_id, JOB_S)
    assert status["status"] == "COMPLETED" and status["output"] == {"echo": {"n": 5}}
    assert echo.state.done_failures_left == 0
    assert status["executionTime"] >= 4000


def test_payload_limits(echo: Emulator) -> None:
    big = b'{"input": {"x": "' + b"a" * (10 * 1024 * 1024) + b'"}}'
    code, answer = call(echo, "POST", "run", raw=big)
    assert code == 413 and "too large" in answer["error"]
    # A result over the /run limit: the platform answers the worker 400 and the
    # client sees the job without output.
    status = echo.wait_job(echo.submit({"big": 11 * 1024 * 1024}), JOB_S)
    assert status["status"] == "COMPLETED" and "output" not in status
    worker_id = status["workerId"]
    assert "result too large" in job_record(echo, status["id"])["note"]
    wait_for(lambda: "Failed to return job results" in worker_log(echo, worker_id), 10, "SDK log")


def test_auth_and_routes(echo: Emulator) -> None:
    assert call(echo, "GET", "health", auth=None)[0] == 401
    assert call(echo, "GET", "health", auth=echo.api_key)[0] == 401  # raw key: worker only
    assert call(echo, "GET", "ping/someone", auth="bearer")[0] == 401
    assert call(echo, "GET", "status/nope")[0] == 404
    code, health = call(echo, "GET", "health")
    assert code == 200 and set(health) == {"jobs", "workers"}
    assert health["jobs"]["completed"] >= 0


class _Receiver(BaseHTTPRequestHandler):
    fail_first = 0
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        failing = type(self).fail_first > 0
        type(self).fail_first -= 1
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_webhook_delivered_once_and_retried_on_error(echo: Emulator) -> None:
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook?token=x"
    try:
        _Receiver.bodies = []
        job_id = echo.submit({"hook": 1}, webhook=url)
        final = echo.wait_job(job_id, JOB_S)
        wait_for(lambda: _Receiver.bodies, 10, "webhook")
        time.sleep(0.6)  # longer than the retry delay: no second delivery
        assert _Receiver.bodies == [final]

        _Receiver.bodies, _Receiver.fail_first = [], 1
        job_id = echo.submit({"hook": 2}, webhook=url)
        final = echo.wait_job(job_id, JOB_S)
        wait_for(lambda: len(_Receiver.bodies) == 2, 10, "webhook retry")
        # the emulator records an attempt once it has read the answer: wait for that too
        attempts = wait_for(
            lambda: len(a := job_record(echo, job_id)["webhook_attempts"]) == 2 and a,
            10,
            "the second attempt to be recorded",
        )
        assert [a["status"] for a in attempts] == [500, 200]
    finally:
        receiver.shutdown()
        receiver.server_close()


def test_heartbeats_recorded_with_job_ids(echo: Emulator) -> None:
    job_id = echo.submit({"sleep": 2.5})
    echo.wait_job(job_id, JOB_S)
    worker = echo.records()["workers"][_only_worker(echo)]
    times = [h["t"] for h in worker["heartbeats"]]
    assert len(times) >= 2 and times == sorted(times)
    assert any(job_id in h["job_ids"] for h in worker["heartbeats"])


def test_retry_requeues_failed_job(echo: Emulator) -> None:
    job_id = echo.submit({"error": "again"})
    assert echo.wait_job(job_id, JOB_S)["status"] == "FAILED"
    code, answer = call(echo, "POST", f"retry/{job_id}")
    assert code == 200 and answer["status"] == "IN_QUEUE"
    assert echo.wait_job(job_id, JOB_S)["status"] == "FAILED"
    record = job_record(echo, job_id)
    assert record["retries"] == 1 and len(record["attempts"]) == 2
    done = echo.submit({"n": 0})
    echo.wait_job(done, JOB_S)
    assert call(echo, "POST", f"retry/{done}")[0] == 400


def test_worker_killed_mid_job_is_requeued(tmp_path: Path) -> None:
    with _emulator(tmp_path, max_requeues=1) as em:
        workers = [em.start_worker(), em.start_worker()]
        for worker_id in workers:
            em.wait_worker(worker_id, "idle", READY_S)
        job_id = em.submit({"sleep": 2})
        first = wait_status(em, job_id, {"IN_PROGRESS"})["workerId"]
        pid = em.records()["workers"][first]["pid"]
        em.kill_worker(first)
        em.wait_worker(first, "stopped", 10)
        status = em.wait_job(job_id, JOB_S)
        assert status["status"] == "COMPLETED" and status["workerId"] != first
        record = job_record(em, job_id)
        assert [a["end"] for a in record["attempts"]] == ["lost", "COMPLETED"]
        assert em.exit_code(first) == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):  # its heartbeat child went too
            os.killpg(pid, 0)


def test_lost_job_past_max_requeues_gets_final_status() -> None:
    config = EmulatorConfig(max_requeues=0, lost_job_status="TIMED_OUT")
    state = EndpointState(config)
    job = state.submit({"x": 1})
    state.add_worker("w1", pid=None, log_path=None)
    assert [j["id"] for j in state.take("w1", 1, 0.1)] == [job.id]
    state.worker_gone("w1", -9, "signal 9")
    assert state.status(job.id)["status"] == "TIMED_OUT"
    assert state.take("w2", 1, 0.05) == []


def test_sigterm_during_job_drains_and_exits_zero(tmp_path: Path) -> None:
    events: list[dict] = []
    with _emulator(tmp_path, on_event=events.append) as em:
        worker_id = em.start_worker()
        em.wait_worker(worker_id, "idle", READY_S)
        job_id = em.submit({"progress": "started", "sleep": 2})
        # Until the handler runs: the SDK drains the jobs it is running, but one it has
        # taken and not yet started is dropped at SIGTERM (the platform gives it to
        # another worker). On a loaded machine the take came first and the test failed.
        wait_for(
            lambda: (
                em.status(job_id).get("output") == "started"
                or em.status(job_id)["status"] == "COMPLETED"
            ),
            JOB_S,
            "the handler",
        )
        em.stop_worker(worker_id, graceful=True)
        waiting = em.submit({"n": "not for a stopping worker"})
        em.wait_worker(worker_id, "stopped", 20)
        assert em.exit_code(worker_id) == 0
        status = em.status(job_id)
        assert status["status"] == "COMPLETED" and status["output"]["echo"]["sleep"] == 2
        worker = em.records()["workers"][worker_id]
        assert job_record(em, job_id)["finished_at"] <= worker["stopped_at"]
        assert em.status(waiting)["status"] == "IN_QUEUE"
        # With no worker left: TTL and purge.
        short = em.submit({"n": 1}, policy={"ttl": 300})
        assert em.wait_job(short, 5)["status"] == "TIMED_OUT"
        code, answer = call(em, "POST", "purge-queue")
        assert code == 200 and answer == {"removed": 1, "status": "completed"}
        assert em.queue_length() == 0
    lifecycle = [e["type"] for e in events if e.get("worker_id") == worker_id and "job_id" not in e]
    assert lifecycle == ["worker_started", "worker_ready", "worker_stopping", "worker_stopped"]
    job_events = [e["type"] for e in events if e.get("job_id") == job_id]
    assert job_events == ["job_queued", "job_taken", "job_finished"]


def test_worker_protocol_raw(tmp_path: Path) -> None:
    """The worker URLs driven by hand: holds, batch take, stop channel, slow take."""
    with _emulator(tmp_path, take_poll_s=0.3, stop_poll_s=0.3) as em:
        started = time.time()
        assert call(em, "GET", "job-take/w9?gpu=x&job_in_progress=0", auth="worker") == (204, None)
        assert time.time() - started >= 0.25  # held, not answered at once
        assert call(em, "GET", "job-stop/w9?gpu=x", auth="worker") == (204, None)
        ids = [em.submit({"k": k}) for k in range(3)]
        time.sleep(0.05)
        assert em.queue_delay() > 0
        code, jobs = call(em, "GET", "job-take-batch/w9?gpu=x&batch_size=2", auth="worker")
        assert code == 200 and [j["id"] for j in jobs] == ids[:2]
        assert jobs[0]["input"] == {"k": 0} and em.worker_state("w9") == "busy"
        em.set_take_delay(0.4)
        started = time.time()
        code, job = call(em, "GET", "job-take/w9?gpu=x&job_in_progress=1", auth="worker")
        assert code == 200 and job["id"] == ids[2] and time.time() - started >= 0.35
        em.set_take_delay(0)
        em.cancel(ids[0])
        code, stop = call(em, "GET", "job-stop/w9?gpu=x", auth="worker")
        assert code == 200 and stop == {"jobsToStop": [ids[0]]}
        done = f"job-done/w9/{ids[1]}?gpu=x&isStream=false"
        assert call(em, "POST", done, raw=b"not json", auth="worker")[0] == 400
        deep = b"[" * 100_000 + b"]" * 100_000  # past Python's recursion limit: 400 too
        assert call(em, "POST", done, raw=deep, auth="worker")[0] == 400
        assert call(em, "POST", done, {"error": {"code": 1}}, auth="worker")[0] == 200
        assert em.status(ids[1])["status"] == "COMPLETED" and "output" not in em.status(ids[1])
        assert call(em, "POST", "job-done/w9/nope?isStream=false", {}, auth="worker")[0] == 404
        stream = f"job-stream/w9/{ids[2]}?gpu=x&isStream=false"
        assert call(em, "POST", stream, {"output": "a"}, auth="worker")[0] == 200
        assert call(em, "GET", f"stream/{ids[2]}")[1]["stream"] == [{"output": "a"}]
        assert em.worker_states() == {"w9": "busy"}


def test_injected_job_done_failures_meet_results_not_progress(tmp_path: Path) -> None:
    """A progress update posted while a result failure is armed goes through; the result
    meets the failure (it did not: the progress used it up, and a slow test machine, whose
    jobs post more progress, saw no re-post of the result)."""
    with _emulator(tmp_path, take_poll_s=0.3, stop_poll_s=0.3) as em:
        job_id = em.submit({"k": 1})
        code, job = call(em, "GET", "job-take/w9?gpu=x&job_in_progress=0", auth="worker")
        assert code == 200 and job["id"] == job_id
        em.fail_job_done(1, status=502, after_commit=True)
        done = f"job-done/w9/{job_id}?gpu=x&isStream=false"
        progress = {"status": "IN_PROGRESS", "output": {"pct": 50}}
        assert call(em, "POST", done, progress, auth="worker")[0] == 200
        assert em.state.done_failures_left == 1
        assert call(em, "POST", done, {"output": {"k": 1}}, auth="worker")[0] == 502
        assert em.state.done_failures_left == 0 and em.status(job_id)["status"] == "COMPLETED"
        assert call(em, "POST", done, {"output": {"k": 1}}, auth="worker")[0] == 200
        assert em.records()["jobs"][job_id]["late_posts"] == 1


def test_cli_prints_urls_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        # No worker: stopping one mid-start-up is the flaky part.
        [sys.executable, "-m", "runpod_emulator", "--port", "0", "--workers", "0"],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("endpoint: http://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert "RUNPOD_WEBHOOK_GET_JOB=" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
