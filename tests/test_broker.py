"""Broker mode on real parts: Debian's redis-server, consumers as real processes with the
real model, the gateway as the real HTTP server (runpod_emulator/broker_stack.py).

- the store's transitions (Lua in a real Redis): one ending, leases, tries, purge;
- (tests/bench/test_broker_faults.py: jobs through the gateway to 2 consumers, one
  SIGKILLed mid-run and started again: every job completed exactly once, right text);
- Redis restarted (AOF) with jobs queued, then the gateway restarted: nothing lost;
- a broker that is down: 503 and nothing accepted; a job that kills consumers: WORKER_LOST;
- a consumer recycles itself after N jobs without losing one; SIGTERM finishes jobs in hand;
- cancel reaches a running job on a consumer (it leaves the model early).
"""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from handler.faces.broker.store import LEASE_S, UNENDED_TTL_S, JobStore
from runpod_emulator.broker_stack import ConsumerProc, RedisServer, free_port, redis_server
from speech_assets.clips import long_clip, short_jobs, wav_bytes
from tests.helpers import DATA, JFK_TEXT, b64, make_settings, wait_for, wer
from tests.test_http import Server

pytestmark = [pytest.mark.e2e, pytest.mark.model]

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")


@pytest.fixture
def rds() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.close()


def _store(server: RedisServer, ttl: float = 60) -> JobStore:
    return JobStore(redis.Redis.from_url(server.url, decode_responses=True), ttl)


def test_the_store_keeps_one_ending_and_one_runner(rds: RedisServer) -> None:
    store = _store(rds, ttl=60)
    assert store.create("a", None)
    assert store.get("a") is not None and store.get("a").status == "IN_QUEUE"  # type: ignore[union-attr]
    assert store.start("a", "c1") == ("GO", 0, 1)
    # Redelivered while c1 lives (its lease is fresh): not run twice.
    assert store.start("a", "c2")[0] == "LEASED"
    store.stream("a", {"segment": {"id": 1}})
    assert store.end("a", "COMPLETED", {"text": "first"}, None) is True
    # A second completion (the redelivered copy) changes nothing.
    assert store.end("a", "COMPLETED", {"text": "second"}, None) is False
    assert store.cancel("a") is False
    snap = store.get("a")
    assert snap is not None and snap.status_object()["output"] == {"text": "first"}
    assert 0 < store.r.ttl("whisper:job:a") <= 60 and 0 < store.r.ttl("whisper:stream:a") <= 60
    # An ended job delivered again is skipped.
    assert store.start("a", "c2")[0] == "COMPLETED"
    # A consumer that died: its lease lapses, the next try runs and is counted.
    store.create("b", None)
    assert store.start("b", "dead")[0] == "GO"
    store.r.delete("whisper:lease:b")
    assert store.start("b", "c2") == ("GO", 0, 2)
    assert store.health()["jobs"]["retried"] == 1
    # Cancel: a queued job ends at once; the consumer's late ending is refused.
    store.create("c", None)
    assert store.cancel("c") is True and store.end("c", "COMPLETED", {}, None) is False
    store.create("d", None)
    store.create("e", None)
    assert store.purge() == 2 and store.get("d").status == "CANCELLED"  # type: ignore[union-attr]
    assert store.health()["jobs"]["inQueue"] == 0
    # Bounded: no room past the count or the bytes of queued inputs; a start frees room.
    assert store.create("f", None, 600, (2, 1000)) and store.create("g", None, 300, (2, 1000))
    assert not store.create("h", None, 1, (2, 10_000))  # two queued already
    assert not store.create("h", None, 200, (5, 1000))  # 900 + 200 bytes > 1000
    assert store.start("f", "c1")[0] == "GO" and store.create("h", None, 200, (5, 1000))
    assert store.purge() == 2 and store.end("f", "COMPLETED", {}, None)
    # KEDA reads list lengths: the running job ("b") is in the in-flight list, once.
    assert store.r.lrange("whisper:inflight", 0, -1) == ["b"]
    # Nothing a job still needs can be evicted by a volatile-* maxmemory-policy: no TTL
    # until it ends. A lease that went anyway comes back at the next renewal, unless
    # another consumer took the job meanwhile.
    assert store.create("q", None) and store.r.ttl("whisper:job:q") == -1
    store.stream("b", {"segment": {"id": 0}})
    assert store.r.ttl("whisper:job:b") == -1 and store.r.ttl("whisper:stream:b") == -1
    store.r.delete("whisper:lease:b")
    assert store.renew("b", "c2") and store.r.get("whisper:lease:b") == "c2"
    assert not store.renew("b", "c1") and store.r.get("whisper:lease:b") == "c2"
    assert store.end("b", "FAILED", {"error_code": "INTERNAL"}, "x") is True
    assert store.r.llen("whisper:inflight") == 0
    assert LEASE_S >= 10
    # The sweep forgets a job left unended for UNENDED_TTL_S (its message lost with a
    # Redis that kept no AOF), as RunPod forgets a job queued for a day.
    store.create("old", None)
    store.r.hset("whisper:job:old", "submitted", repr(time.time() - UNENDED_TTL_S - 1))
    assert store.lost("whisper", "unacked", 60) == []
    assert store.get("old") is None and store.health()["jobs"]["inQueue"] == 1  # "q"


def _post(url: str, body: Any) -> Any:
    return requests.post(f"{url}/v2/e/run", json=body, timeout=60).json()


