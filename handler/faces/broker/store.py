"""Jobs' records in Redis, shared by the gateway (writes the submission, reads statuses) and
the consumers (start, stream, progress, finish): RunPod's job model, kept where every
process sees it and a restart loses nothing (Redis with AOF persistence).

Each transition is one Lua script, so it is atomic across processes:

- ``start``: a delivered job becomes IN_PROGRESS under a lease (``LEASE_S``, refreshed while
  it runs). A job that has ended is skipped (a redelivery after its result was stored); a
  job another live consumer holds is deferred, never run twice at once.
- ``finish``: the first ending is stored, with the TTL; any later one (a redelivered run, a
  cancel that lost the race) is refused and changes nothing: exactly one result.
- ``cancel`` and ``purge`` end queued jobs at once and running ones at their next check.

Keys (``whisper:`` prefix): ``job:{id}`` (a hash), ``stream:{id}`` (a list of streamed
items), ``lease:{id}``, ``queued`` (a hash: id -> input bytes), the set ``running`` (and
``inflight``, the running
ones as a list for KEDA), ``counts``, and the consumers' heartbeats (``consumers``, a
sorted set of names by expiry, and ``consumer:{name}``).

Eviction: only an ended job's record and stream, a lease (``LEASE_S``, put back at each
renewal if it went) and a heartbeat carry a TTL, so a volatile-* maxmemory-policy evicts
nothing a job still needs; an allkeys-* one could evict anything, and the gateway refuses
jobs under it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from handler.contract import TERMINAL_JOB_STATES

PREFIX = "whisper:"
LEASE_S = 30
"""A running job's lease; its consumer renews it every ``LEASE_S / 3`` seconds."""
INFLIGHT = PREFIX + "inflight"
"""The running jobs' ids as a Redis list, beside the queue's own list: KEDA's Redis scaler
reads list lengths only, and a consumer must not be scaled to zero with jobs in hand."""
MODELS = PREFIX + "models"
"""The names of the models consumers loaded (a set; the gateway's ``/v1/models``)."""
UNENDED_TTL_S = 86_400
"""A job that never ends (its message lost with a Redis that kept no AOF) is forgotten
after a day by the consumers' sweep (``lost``), as RunPod drops a job queued longer than
that. Not a TTL: under a volatile-* maxmemory-policy (ElastiCache's, Memorystore's and
Azure Cache's default) Redis evicts keys that have one, so only ended jobs' keys do."""

_TERMINAL = "{" + ", ".join(f'["{s}"]=true' for s in sorted(TERMINAL_JOB_STATES)) + "}"

_START = f"""
local job, lease = KEYS[1], KEYS[2]
local status = redis.call('HGET', job, 'status')
if not status then return {{'GONE', 0, 0}} end
if ({_TERMINAL})[status] then return {{status, 0, 0}} end
local holder = redis.call('GET', lease)
if holder and holder ~= ARGV[1] then return {{'LEASED', 0, 0}} end
redis.call('SET', lease, ARGV[1], 'EX', ARGV[3])
if status == 'IN_PROGRESS' and not holder then
  redis.call('HINCRBY', KEYS[5], 'retried', 1)
end
redis.call('HSET', job, 'status', 'IN_PROGRESS', 'worker', ARGV[1])
redis.call('HSETNX', job, 'started', ARGV[2])
local tries = redis.call('HINCRBY', job, 'tries', 1)
redis.call('HDEL', KEYS[3], ARGV[4])
redis.call('SADD', KEYS[4], ARGV[4])
redis.call('LREM', KEYS[7], 0, ARGV[4])
redis.call('RPUSH', KEYS[7], ARGV[4])
return {{'GO', redis.call('LLEN', KEYS[6]), tries}}
"""

_FINISH = f"""
local job = KEYS[1]
local status = redis.call('HGET', job, 'status')
if not status or ({_TERMINAL})[status] then return 0 end
redis.call('HSET', job, 'status', ARGV[1], 'finished', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', job, 'output', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', job, 'error', ARGV[4]) end
redis.call('HSETNX', job, 'started', ARGV[2])
redis.call('HDEL', job, 'input', 'progress')
redis.call('HDEL', KEYS[3], ARGV[6])
redis.call('SREM', KEYS[4], ARGV[6])
redis.call('LREM', KEYS[7], 0, ARGV[6])
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', job, ARGV[5])
if redis.call('EXISTS', KEYS[6]) == 1 then redis.call('EXPIRE', KEYS[6], ARGV[5]) end
redis.call('HINCRBY', KEYS[5], string.lower(ARGV[1]), 1)
return 1
"""

