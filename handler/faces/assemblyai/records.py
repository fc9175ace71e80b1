"""What the AssemblyAI face keeps beside the jobs: each upload (``/v2/upload``, as the
base64 its job will carry) and each transcript's request (the ``audio_url`` and the options
its answers repeat), for ``WHISPER_RESULT_TTL_S``.

In the server's own process (``Memory``), or in the broker's Redis on a gateway
(``InRedis``: any replica answers for any upload or transcript). Bounded as the jobs are:
at most ``WHISPER_RESULT_MAX_JOBS`` records and ``WHISPER_RESULT_MAX_BYTES`` in memory (the
oldest go first); in Redis the gateway's admission of the job bounds the requests, and an
upload is refused (429) when Redis would pass the share of its maxmemory a job may use.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from handler.faces.broker.store import REDIS_MEMORY_HEADROOM
from handler.settings import Settings

PREFIX = "whisper:assemblyai:"
MANY = 10_000
"""Records read at most for a list (a gateway's Redis holds one a transcript)."""


class Full(Exception):
    """No room for an upload: 429, retry later."""


class Memory:
    """The records in this process, each for ``ttl_s``, bounded in count and bytes."""

    blocking = False

    def __init__(self, settings: Settings) -> None:
        self.ttl_s = settings.result_ttl_s
        self.max_items = settings.result_max_jobs
        self.max_bytes = settings.result_max_bytes
        self.items: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.bytes = 0

    def put(self, key: str, value: str) -> None:
        self._expire()
        if len(value) > self.max_bytes:
            raise Full
        self._drop(key)
        while self.items and (
            self.bytes + len(value) > self.max_bytes or len(self.items) >= self.max_items
        ):
            self._drop(next(iter(self.items)))
        self.items[key] = (time.monotonic() + self.ttl_s, value)
        self.bytes += len(value)

    def get(self, key: str) -> str | None:
        self._expire()
        held = self.items.get(key)
        return None if held is None else held[1]

    def forget(self, key: str) -> None:
        self._drop(key)

    def many(self, prefix: str) -> dict[str, str]:
        """Every record whose key starts with ``prefix``, by the rest of its key."""
        self._expire()
        return {k[len(prefix) :]: v for k, (_, v) in self.items.items() if k.startswith(prefix)}

    def _drop(self, key: str) -> None:
        held = self.items.pop(key, None)
        if held is not None:
            self.bytes -= len(held[1])

    def _expire(self) -> None:
        now = time.monotonic()
        while self.items:
            key, (until, _) = next(iter(self.items.items()))
            if until > now:
                break
            self._drop(key)


class InRedis:
    """The records in the broker's Redis (a gateway), each for ``ttl_s``."""

    blocking = True

    def __init__(self, client: Any, settings: Settings) -> None:
        self.r = client
        self.ttl_s = settings.result_ttl_s
        self.max_bytes = settings.result_max_bytes

    def near_full(self, nbytes: int) -> bool:
        """Redis would pass the share of its maxmemory a gateway admits jobs up to."""
        memory = self.r.info("memory")
        limit = int(memory.get("maxmemory") or 0)
        used = int(memory.get("used_memory") or 0)
        return limit > 0 and used + 2 * nbytes > limit * REDIS_MEMORY_HEADROOM

    def put(self, key: str, value: str) -> None:
        if len(value) > self.max_bytes or self.near_full(len(value)):
            raise Full
        self.r.set(PREFIX + key, value, ex=max(1, round(self.ttl_s)))

    def get(self, key: str) -> str | None:
        value = self.r.get(PREFIX + key)
        return None if value is None else str(value)

    def forget(self, key: str) -> None:
        self.r.delete(PREFIX + key)

    def many(self, prefix: str) -> dict[str, str]:
        keys = [str(k) for k in self.r.scan_iter(match=PREFIX + prefix + "*", count=1000)]
        keys = keys[:MANY]
        values = self.r.mget(keys) if keys else []
        start = len(PREFIX + prefix)
        return {k[start:]: str(v) for k, v in zip(keys, values, strict=True) if v is not None}