def _status(url: str, job_id: str) -> dict[str, Any]:
    return requests.get(f"{url}/v2/e/status/{job_id}", timeout=60).json()


def _all_ended(url: str, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    left, done = set(ids), {}

    def sweep() -> bool:
        for job_id in list(left):
            st = _status(url, job_id)
            if st["status"] in ENDED:
                done[job_id] = st
                left.discard(job_id)
        return not left

    wait_for(sweep, timeout, f"{len(ids)} jobs to end")
    return done


def test_queued_jobs_outlive_a_redis_restart_and_statuses_a_gateway_restart(
    rds: RedisServer,
) -> None:
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    pool = short_jobs()
    try:
        ids = [_post(gateway.url, {"input": {"audio_base64": pool[n][0]}})["id"] for n in range(4)]
        rds.stop()  # with no consumer: the jobs are queued, in Redis only
        down = requests.post(f"{gateway.url}/v2/e/run", json={"input": {}}, timeout=60)
        assert down.status_code == 503 and "broker" in down.json()["error"]
        assert down.headers.get("Retry-After")
        assert requests.get(f"{gateway.url}/v2/e/status/{ids[0]}", timeout=60).status_code == 503
        rds.start()
        consumer = ConsumerProc(rds.url)
        try:
            done = _all_ended(gateway.url, ids, 300)
        finally:
            consumer.stop()
        for n, job_id in enumerate(ids):
            assert done[job_id]["status"] == "COMPLETED"
            assert wer(pool[n][1], done[job_id]["output"]["text"]) < 0.3
        # Nothing accepted while the broker was down.
        assert _store(rds).health()["jobs"]["completed"] == 4
    finally:
        gateway.stop()
    again = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        assert all(_status(again.url, i)["status"] == "COMPLETED" for i in ids)
    finally:
        again.stop()


def test_a_redis_restart_under_a_running_consumer_loses_nothing(rds: RedisServer) -> None:
    """Redis goes away while a consumer holds a job and others wait: the consumer keeps
    its result until Redis is back, stores it once, and the queued jobs run after."""
    consumer = ConsumerProc(rds.url, WHISPER_MAX_CONCURRENCY="1")
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    pool = short_jobs()
    try:
        held = _post(gateway.url, {"input": {"audio_base64": _long(240)}})["id"]
        waiting = [_post(gateway.url, {"input": {"audio_base64": a}})["id"] for a, _ in pool]
        wait_for(lambda: _status(gateway.url, held)["status"] == "IN_PROGRESS", 120, "start")
        rds.stop()
        time.sleep(2)
        rds.start()
        done = _all_ended(gateway.url, [held, *waiting], 300)
        assert {s["status"] for s in done.values()} == {"COMPLETED"}, done
        assert wer(long_clip(240).text, done[held]["output"]["text"]) < 0.3
        counts = _store(rds).health()["jobs"]
        assert counts["completed"] == 1 + len(pool) and counts["inProgress"] == 0, counts
        # The outage fell inside the held job (its consumer saw Redis gone meanwhile).
        assert "cannot reach Redis" in consumer.logs()
        assert done[held]["executionTime"] > 2000
    finally:
        gateway.stop()
        consumer.stop()


def test_the_gateway_bounds_what_waits_in_redis(rds: RedisServer) -> None:
    """With no consumer, the queue fills to WHISPER_RESULT_MAX_JOBS jobs (or
    WHISPER_RESULT_MAX_BYTES of inputs), then /run answers 429 with Retry-After."""
    gateway = Server({"WHISPER_BROKER_URL": rds.url, "WHISPER_RESULT_MAX_JOBS": "2"})
    try:
        audio = short_jobs()[0][0]
        for _ in range(2):
            assert _post(gateway.url, {"input": {"audio_base64": audio}})["status"] == "IN_QUEUE"
        full = requests.post(
            f"{gateway.url}/v2/e/run", json={"input": {"audio_base64": audio}}, timeout=60
        )
        assert full.status_code == 429 and full.headers["Retry-After"], full.text
        assert requests.post(f"{gateway.url}/v2/e/purge-queue", timeout=60).json()["removed"] == 2
        assert _post(gateway.url, {"input": {"audio_base64": audio}})["status"] == "IN_QUEUE"
    finally:
        gateway.stop()


def test_a_redis_near_its_maxmemory_refuses_new_jobs_and_runs_the_ones_it_took(
    rds: RedisServer,
) -> None:
    """Found by a probe: with Redis at its maxmemory (noeviction, as the Kubernetes manifest
    runs it), /run answered 503 "cannot be reached", and the consumer died ("Unrecoverable
    error: OutOfMemoryError" and a traceback: kombu could not note a message it had just
    popped), so the job it took stayed IN_QUEUE. Now a gateway admits a job only while
    Redis uses under REDIS_MEMORY_HEADROOM of its maxmemory (the rest is for the results of
    the jobs it took), and refuses past it with 429 and Retry-After."""
    client = redis.Redis.from_url(rds.url)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 8_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    consumer = ConsumerProc(rds.url)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        audio = b64(DATA / "jfk.wav")  # 470 kB of base64: about 1 MB in Redis, queued
        taken: list[str] = []
        for _ in range(40):
            res = requests.post(
                f"{gateway.url}/v2/e/run", json={"input": {"audio_base64": audio}}, timeout=60
            )
            if res.status_code != 200:
                break
            taken.append(res.json()["id"])
        assert res.status_code == 429 and res.headers["Retry-After"], res.text
        assert 1 <= len(taken) < 40
        for job_id, st in _all_ended(gateway.url, taken, 180).items():
            assert st["status"] == "COMPLETED", (job_id, st)
            assert wer(JFK_TEXT, st["output"]["text"]) < 0.2
        logs = gateway.logs() + consumer.logs()
        assert "Traceback" not in logs and "Unrecoverable" not in logs, logs[-3000:]
        assert "maxmemory" in gateway.logs()  # the operator is told why
    finally:
        gateway.stop()
        consumer.stop()


def test_an_upload_is_refused_when_redis_is_near_its_maxmemory(rds: RedisServer) -> None:
    """AssemblyAI's uploads on a gateway are kept in Redis: one is refused (429: Full) by the
    same rule that admits a job, while Redis would pass REDIS_MEMORY_HEADROOM of its
    maxmemory with it; kept, it is read back whole and expires with the results."""
    from handler.faces.assemblyai.records import Full, InRedis
    from handler.faces.broker.queue import redis_client

    settings = make_settings(broker_url=rds.url, result_ttl_s="60")
    kept = InRedis(redis_client(settings), settings)
    kept.put("upload:small", "a" * 1000)
    assert kept.get("upload:small") == "a" * 1000
    assert 0 < kept.r.ttl("whisper:assemblyai:upload:small") <= 60
    client = redis.Redis.from_url(rds.url)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 2_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    with pytest.raises(Full):
        kept.put("upload:big", "b" * 1_000_000)  # 2 MB of room, 80 % of it for jobs
    assert kept.get("upload:big") is None
    kept.forget("upload:small")
    assert kept.get("upload:small") is None


def test_a_redis_that_evicts_keeps_every_job_it_took(rds: RedisServer) -> None:
    """Found by a probe: ElastiCache, Memorystore, Azure Cache and Redis Cloud run Redis with
    maxmemory-policy volatile-lru by default, which evicts keys that have a TTL when memory is
    full. Every queued job's record had one (a day), so a Redis filled by another tenant
    evicted the queued jobs' records: their status became "job not found", and the consumer
    skipped their messages ("GONE"): accepted jobs lost without a word. Now nothing a job
    still needs has a TTL (the sweep forgets a job unended for a day), so Redis refuses the
    tenant's writes instead, and every job runs once room is made."""
    client = redis.Redis.from_url(rds.url)
    client.config_set("maxmemory-policy", "volatile-lru")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 16_000_000)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    consumer = None
    try:
        audio = b64(DATA / "jfk.wav")
        ids = [_post(gateway.url, {"input": {"audio_base64": audio}})["id"] for _ in range(3)]
        filler, refused = "x" * 256_000, False
        for i in range(200):  # another tenant's keys, without a TTL, up to 51 MB
            try:
                client.set(f"tenant:{i}", filler)
            except redis.OutOfMemoryError:
                refused = True
                break
        assert refused, "Redis took 51 MB over a 16-MB headroom: it evicted something"
        assert client.info("stats")["evicted_keys"] == 0
        for job_id in ids:
            assert _status(gateway.url, job_id)["status"] == "IN_QUEUE"
        client.delete(*[f"tenant:{n}" for n in range(i)])
        consumer = ConsumerProc(rds.url)
        for job_id, st in _all_ended(gateway.url, ids, 240).items():
            assert st["status"] == "COMPLETED", (job_id, st)
            assert wer(JFK_TEXT, st["output"]["text"]) < 0.2
    finally:
        gateway.stop()
        if consumer is not None:
            consumer.stop()


