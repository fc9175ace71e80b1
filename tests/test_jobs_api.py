"""RunPod's job API on the HTTP face (e2e tier): the real ``python -m handler serve`` on
127.0.0.1 with tiny.en, driven by the real runpod SDK's ``Endpoint``
(``runpod.endpoint_url_base`` set to the server's ``/v2``), by whisper_client and by plain
HTTP; webhooks to a real receiver on 127.0.0.1. The tests taking ``api`` run twice: on the
embedded engine (no broker), and on a gateway with two real consumer processes behind a
real Redis (Celery; runpod_emulator/broker_stack.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from speech_assets.clips import long_clip, wav_bytes
from tests.helpers import DATA, JFK_TEXT, b64, wait_for, wer
from tests.httpserver import LocalServer, respond
from tests.test_http import Server

pytestmark = [pytest.mark.e2e, pytest.mark.model]

KEY = "k" * 32
SECRET = "s" * 32


ENV = {
    "WHISPER_API_KEY": KEY,
    "WHISPER_WEBHOOK_SECRET": SECRET,
    "WHISPER_WEBHOOK_RETRY_S": "0.3",
    "WHISPER_MAX_CONCURRENCY": "2",
    "WHISPER_MAX_UPLOAD_BYTES": str(16 * 2**20),
}


class Behind:
    """A gateway with its Redis and consumers: answers as Server does, logs of all."""

    def __init__(self, consumers: int = 2) -> None:
        from runpod_emulator.broker_stack import ConsumerProc, RedisServer

        self.redis = RedisServer()
        self.consumers = [ConsumerProc(self.redis.url, **ENV) for _ in range(consumers)]
        self.gateway = Server({**ENV, "WHISPER_BROKER_URL": self.redis.url})
        self.url = self.gateway.url

    def logs(self) -> str:
        return self.gateway.logs() + "".join(c.logs() for c in self.consumers)

    def stop(self) -> None:
        self.gateway.stop()
        for c in self.consumers:
            c.stop()
        self.redis.close()


@pytest.fixture(scope="module", params=["embedded", "broker"])
def api(request: pytest.FixtureRequest) -> Iterator[Any]:
    srv: Any = Server(ENV) if request.param == "embedded" else Behind()
    yield srv
    srv.stop()


def call(srv: Any, method: str, path: str, body: Any = None, key: str = KEY) -> Any:
    return requests.request(
        method,
        f"{srv.url}/v2/my-endpoint/{path}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def ended(srv: Any, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        st = call(srv, "GET", f"status/{job_id}").json()
        return st if st["status"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT") else None

    return wait_for(done, timeout, f"job {job_id} to end")


def long_input(seconds: float = 60) -> dict[str, Any]:
    return {"audio_base64": base64.b64encode(wav_bytes(long_clip(seconds).samples)).decode()}


def test_the_runpod_sdks_endpoint_runs_streams_and_cancels_jobs(api: Any) -> None:
    import runpod

    runpod.api_key = KEY
    runpod.endpoint_url_base = api.url + "/v2"
    endpoint = runpod.Endpoint("any-endpoint-id")
    job = endpoint.run({"audio_base64": b64(DATA / "jfk.wav")})
    out = wait_for(lambda: job.status() == "COMPLETED" and job.output(), 120, "the job")
    assert wer(JFK_TEXT, out["text"]) < 0.2
    sync = endpoint.run_sync({"audio_base64": b64(DATA / "jfk.wav")}, timeout=120)
    assert wer(JFK_TEXT, sync["text"]) < 0.2
    streamed = endpoint.run(long_input(40))
    items = list(streamed.stream())
    assert items and all("segment" in i for i in items), items[:3]
    assert wer(long_clip(40).text, " ".join(i["segment"]["text"] for i in items)) < 0.3
    assert streamed.status() == "COMPLETED"
    doomed = endpoint.run(long_input(120))
    wait_for(lambda: doomed.status() in ("IN_QUEUE", "IN_PROGRESS"), 30, "the long job")
    doomed.cancel()
    assert doomed.status() == "CANCELLED"


def test_whisper_client_against_a_self_hosted_url(api: Any) -> None:
    from whisper_client.client import Client

    with Client("self-hosted", api_key=KEY, base_url=api.url + "/v2") as client:
        job_id = client.run({"audio_base64": b64(DATA / "jfk.wav")})
        status = wait_for(
            lambda: client.status(job_id)["status"] == "COMPLETED" and client.status(job_id),
            120,
            "the job",
        )
        assert wer(JFK_TEXT, status["output"]["text"]) < 0.2
        assert status["delayTime"] >= 0 and status["executionTime"] > 0
        health = client.health()
        assert health["jobs"]["completed"] >= 1 and set(health["workers"]) == {"idle", "running"}
        first = client.stream(job_id)["stream"]  # each segment handed out once
        assert first and "segment" in first[0]["output"] and client.stream(job_id)["stream"] == []
        result = client.transcribe(DATA / "jfk.wav", output=["text"])
        assert wer(JFK_TEXT, result["text"]) < 0.2


def test_bad_requests_on_every_new_route(api: Any) -> None:
    assert call(api, "GET", "status/no-such-job").status_code == 404
    assert call(api, "GET", "status/no-such-job").json() == {"error": "job not found"}
    for route in ("stream/x", "cancel/x"):
        method = "POST" if route.startswith("cancel") else "GET"
        assert call(api, method, route).status_code == 404
    raw = requests.post(
        f"{api.url}/v2/e/run",
        data=b"{not json",
        timeout=30,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert raw.status_code == 400 and "JSON" in raw.json()["error"]
    assert call(api, "POST", "run", {"no": "input"}).status_code == 400
    big = {"input": {"audio_base64": "A" * (17 * 2**20)}}
    assert call(api, "POST", "run", big).status_code == 413
    for key in ("", "wrong-" + KEY):
        assert call(api, "GET", "health", key=key).status_code == 401
    assert call(api, "POST", "run", {"input": {}, "webhook": "ftp://x/"}).status_code == 400
    # A job that can never succeed: FAILED with its code, never retried.
    job = call(api, "POST", "run", {"input": {"audio_base64": "bm90IGF1ZGlv"}}).json()
    st = ended(api, job["id"])
    assert st["status"] == "FAILED" and st["output"]["retryable"] is False
    assert st["output"]["error_code"] == "UNSUPPORTED_OR_CORRUPT_MEDIA", st
    purged = call(api, "POST", "purge-queue").json()
    assert purged["status"] == "completed" and purged["removed"] >= 0


def test_a_webhook_gets_the_signed_status_and_a_dead_one_is_said_failed(api: Any) -> None:
    seen: list[tuple[dict[str, str], bytes]] = []
    answers = iter([500, 200])

    def hook(h: Any) -> None:
        body = h.rfile.read(int(h.headers["Content-Length"]))
        seen.append((dict(h.headers), body))
        respond(h, next(answers, 200))

    with LocalServer() as receiver:
        receiver.route("/hook", hook)
        job = call(
            api,
            "POST",
            "run",
            {"input": {"audio_base64": b64(DATA / "jfk.wav")}, "webhook": receiver.url("/hook")},
        ).json()
        wait_for(lambda: len(seen) >= 2, 120, "the webhook's second try")
    headers, body = seen[-1]
    mac = hmac.new(
        SECRET.encode(), headers["X-Whisper-Timestamp"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert headers["X-Whisper-Signature"] == f"sha256={mac}"
    posted = json.loads(body)
    assert posted["id"] == job["id"] and posted["status"] == "COMPLETED"
    assert wer(JFK_TEXT, posted["output"]["text"]) < 0.2
    status = wait_for(
        lambda: (
            call(api, "GET", f"status/{job['id']}").json()["webhook"]["status"] == "delivered"
            and call(api, "GET", f"status/{job['id']}").json()
        ),
        30,
        "delivered",
    )
    assert status["webhook"]["tries"] == 2
    # A receiver that is down: 3 tries, then the status says so; the result is kept.
    with LocalServer() as gone:
        dead = gone.url("/hook")
    job = call(
        api, "POST", "run", {"input": {"audio_base64": b64(DATA / "jfk.wav")}, "webhook": dead}
    ).json()
    st = wait_for(
        lambda: (
            (s := call(api, "GET", f"status/{job['id']}").json()).get("webhook", {}).get("status")
            == "failed"
            and s
        ),
        120,
        "the webhook to fail",
    )
    assert st["webhook"]["tries"] == 3 and wer(JFK_TEXT, st["output"]["text"]) < 0.2
    assert dead.split("?")[0] not in api.logs()


def test_webhooks_that_hang_do_not_hold_up_another_jobs_webhook(api: Any) -> None:
    """Found by reading the code, then this test: deliveries shared 4 threads, and each
    try waits up to 10 s for an answer, so 8 jobs whose webhook accepts and never answers
    held every thread for about 30 s (3 tries each) and the next job's webhook waited behind
    them, 30 to 60 s. Deliveries now run up to DELIVERIES_AT_ONCE at a time."""
    received: list[float] = []
    hole = socket.socket()  # accepts (the kernel's backlog) and never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    black = f"http://127.0.0.1:{hole.getsockname()[1]}/hook"
    try:
        with LocalServer() as receiver:
            receiver.route("/hook", lambda h: (received.append(time.monotonic()), respond(h, 200)))
            audio = {"audio_base64": b64(DATA / "jfk.wav")}
            hung = [
                call(api, "POST", "run", {"input": audio, "webhook": black}).json()["id"]
                for _ in range(8)
            ]
            for job_id in hung:
                ended(api, job_id)
            good = call(api, "POST", "run", {"input": audio, "webhook": receiver.url("/hook")})
            ended(api, good.json()["id"])
            at = time.monotonic()
            wait_for(lambda: received, 120, "the good webhook")
            assert received[0] - at < 15, received[0] - at
    finally:
        hole.close()  # the hung tries end at once


def test_a_webhook_to_a_private_address_is_refused_by_the_guard() -> None:
    srv = Server({"WHISPER_ALLOW_PRIVATE_URLS": "false", "WHISPER_WEBHOOK_RETRY_S": "0.1"})
    try:
        with LocalServer() as inside:
            inside.route("/hook", lambda h: respond(h, 200))
            body = {
                "input": {"audio_base64": b64(DATA / "jfk.wav")},
                "webhook": inside.url("/hook"),
            }
            job = requests.post(f"{srv.url}/v2/e/run", json=body, timeout=60).json()
            st = wait_for(
                lambda: (
                    (s := requests.get(f"{srv.url}/v2/e/status/{job['id']}", timeout=30).json())
                    .get("webhook", {})
                    .get("status")
                    == "failed"
                    and s
                ),
                120,
                "the refused webhook",
            )
            assert inside.hits["/hook"] == 0 and st["webhook"]["last"] == "URL_NOT_ALLOWED"
    finally:
        srv.stop()


def test_an_endpoint_id_is_checked_when_one_is_configured() -> None:
    srv = Server({"WHISPER_ENDPOINT_ID": "mine"})
    try:
        assert requests.get(f"{srv.url}/v2/other/health", timeout=30).status_code == 404
        assert requests.get(f"{srv.url}/v2/mine/health", timeout=30).status_code == 200
    finally:
        srv.stop()


def test_runsync_answers_the_status_when_its_wait_runs_out(api: Any) -> None:
    started = time.monotonic()
    st = call(api, "POST", "runsync?wait=1000", {"input": long_input(90)}).json()
    assert st["status"] in ("IN_QUEUE", "IN_PROGRESS") and time.monotonic() - started < 30
    assert call(api, "POST", f"cancel/{st['id']}").json()["status"] == "CANCELLED"


def test_the_store_is_bounded_by_count_bytes_and_time() -> None:
    """The embedded store on its own (no model: the run is a stand-in that ends when
    told, so the bounds are what is under test): a full store refuses (429 upstream),
    ended jobs make room oldest first, and expire after the TTL."""
    import asyncio
    import threading

    from handler.faces.jobs import Jobs, StoreFull
    from tests.helpers import make_settings

    release = threading.Event()

    def fake_run(job_input: Any, worker: Any, **_: Any) -> dict[str, Any]:
        release.wait(10)
        return {"text": job_input["say"]}

    async def run_in_slot(job: Any, cancel: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, job, cancel)

    async def scenario() -> None:
        settings = make_settings(result_max_jobs=2, result_max_bytes=2**20, result_ttl_s=10)
        jobs = Jobs(settings, lambda: object(), run_in_slot, run=fake_run)  # type: ignore[arg-type]
        a = jobs.submit({"say": "a"}, 10, None)
        b = jobs.submit({"say": "b"}, 10, None)
        with pytest.raises(StoreFull):
            jobs.submit({"say": "c"}, 10, None)  # two live jobs: no room
        release.set()
        await asyncio.wait_for(asyncio.gather(a.task, b.task), 10)  # type: ignore[arg-type]
        assert a.status_object()["output"] == {"text": "a"} and b.ended
        a.finished = (b.finished or time.time()) - 1  # a ended first (the threads race)
        c = jobs.submit({"say": "c"}, 10, None)  # room made: the oldest ended job went
        assert jobs.get(a.id) is None and jobs.get(b.id) is b
        with pytest.raises(StoreFull):
            jobs.submit({"say": "d"}, 2**21, None)  # over the byte bound on its own
        await asyncio.wait_for(c.task, 10)  # type: ignore[arg-type]
        for rec in (b, c):
            rec.finished = time.time() - 11  # past the TTL
        assert jobs.get(b.id) is None and jobs.health()["jobs"]["completed"] == 0

    asyncio.run(scenario())


def test_sigterm_lets_running_jobs_finish_and_fails_queued_ones_retryably() -> None:
    """On SIGTERM (a platform scaling the server down) the job API's jobs were cancelled
    with the event loop: a running job's webhook said CANCELLED (as if its caller had
    cancelled it) and a queued one's nothing useful. Now the running job gets
    WHISPER_DRAIN_S to finish and its webhook carries the transcript; a queued job fails
    at once with NOT_READY, retryable, so its caller submits it elsewhere."""
    import signal

    posted: list[dict[str, Any]] = []

    def hook(h: Any) -> None:
        posted.append(json.loads(h.rfile.read(int(h.headers["Content-Length"]))))
        respond(h, 200)

    audio = wav_bytes(long_clip(240).samples)
    with LocalServer() as side:
        side.route("/hook", hook)
        side.route("/long.wav", lambda h: respond(h, 200, audio, {"Content-Type": "audio/wav"}))
        srv = Server({**ENV, "WHISPER_MAX_CONCURRENCY": "1", "WHISPER_DRAIN_S": "240"})
        try:
            slow = {"audio_url": side.url("/long.wav"), "batch_size": 1, "beam_size": 5}
            first, second = (
                call(srv, "POST", "run", {"input": slow, "webhook": side.url("/hook")}).json()
                for _ in range(2)
            )
            wait_for(
                lambda: call(srv, "GET", f"status/{first['id']}").json()["status"] == "IN_PROGRESS",
                120,
                "the first job to run",
            )
            assert call(srv, "GET", f"status/{second['id']}").json()["status"] == "IN_QUEUE"
            srv.proc.send_signal(signal.SIGTERM)
            srv.proc.wait(300)
            wait_for(lambda: len(posted) >= 2, 30, "both webhooks")
        finally:
            if srv.proc.poll() is None:
                srv.proc.kill()
            logs = srv.logs()
            srv.stop()
    by_id = {p["id"]: p for p in posted}
    done, refused = by_id[first["id"]], by_id[second["id"]]
    assert done["status"] == "COMPLETED" and len(done["output"]["text"]) > 1000, done
    assert refused["status"] == "FAILED", refused
    assert refused["output"]["error_code"] == "NOT_READY" and refused["output"]["retryable"]
    assert srv.proc.returncode == 0 and "Traceback" not in logs, logs[-2000:]


def test_a_job_that_outlasts_the_drain_fails_retryably_and_is_told_to_stop() -> None:
    """The drain's bound (the store on its own; the run is a stand-in that runs until told
    to stop): past WHISPER_DRAIN_S a running job fails NOT_READY, retryable, and its
    cancel event is set so its thread leaves the model."""
    import asyncio
    import threading

    from handler.faces.jobs import Jobs
    from tests.helpers import make_settings

    stopped = threading.Event()

    def endless(job_input: Any, worker: Any, *, cancel: Any, **_: Any) -> dict[str, Any]:
        if cancel.wait(60):
            stopped.set()
        return {"text": "too late"}

    async def run_in_slot(job: Any, cancel: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, job, cancel)

    async def scenario() -> None:
        jobs = Jobs(make_settings(), lambda: object(), run_in_slot, run=endless)  # type: ignore[arg-type]
        rec = jobs.submit({}, 10, None)
        while rec.status != "IN_PROGRESS":
            await asyncio.sleep(0.01)
        await jobs.drain(0.2)
        st = rec.status_object()
        assert st["status"] == "FAILED" and st["output"]["error_code"] == "NOT_READY", st
        assert st["output"]["retryable"] and "stopped before the job could finish" in st["error"]

    asyncio.run(scenario())
    assert stopped.wait(10)


@pytest.mark.parametrize(
    ("shape", "answer", "tries"),
    [
        (None, 500, 3),  # RunPod's: 3 tries
        (None, 404, 3),
        ("deepgram", 500, 10),  # Deepgram's callbacks: 10 tries
        ("assemblyai", 503, 10),  # AssemblyAI's: 10 tries, but a 4xx ends them
        ("assemblyai", 410, 1),
    ],
)
def test_each_apis_webhook_is_tried_as_that_api_tries_it(
    shape: str | None, answer: int, tries: int
) -> None:
    """The probe: every webhook was tried 3 times; Deepgram tries a callback 10 times and
    AssemblyAI a webhook 10 times, never again after a 4xx. A receiver that answers
    ``answer`` every time is called ``tries`` times, the job's report says so."""
    import threading

    from handler.faces import webhooks
    from tests.helpers import make_settings

    hits: list[str] = []

    def take(h: Any) -> None:
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        hits.append(h.command)
        respond(h, answer)

    class Ended:
        id = "job-1"
        webhook: str | None = None
        webhook_report: dict[str, Any] | None = None

        def status_object(self) -> dict[str, Any]:
            return {"id": self.id, "status": "FAILED", "error": "x", "output": None}

    settings = make_settings(webhook_retry_s=0.1, allow_private_urls=True)
    with LocalServer() as hook:
        hook.route("/hook", take)
        rec = Ended()
        url = hook.url("/hook")
        rec.webhook = url if shape is None else webhooks.target(url, shape, method="PUT")
        webhooks.deliver(rec, settings, threading.Event())
        assert webhooks.wait_idle(60)
    assert len(hits) == tries, hits
    assert rec.webhook_report == {"status": "failed", "tries": tries, "last": f"HTTP {answer}"}
    assert set(hits) == {"PUT" if shape == "deepgram" else "POST"}