_TAKE = """
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor') or '0')
local items = redis.call('LRANGE', KEYS[2], cursor, -1)
redis.call('HSET', KEYS[1], 'cursor', cursor + #items)
return items
"""

REDIS_MEMORY_HEADROOM = 0.8
"""A gateway admits a job while Redis would use at most this share of its ``maxmemory``
(when one is set) with it: the rest is for the results of the jobs already taken and for
Celery's own bookkeeping. At its maxmemory (noeviction) Redis refuses writes, and a
consumer died of it: kombu could not note a message it had just popped."""

_ADMIT = """
local memory = redis.call('INFO', 'memory')
local maxmemory = tonumber(string.match(memory, 'maxmemory:(%d+)') or '0')
if maxmemory > 0 then
  if string.match(memory, 'maxmemory_policy:allkeys') then return -2 end
  local used = tonumber(string.match(memory, 'used_memory:(%d+)') or '0')
  if used + 2 * tonumber(ARGV[3]) > maxmemory * tonumber(ARGV[8]) then return -1 end
end
local queued = redis.call('HVALS', KEYS[2])
if #queued >= tonumber(ARGV[4]) then return 0 end
local used = tonumber(ARGV[3])
for _, n in ipairs(queued) do used = used + tonumber(n) end
if used > tonumber(ARGV[5]) then return 0 end
redis.call('HSET', KEYS[1], 'status', 'IN_QUEUE', 'submitted', ARGV[1], 'input', ARGV[7])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'webhook', ARGV[2]) end
redis.call('HSET', KEYS[2], ARGV[6], ARGV[3])
return 1
"""

_LOST = """
local now, age, forget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[5])
local stale = {}
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  local t = redis.call('HGET', ARGV[3] .. id, 'submitted')
  if not t or now - tonumber(t) > forget then table.insert(stale, id) end
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local t = redis.call('HGET', ARGV[3] .. id, 'started')
  if not t or now - tonumber(t) > forget then table.insert(stale, id) end
end
for _, id in ipairs(stale) do
  redis.call('DEL', ARGV[3] .. id, ARGV[6] .. id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('SREM', KEYS[2], id)
  redis.call('LREM', KEYS[5], 0, id)
end
local candidates, any = {}, false
local function old(id, field)
  local job = ARGV[3] .. id
  local t = tonumber(redis.call('HGET', job, field) or '0')
  local again = tonumber(redis.call('HGET', job, 'requeued') or '0')
  return now - t > age and now - again > age
end
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  if old(id, 'submitted') then candidates[id] = true; any = true end
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', ARGV[4] .. id) == 0 and old(id, 'started') then
    candidates[id] = true; any = true
  end
end
if not any then return {} end
for _, m in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local id = string.match(m, '"id":%s*"([%w%-]+)"')
  if id then candidates[id] = nil end
end
for _, m in ipairs(redis.call('HVALS', KEYS[4])) do
  local id = string.match(m, '"id":%s*"([%w%-]+)"')
  if id then candidates[id] = nil end
end
local lost = {}
for id, _ in pairs(candidates) do
  redis.call('HSET', ARGV[3] .. id, 'requeued', ARGV[1])
  table.insert(lost, id)
end
return lost
"""

_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


def _key(kind: str, job_id: str = "") -> str:
    return f"{PREFIX}{kind}:{job_id}" if job_id else f"{PREFIX}{kind}"


def _transition_keys(job_id: str) -> list[str]:
    """The keys the start and end scripts touch, in the order their KEYS[n] name them."""
    return [
        _key("job", job_id),
        _key("lease", job_id),
        _key("queued"),
        _key("running"),
        _key("counts"),
        _key("stream", job_id),
        INFLIGHT,
    ]


@dataclass
class Snapshot:
    """A job's record as read from Redis; answers RunPod's status object."""

    id: str
    fields: dict[str, str]

    @property
    def status(self) -> str:
        return self.fields.get("status", "IN_QUEUE")

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_JOB_STATES

    def _time(self, name: str) -> float | None:
        value = self.fields.get(name)
        return float(value) if value else None

    def status_object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": self.id, "status": self.status}
        submitted, started = self._time("submitted"), self._time("started")
        finished = self._time("finished")
        if started is not None and submitted is not None:
            obj["delayTime"] = round((started - submitted) * 1000)
            obj["workerId"] = self.fields.get("worker", "")
        if self.ended and started is not None and finished is not None:
            obj["executionTime"] = round((finished - started) * 1000)
        if self.status == "IN_PROGRESS" and "progress" in self.fields:
            obj["output"] = json.loads(self.fields["progress"])
        if self.status in ("COMPLETED", "FAILED") and "output" in self.fields:
            obj["output"] = json.loads(self.fields["output"])
        if "error" in self.fields:
            obj["error"] = self.fields["error"]
        if "webhook_report" in self.fields:
            obj["webhook"] = json.loads(self.fields["webhook_report"])
        return obj