def test_a_redis_that_may_evict_any_key_is_refused_with_the_setting_to_change(
    rds: RedisServer,
) -> None:
    """Under allkeys-lru (a Redis set up as a cache) Redis may evict anything at its
    maxmemory, Celery's queue list included, and no key layout can keep a job. The gateway
    refuses new jobs (503, Retry-After) and its log, and a consumer's, name the setting to
    change; the same Redis without a maxmemory never evicts and is taken."""
    client = redis.Redis.from_url(rds.url)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", 512_000_000)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    consumer = ConsumerProc(rds.url)
    try:
        audio = {"input": {"audio_base64": b64(DATA / "jfk.wav")}}
        refused = requests.post(f"{gateway.url}/v2/e/run", json=audio, timeout=60)
        assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        assert "maxmemory-policy" in refused.text
        assert "maxmemory-policy is allkeys-lru" in gateway.logs()
        assert not client.keys("whisper:job:*")  # nothing was stored or queued
        wait_for(lambda: "maxmemory-policy is allkeys-lru" in consumer.logs(), 120, "its log")
        client.config_set("maxmemory", 0)
        job_id = _post(gateway.url, audio)["id"]
        st = _all_ended(gateway.url, [job_id], 120)[job_id]
        assert st["status"] == "COMPLETED" and wer(JFK_TEXT, st["output"]["text"]) < 0.2
    finally:
        gateway.stop()
        consumer.stop()


def _broken_under_a_job(
    rds: RedisServer,
    breaking: Callable[[redis.Redis], None],
    mending: Callable[[redis.Redis], None],
    refusal: str,
    meanwhile: Callable[[Server], None] = lambda _gateway: None,
) -> tuple[Server, ConsumerProc]:
    """A 120-s job on a consumer while Redis is broken (``breaking``) for 5 s, then mended;
    ``meanwhile(gateway)`` runs while it is broken. Asserts that Redis refused the
    consumer's writes (its ``refusal`` errorstat), that the job ended COMPLETED with its
    text on the same consumer process and that no log has a traceback; the gateway and the
    consumer, still running, for the caller's own checks (the caller stops them)."""
    client = redis.Redis.from_url(rds.url)
    consumer = ConsumerProc(rds.url)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        held = _post(gateway.url, {"input": {"audio_base64": _long(120), "batch_size": 1}})["id"]
        wait_for(lambda: _status(gateway.url, held)["status"] == "IN_PROGRESS", 120, "start")
        pid = consumer.child().pid
        breaking(client)
        try:
            meanwhile(gateway)
            time.sleep(5)
            refused = client.info("errorstats").get(f"errorstat_{refusal}", {}).get("count", 0)
        finally:
            mending(client)
        assert refused > 0  # the consumer's writes met the broken Redis
        st = _all_ended(gateway.url, [held], 300)[held]
        assert st["status"] == "COMPLETED", st
        assert wer(long_clip(120).text, st["output"]["text"]) < 0.3
        assert consumer.child().pid == pid, consumer.logs()[-3000:]  # not restarted
        logs = gateway.logs() + consumer.logs()
        assert "Traceback" not in logs and "Unrecoverable" not in logs, logs[-3000:]
    except BaseException:
        gateway.stop()
        consumer.stop()
        raise
    return gateway, consumer


def test_a_redis_that_fills_under_a_running_job_loses_nothing(rds: RedisServer) -> None:
    """Found by a probe: Redis reached its maxmemory while a consumer held a job (filled by
    something else: the gateway's headroom cannot see another tenant) for a few seconds. The first
    streamed segment that Redis refused failed the job INTERNAL (only a lost connection was
    taken as passing), storing its end failed the Celery task, kombu's acknowledgement
    stopped Celery ("Unrecoverable error") and the supervisor exited: the job never ended.
    Now a refused write passes as a lost connection does (streamed items are dropped, the
    start and end are tried again), said once, not at every look."""

    def fill(client: redis.Redis) -> None:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)

    gateway, consumer = _broken_under_a_job(
        rds, fill, lambda client: client.config_set("maxmemory", 0), "OOM"
    )
    try:
        after = _post(gateway.url, {"input": {"audio_base64": b64(DATA / "jfk.wav")}})["id"]
        st = _all_ended(gateway.url, [after], 120)[after]
        assert st["status"] == "COMPLETED" and wer(JFK_TEXT, st["output"]["text"]) < 0.2
        logs = gateway.logs() + consumer.logs()
        assert "Traceback" not in logs and "Unrecoverable" not in logs, logs[-3000:]
        assert consumer.logs().count("at its maxmemory and refuses writes") <= 4  # not spam
    finally:
        gateway.stop()
        consumer.stop()


def test_a_failover_that_makes_redis_read_only_under_a_running_job_loses_nothing(
    rds: RedisServer,
) -> None:
    """A managed Redis's failover (ElastiCache, Memorystore, Sentinel) demotes the primary:
    until clients reconnect to the new one, every write gets READONLY. Here the one Redis
    is made a replica of an address that is not there (REPLICAOF: it keeps its data, serves
    reads and refuses writes, as a demoted primary does) for 5 s while a consumer holds a
    job, then made primary again. The job must end once with its text, on the same
    consumer process."""

    def new_job(gateway: Server) -> None:  # meanwhile: 503 with Retry-After, the log says why
        refused = requests.post(
            f"{gateway.url}/v2/e/run", json={"input": {"audio_base64": "AAAA"}}, timeout=60
        )
        assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        assert "read-only replica (a failover under way?)" in gateway.logs()

    gateway, consumer = _broken_under_a_job(
        rds,
        lambda client: client.execute_command("REPLICAOF", "127.0.0.1", str(free_port())),
        lambda client: client.execute_command("REPLICAOF", "NO", "ONE"),
        "READONLY",
        new_job,
    )
    gateway.stop()
    consumer.stop()


def test_a_redis_error_reply_under_a_running_job_makes_celery_reconnect_not_stop(
    rds: RedisServer,
) -> None:
    """Found by a probe: kombu acknowledges a message in a MULTI, which Redis refuses at
    its maxmemory (it refuses any command queued in a transaction then); the error reply
    stopped Celery ("Unrecoverable error", a traceback quoting the command), the consumer
    process exited 0, and the supervisor took that for a stop and exited too: no consumer
    was left. The same refusal is made here at will by taking ZREM from Redis's user (ACL)
    while a job runs, then giving it back. Now Celery reconnects as it does when the
    connection drops (broker_channel_error_retry), the log says so in one line, and the job
    ends once with its text on the same consumer process."""
    client = redis.Redis.from_url(rds.url)
    consumer = ConsumerProc(rds.url)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        held = _post(gateway.url, {"input": {"audio_base64": _long(60), "batch_size": 1}})["id"]
        wait_for(lambda: _status(gateway.url, held)["status"] == "IN_PROGRESS", 120, "start")
        pid = consumer.child().pid
        client.execute_command("ACL", "SETUSER", "default", "-zrem")
        wait_for(lambda: "Redis refused a command" in consumer.logs(), 120, "the refused ack")
        client.execute_command("ACL", "SETUSER", "default", "+zrem")
        st = _all_ended(gateway.url, [held], 120)[held]
        assert st["status"] == "COMPLETED" and wer(long_clip(60).text, st["output"]["text"]) < 0.3
        after = _post(gateway.url, {"input": {"audio_base64": b64(DATA / "jfk.wav")}})["id"]
        st = _all_ended(gateway.url, [after], 120)[after]
        assert st["status"] == "COMPLETED" and wer(JFK_TEXT, st["output"]["text"]) < 0.2
        assert consumer.child().pid == pid and consumer.proc.poll() is None
        logs = consumer.logs()
        assert "Traceback" not in logs and "Unrecoverable" not in logs, logs[-3000:]
        assert "ZREM" not in logs  # redis-py's text, which quotes the command, is not logged
    finally:
        client.execute_command("ACL", "SETUSER", "default", "+zrem")
        gateway.stop()
        consumer.stop()