def split_result(result: Any) -> tuple[str, Any, str | None]:
    """A job's result as (status, output, error): an error result is FAILED, with the rest of
    it (code, retryable) as the output, as the embedded store and RunPod answer."""
    if isinstance(result, dict) and isinstance(result.get("error"), str):
        return "FAILED", {k: v for k, v in result.items() if k != "error"}, result["error"]
    return "COMPLETED", result, None


class JobStore:
    """The records over one Redis client (``redis.Redis``, responses decoded)."""

    def __init__(self, client: Any, result_ttl_s: float) -> None:
        self.r = client
        self.ttl = max(1, int(result_ttl_s))
        self._start = client.register_script(_START)
        self._finish = client.register_script(_FINISH)
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)
        self._admit = client.register_script(_ADMIT)
        self._lost = client.register_script(_LOST)

    # --- the gateway's side ---------------------------------------------------------

    def create(
        self,
        job_id: str,
        webhook: str | None,
        size: int = 0,
        bounds: tuple[int, int] = (1_000_000, 2**62),
        job_input: Any = None,
    ) -> int:
        """A queued job's record, its input kept until it ends (``lost`` may need to queue
        it again): 1. 0 (nothing stored) when ``bounds`` (queued jobs, their inputs' bytes)
        leave no room for one more of ``size`` bytes; -1 when Redis would hold more than
        REDIS_MEMORY_HEADROOM of its maxmemory with it (its input is held twice); -2 when
        Redis may evict any key at its maxmemory (an allkeys-* policy)."""
        done = self._admit(
            keys=[_key("job", job_id), _key("queued")],
            args=[
                repr(time.time()),
                webhook or "",
                size,
                *bounds,
                job_id,
                json.dumps(job_input, ensure_ascii=False),
                REDIS_MEMORY_HEADROOM,
            ],
        )
        return int(done)

    def forget(self, job_id: str) -> None:
        """A submission that could not be queued: as if it never was."""
        pipe = self.r.pipeline()
        pipe.delete(_key("job", job_id))
        pipe.hdel(_key("queued"), job_id)
        pipe.execute()

    def delete(self, job_id: str) -> bool:
        """Forget an ended job's record and stream (its result with them); False (and
        nothing changed) while it has not ended."""
        fields = self.r.hmget(_key("job", job_id), ["status"])
        if fields[0] not in TERMINAL_JOB_STATES:
            return False
        self.r.delete(_key("job", job_id), _key("stream", job_id))
        return True

    def get(self, job_id: str) -> Snapshot | None:
        fields = self.r.hgetall(_key("job", job_id))
        return Snapshot(job_id, fields) if fields else None

    def take_stream(self, job_id: str) -> list[Any]:
        items = self._take(keys=[_key("job", job_id), _key("stream", job_id)])
        return [json.loads(i) for i in items]

    def cancel(self, job_id: str) -> bool:
        """End a job that has not ended as CANCELLED; False when it had already ended."""
        return self.end(job_id, "CANCELLED", None, None)

    def purge(self) -> int:
        """Cancel every queued job; how many."""
        n = 0
        for job_id in self.r.hkeys(_key("queued")):
            snap = self.get(job_id)
            if snap is None:  # expired unended (its message lost): not queued any more
                self.r.hdel(_key("queued"), job_id)
            elif snap.status == "IN_QUEUE" and self.cancel(job_id):
                n += 1
        return n

    def health(self) -> dict[str, Any]:
        pipe = self.r.pipeline()
        pipe.hlen(_key("queued"))
        pipe.scard(_key("running"))
        pipe.hgetall(_key("counts"))
        pipe.zremrangebyscore(_key("consumers"), "-inf", time.time())
        pipe.zrange(_key("consumers"), 0, -1)
        queued, running, counts, _, names = pipe.execute()
        consumers = [_key("consumer", n) for n in names]
        busy = 0
        for raw in self.r.mget(consumers) if consumers else []:
            if raw:
                busy += 1 if json.loads(raw).get("running") else 0
        return {
            "jobs": {
                "completed": int(counts.get("completed", 0)),
                "failed": int(counts.get("failed", 0)),
                "inProgress": running,
                "inQueue": queued,
                "retried": int(counts.get("retried", 0)),
            },
            "workers": {"idle": len(consumers) - busy, "running": busy},
        }

    # --- the consumers' side --------------------------------------------------------

    def start(self, job_id: str, consumer: str) -> tuple[str, int, int]:
        """("GO", items already streamed by earlier tries, this try's number) or why not:
        the job's ended status, "LEASED" (another live consumer runs it) or "GONE"."""
        status, streamed, tries = self._start(
            keys=_transition_keys(job_id),
            args=[consumer, repr(time.time()), LEASE_S, job_id],
        )
        return status, int(streamed), int(tries)

    def lost(self, queue: str, unacked: str, min_age_s: float) -> list[tuple[str, Any, Any]]:
        """Jobs whose message is nowhere (not in ``queue``, not in kombu's ``unacked``
        hash) though they are queued, or running with no live lease, for ``min_age_s``:
        a consumer killed between Redis's BRPOP and kombu's note of the message (kombu's
        Redis transport writes the note after the pop) takes the message with it. Each is
        marked so that no other sweep returns it within ``min_age_s``; returns (id, input,
        webhook) to queue again."""
        ids = self._lost(
            keys=[_key("queued"), _key("running"), queue, unacked, INFLIGHT],
            args=[
                repr(time.time()),
                min_age_s,
                f"{PREFIX}job:",
                f"{PREFIX}lease:",
                UNENDED_TTL_S,
                f"{PREFIX}stream:",
            ],
        )
        out = []
        for job_id in ids:
            raw, webhook = self.r.hmget(_key("job", job_id), "input", "webhook")
            out.append((job_id, None if raw is None else json.loads(raw), webhook))
        return out

    def renew(self, job_id: str, consumer: str) -> bool:
        return bool(self._renew(keys=[_key("lease", job_id)], args=[consumer, LEASE_S]))

    def status_of(self, job_ids: list[str]) -> list[str | None]:
        pipe = self.r.pipeline()
        for job_id in job_ids:
            pipe.hget(_key("job", job_id), "status")
        return list(pipe.execute())

    def stream(self, job_id: str, item: Any) -> None:
        self.r.rpush(_key("stream", job_id), json.dumps(item, ensure_ascii=False))

    def progress(self, job_id: str, progress: Any) -> None:
        self.r.hset(_key("job", job_id), "progress", json.dumps(progress))

    def end(self, job_id: str, status: str, output: Any, error: str | None) -> bool:
        """Store the job's one ending; False (nothing changed) when it had one already."""
        done = self._finish(
            keys=_transition_keys(job_id),
            args=[
                status,
                repr(time.time()),
                "" if output is None else json.dumps(output, ensure_ascii=False),
                error or "",
                self.ttl,
                job_id,
            ],
        )
        return bool(done)

    def report_webhook(self, job_id: str, report: dict[str, Any]) -> None:
        self.r.hset(_key("job", job_id), "webhook_report", json.dumps(report))

    def beat(self, consumer: str, running: int, ttl_s: int) -> None:
        """A consumer is alive (for ``ttl_s``) with ``running`` jobs in hand."""
        pipe = self.r.pipeline()
        pipe.set(_key("consumer", consumer), json.dumps({"running": running}), ex=ttl_s)
        pipe.zadd(_key("consumers"), {consumer: time.time() + ttl_s})
        pipe.execute()

    def loaded(self, names: list[str]) -> None:
        if names:
            self.r.sadd(MODELS, *names)

    def gone(self, consumer: str) -> None:
        pipe = self.r.pipeline()
        pipe.delete(_key("consumer", consumer))
        pipe.zrem(_key("consumers"), consumer)
        pipe.execute()


class EndedJob:
    """What handler.faces.webhooks posts: the stored status, its report kept in Redis."""

    def __init__(self, snap: Snapshot, url: str, store: JobStore) -> None:
        self.id, self._snap, self._store = snap.id, snap, store
        self.webhook: str | None = url
        self._report: dict[str, Any] | None = None

    def status_object(self) -> dict[str, Any]:
        return self._snap.status_object()

    @property
    def webhook_report(self) -> dict[str, Any] | None:
        return self._report

    @webhook_report.setter
    def webhook_report(self, report: dict[str, Any] | None) -> None:
        self._report = report
        if report is not None:
            self._store.report_webhook(self.id, report)