def test_the_supervisor_starts_another_consumer_unless_one_cannot_start(
    tmp_path: Path,
) -> None:
    """The supervisor's contract with its consumer process, on real processes: a consumer
    that recycled itself (75), stopped on a broker error (69) or was killed by a signal is
    followed by another; one that stopped cleanly (0) ends the supervisor with 0; one that
    cannot start (1: bad settings or model) ends it with that status. Before, a consumer
    whose Celery had stopped on a broker error exited 0 and took the supervisor with it."""
    import signal as signals

    from handler.faces.broker.consumer import BROKER_EXIT, RECYCLE_EXIT, supervise
    from handler.settings import load_settings

    def run(codes: list[int]) -> tuple[int, int]:
        """supervise() over a consumer that exits with ``codes`` in turn (a negative one:
        killed by that signal): its status, and how many consumers it started."""
        count = tmp_path / f"runs-{len(list(tmp_path.iterdir()))}"
        script = (
            "import os, signal, sys\n"
            f"p = {str(count)!r}\n"
            "n = len(open(p).read()) if os.path.exists(p) else 0\n"
            "open(p, 'a').write('x')\n"
            f"code = {codes!r}[n]\n"
            "os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)\n"
        )
        handlers = signals.getsignal(signals.SIGTERM), signals.getsignal(signals.SIGINT)
        try:
            status = supervise(load_settings({}), [sys.executable, "-c", script])
        finally:
            signals.signal(signals.SIGTERM, handlers[0])
            signals.signal(signals.SIGINT, handlers[1])
        return status, len(count.read_text())

    assert run([RECYCLE_EXIT, BROKER_EXIT, -signals.SIGKILL, 0]) == (0, 4)
    assert run([BROKER_EXIT, 1]) == (1, 2)


def _self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(folder / "cert.pem"), str(folder / "key.pem")


def test_a_tls_redis_with_a_password_carries_jobs_and_an_untrusted_one_is_refused(
    tmp_path: Path,
) -> None:
    """Managed Redis (Upstash, ElastiCache with in-transit encryption, Memorystore, Redis
    Cloud) takes TLS only, with a password: `rediss://:PASSWORD@HOST:PORT/DB`. Here Redis
    takes TLS only on its port, with a certificate of its own that the URL names
    (`ssl_ca_certs`). The gateway and a consumer carry a job through it, and the password
    never reaches a log. A URL that does not trust the certificate gets 503 with
    Retry-After (nothing queued), and the log says why in one line (it said "cannot be
    reached (ConnectionError)", which sends an operator to the network, not the CA)."""
    if redis_server(tls=True) is None:
        pytest.skip("no redis-server built with TLS here (apt-get install redis-server)")
    password = "tls-broker-pw-5521"
    tls = RedisServer(tls=_self_signed(tmp_path), password=password)
    consumer = ConsumerProc(tls.url)
    gateway = Server({"WHISPER_BROKER_URL": tls.url})
    untrusted = Server({"WHISPER_BROKER_URL": tls.url.split("?")[0]})
    try:
        job = _post(gateway.url, {"input": {"audio_base64": b64(DATA / "jfk.wav")}})["id"]
        st = _all_ended(gateway.url, [job], 120)[job]
        assert st["status"] == "COMPLETED" and wer(JFK_TEXT, st["output"]["text"]) < 0.2
        refused = requests.post(
            f"{untrusted.url}/v2/e/run", json={"input": {"audio_base64": "AAAA"}}, timeout=60
        )
        assert refused.status_code == 503 and refused.headers.get("Retry-After")
        assert "its TLS certificate is not trusted" in untrusted.logs()
        logs = gateway.logs() + consumer.logs() + untrusted.logs()
        assert password not in logs and "Traceback" not in logs, logs[-3000:]
    finally:
        untrusted.stop()
        gateway.stop()
        consumer.stop()
        tls.close()


def test_the_openai_face_of_a_full_or_lost_broker_answers_in_openais_shape(
    rds: RedisServer,
) -> None:
    """Found by a probe: on a gateway whose queue was full, `stream=true` never answered
    (the job's task raised and the event stream waited on it for ever; the client timed out)
    and a plain request got the job API's 429 body, not OpenAI's. Now both get OpenAI's
    error (QUEUE_FULL, 429, Retry-After: the SDK's RateLimitError), and a Redis that is
    gone gives 503 NOT_READY, in the stream as its error event."""
    import openai

    gateway = Server({"WHISPER_BROKER_URL": rds.url, "WHISPER_RESULT_MAX_JOBS": "1"})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    try:
        assert _post(gateway.url, {"input": {"audio_base64": "AAAA"}})["status"] == "IN_QUEUE"
        with open(DATA / "jfk.wav", "rb") as f, pytest.raises(openai.RateLimitError) as full:
            client.audio.transcriptions.create(model="whisper-1", file=f, timeout=60)
        assert full.value.code == "QUEUE_FULL", full.value.body
        with open(DATA / "jfk.wav", "rb") as f, pytest.raises(openai.APIError) as in_stream:
            list(client.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
        assert in_stream.value.body["code"] == "QUEUE_FULL", in_stream.value.body
        # Our own /v1/jobs: the queue's error and, as on every 429, Retry-After (a probe
        # found it missing here: a client that honours it retried at once).
        jobs = requests.post(
            f"{gateway.url}/v1/jobs", json={"input": {"audio_base64": "AAAA"}}, timeout=60
        )
        assert jobs.status_code == 429 and jobs.json()["error_code"] == "QUEUE_FULL"
        assert jobs.headers.get("Retry-After"), jobs.headers
        rds.stop()
        jobs = requests.post(
            f"{gateway.url}/v1/jobs", json={"input": {"audio_base64": "AAAA"}}, timeout=60
        )
        assert jobs.status_code == 503 and jobs.headers.get("Retry-After"), jobs.headers
        with open(DATA / "jfk.wav", "rb") as f, pytest.raises(openai.InternalServerError) as gone:
            client.audio.transcriptions.create(model="whisper-1", file=f, timeout=60)
        assert gone.value.status_code == 503 and gone.value.code == "NOT_READY"
        assert "Traceback" not in gateway.logs()
    finally:
        gateway.stop()


def test_a_message_lost_with_its_consumer_is_queued_again(rds: RedisServer) -> None:
    """kombu's Redis transport pops a message (BRPOP) before it notes it as unacknowledged:
    a consumer killed between the two takes the message with it (seen once in the
    kill-midway test). The records keep each job's input, and consumers sweep for jobs
    whose message is nowhere: queued ones, and running ones with no live lease."""
    from handler.faces.broker.queue import QUEUE, TASK, UNACKED, make_celery
    from handler.settings import load_settings

    store = _store(rds)
    audio, text = short_jobs()[0]
    past = repr(time.time() - 3600)
    # Queued, its message in the queue: not lost, however old.
    assert store.create("kept", None, job_input={"audio_base64": audio})
    store.r.hset("whisper:job:kept", "submitted", past)
    make_celery(load_settings({"WHISPER_BROKER_URL": rds.url})).send_task(
        TASK, args=["kept", {"audio_base64": audio}, None], queue=QUEUE, task_id="kept"
    )
    # Queued, its message gone; and running under a consumer that died, its message gone.
    assert store.create("popped", None, job_input={"audio_base64": audio})
    store.r.hset("whisper:job:popped", "submitted", past)
    assert store.create("orphan", None, job_input={"audio_base64": audio})
    assert store.start("orphan", "dead")[0] == "GO"
    store.r.delete("whisper:lease:orphan")
    store.r.hset("whisper:job:orphan", "started", past)
    found = {job_id for job_id, _, _ in store.lost(QUEUE, UNACKED, 60)}
    assert found == {"popped", "orphan"}
    assert store.lost(QUEUE, UNACKED, 60) == []  # marked: not handed out twice at once
    store.r.hdel("whisper:job:popped", "requeued")
    store.r.hdel("whisper:job:orphan", "requeued")
    consumer = ConsumerProc(rds.url)
    try:
        for job_id in ("kept", "popped", "orphan"):
            wait_for(lambda j=job_id: store.get(j).ended, 120, job_id)  # type: ignore[union-attr]
    finally:
        consumer.stop()
    for job_id in ("kept", "popped", "orphan"):
        st = store.get(job_id).status_object()  # type: ignore[union-attr]
        assert st["status"] == "COMPLETED" and wer(text, st["output"]["text"]) < 0.3, st
    assert "queued again" in consumer.logs()


def test_a_job_that_kills_its_consumers_fails_as_worker_lost(rds: RedisServer) -> None:
    """The store's view of a job whose consumers died 3 times (the tries are counted in
    Redis), then a real consumer that takes its redelivered message: WORKER_LOST, not a
    fourth run."""
    from handler.faces.broker.queue import QUEUE, TASK, make_celery
    from handler.settings import load_settings

    store = _store(rds)
    store.create("doomed", None)
    for n in range(3):
        assert store.start("doomed", f"dead-{n}")[0] == "GO"
        store.r.delete("whisper:lease:doomed")
    settings = load_settings({"WHISPER_BROKER_URL": rds.url})
    make_celery(settings).send_task(
        TASK, args=["doomed", {"audio_base64": "AAAA"}, None], queue=QUEUE
    )
    consumer = ConsumerProc(rds.url)
    try:
        wait_for(lambda: store.get("doomed").ended, 120, "the job to end")  # type: ignore[union-attr]
    finally:
        consumer.stop()
    st = store.get("doomed").status_object()  # type: ignore[union-attr]
    assert st["status"] == "FAILED" and st["output"]["error_code"] == "WORKER_LOST", st
    assert st["output"]["retryable"] is False


def test_a_consumer_recycles_itself_and_sigterm_finishes_jobs_in_hand(rds: RedisServer) -> None:
    consumer = ConsumerProc(rds.url, WHISPER_REFRESH_AFTER_JOBS="3", WHISPER_MAX_CONCURRENCY="2")
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        pool = short_jobs()
        ids = [
            _post(gateway.url, {"input": {"audio_base64": pool[n % 3][0]}})["id"] for n in range(8)
        ]
        done = _all_ended(gateway.url, ids, 300)
        assert {s["status"] for s in done.values()} == {"COMPLETED"}
        assert consumer.logs().count("recycling after") >= 2, consumer.logs()[-2000:]
        runs = Counter(s["workerId"] for s in done.values())
        # A fresh process after every 3 jobs (and the one more in hand when the 3rd ended).
        assert len(runs) >= 2 and max(runs.values()) <= 4, runs
        # SIGTERM with a long job in hand: it finishes, its result is stored, then exit 0.
        job = _post(gateway.url, {"input": {"audio_base64": _long(40)}})
        wait_for(lambda: _status(gateway.url, job["id"])["status"] == "IN_PROGRESS", 120, "start")
        assert consumer.stop() == 0
        assert _status(gateway.url, job["id"])["status"] == "COMPLETED"
    finally:
        gateway.stop()
        consumer.stop()


def _long(seconds: float) -> str:
    return base64.b64encode(wav_bytes(long_clip(seconds).samples)).decode()


def test_cancel_stops_a_running_job_on_its_consumer(rds: RedisServer) -> None:
    consumer = ConsumerProc(rds.url, WHISPER_MAX_CONCURRENCY="1")
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        job = _post(gateway.url, {"input": {"audio_base64": _long(240)}})
        wait_for(lambda: _status(gateway.url, job["id"])["status"] == "IN_PROGRESS", 120, "start")
        started = time.monotonic()
        cancelled = requests.post(f"{gateway.url}/v2/e/cancel/{job['id']}", timeout=60).json()
        assert cancelled["status"] == "CANCELLED"
        # Its one slot is free again long before 240 s of audio could be transcribed.
        pool = short_jobs()
        nxt = _post(gateway.url, {"input": {"audio_base64": pool[0][0]}})
        assert _all_ended(gateway.url, [nxt["id"]], 120)[nxt["id"]]["status"] == "COMPLETED"
        assert time.monotonic() - started < 60
        assert _status(gateway.url, job["id"])["status"] == "CANCELLED"
    finally:
        gateway.stop()
        consumer.stop()


def test_openais_sdk_and_v1_jobs_through_a_gateway(rds: RedisServer) -> None:
    """The gateway answers OpenAI's audio routes (streamed too) and /v1/jobs by running the
    job on a consumer; live audio, which needs the model in its own process, is refused
    with a clear error, never left waiting."""
    import openai
    import websockets.sync.client

    consumer = ConsumerProc(rds.url)
    gateway = Server({"WHISPER_BROKER_URL": rds.url})
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        with open(DATA / "jfk.wav", "rb") as f:
            out = client.audio.transcriptions.create(model="whisper-1", file=f)
        assert wer(JFK_TEXT, out.text) < 0.2
        with open(DATA / "jfk.wav", "rb") as f:
            srt = client.audio.transcriptions.create(model="tiny.en", file=f, response_format="srt")
        assert "-->" in str(srt)
        assert {m.id for m in client.models.list()} == {"whisper-1", "tiny.en"}
        with open(DATA / "jfk.wav", "rb") as f, pytest.raises(openai.BadRequestError) as bad:
            client.audio.transcriptions.create(model="no-such-model", file=f)
        assert "no-such-model" in str(bad.value)
        with open(DATA / "jfk.wav", "rb") as f:  # the consumer's segments, as they land
            events = list(
                client.audio.transcriptions.create(model="whisper-1", file=f, stream=True)
            )
        deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
        assert len(deltas) >= 2 and events[-1].type == "transcript.text.done"
        assert wer(JFK_TEXT, "".join(deltas)) < 0.2 and events[-1].text == out.text
        _a_big_upload_with_logprobs_through(client)
        native = requests.post(
            f"{gateway.url}/v1/jobs",
            json={"input": {"audio_base64": b64(DATA / "jfk.wav")}},
            timeout=120,
        )
        assert native.status_code == 200 and wer(JFK_TEXT, native.json()["output"]["text"]) < 0.2
        failed = requests.post(
            f"{gateway.url}/v1/jobs", json={"input": {"audio_base64": "bm90IGF1ZGlv"}}, timeout=120
        )
        assert failed.status_code == 415 and failed.json()["retryable"] is False, failed.text
        with websockets.sync.client.connect(
            gateway.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
        ) as ws:
            event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error" and "gateway" in event["error"]["message"]
        # Deepgram's pre-recorded route runs on a consumer too, its model named by the
        # consumers; its live route is refused as OpenAI's is.
        dg = requests.post(
            f"{gateway.url}/v1/listen?model=tiny.en&utterances=true",
            data=(DATA / "jfk.wav").read_bytes(),
            headers={"Content-Type": "audio/wav"},
            timeout=120,
        )
        assert dg.status_code == 200, dg.text
        assert dg.json()["metadata"]["models"] == ["tiny.en"]
        alt = dg.json()["results"]["channels"][0]["alternatives"][0]
        assert wer(JFK_TEXT, alt["transcript"]) < 0.2 and alt["words"]
        _deepgram_callback_through(gateway)
        with websockets.sync.client.connect(
            gateway.url.replace("http", "ws") + "/v1/listen?encoding=linear16&sample_rate=16000"
        ) as ws:
            message = json.loads(ws.recv(timeout=30))
        assert message["type"] == "Error" and "gateway" in message["description"]
        _assemblyai_through(gateway, rds.url)
    finally:
        gateway.stop()
        consumer.stop()


def big_wav(path: Path, seconds: float) -> bytes:
    """``path`` (16-kHz mono) as a 48-kHz stereo WAV padded with silence to ``seconds``:
    20 MB for 105 s, most of it silence the VAD skips, so a big upload costs little."""
    import wave

    import numpy as np

    with wave.open(str(path)) as w:
        mono = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    wide = np.repeat(mono, 3)  # 16 -> 48 kHz, each sample held
    wide = np.concatenate([wide, np.zeros(int(seconds * 48000) - len(wide), "<i2")])
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(48000)
        w.writeframes(np.repeat(wide, 2).tobytes())
    return out.getvalue()


def _a_big_upload_with_logprobs_through(client: Any) -> None:
    """A 20-MB upload (over the queue's 15-MB inline cap, under the upload cap) goes through
    Redis to a consumer and back, and the words' logprobs with it, whole and streamed."""
    data = big_wav(DATA / "jfk.wav", 105)
    assert 20_000_000 < len(data) < 21_000_000
    big = client.audio.transcriptions.create(
        model="gpt-transcribe", file=("call.wav", data), include=["logprobs"]
    )
    assert wer(JFK_TEXT, big.text) < 0.2 and big.usage.seconds == pytest.approx(105, abs=0.1)
    assert [lp.token for lp in big.logprobs][:2] == [" And", " so"]
    with open(DATA / "jfk.wav", "rb") as f:
        events = list(
            client.audio.transcriptions.create(
                model="whisper-1", file=f, stream=True, include=["logprobs"]
            )
        )
    streamed = [lp.token for e in events[:-1] for lp in e.logprobs or []]
    assert streamed and streamed == [lp.token for lp in events[-1].logprobs]


def _deepgram_callback_through(gateway: Server) -> None:
    """Deepgram's ``callback``: the job is queued in Redis, a consumer runs it, and the
    callback gets Deepgram's response with the request_id the gateway answered."""
    from urllib.parse import quote

    from tests.httpserver import LocalServer, respond

    got: list[Any] = []

    def take(h: Any) -> None:
        got.append(json.loads(h.rfile.read(int(h.headers["Content-Length"]))))
        respond(h, 200)

    with LocalServer() as hook:
        hook.route("/done", take)
        queued = requests.post(
            f"{gateway.url}/v1/listen?model=tiny.en&callback={quote(hook.url('/done'))}",
            data=(DATA / "jfk.wav").read_bytes(),
            headers={"Content-Type": "audio/wav"},
            timeout=60,
        )
        assert queued.status_code == 200 and set(queued.json()) == {"request_id"}, queued.text
        wait_for(lambda: got, 120, "the callback's call")
    assert got[0]["metadata"]["request_id"] == queued.json()["request_id"]
    alt = got[0]["results"]["channels"][0]["alternatives"][0]
    assert wer(JFK_TEXT, alt["transcript"]) < 0.2, alt


def _assemblyai_through(gateway: Server, broker_url: str) -> None:
    """AssemblyAI's SDK: the upload and the transcript's request are kept in Redis, the job
    runs on a consumer, and another gateway replica answers for both."""
    import assemblyai as aai

    saved = aai.settings.model_copy()
    aai.settings.base_url, aai.settings.polling_interval = gateway.url, 0.2
    aai.settings.api_key = "unused"  # no WHISPER_API_KEY here, but the SDK sends one
    replica = Server({"WHISPER_BROKER_URL": broker_url})
    try:
        transcript = aai.Transcriber().transcribe(str(DATA / "jfk.wav"))
        assert transcript.status == aai.TranscriptStatus.completed, transcript.error
        assert wer(JFK_TEXT, transcript.text) < 0.2 and transcript.words
        aai.settings.base_url = replica.url
        again = aai.Transcript.get_by_id(transcript.id)
        assert again.text == transcript.text and again.audio_url == transcript.audio_url
        # An upload kept by one replica is transcribed through the other.
        again = aai.Transcriber().transcribe(transcript.audio_url)
        assert again.text == transcript.text
        listed = [x.id for x in aai.Transcriber().list_transcripts().transcripts]
        assert listed[:2] == [again.id, transcript.id], listed  # from Redis, newest first
        assert aai.Transcript.delete_by_id(again.id).text == "Deleted by user."
        with pytest.raises(aai.types.TranscriptError, match="not found"):
            aai.Transcript.get_by_id(again.id)
        import websockets.sync.client

        url = replica.url.replace("http", "ws") + "/v3/ws?sample_rate=16000"
        with websockets.sync.client.connect(url) as ws:  # live audio: not on a gateway
            message = json.loads(ws.recv(timeout=30))
        assert message["type"] == "Error" and "gateway" in message["error"]
    finally:
        replica.stop()
        for name in ("base_url", "polling_interval", "api_key"):
            setattr(aai.settings, name, getattr(saved, name))
