"""Prometheus metrics of the HTTP face (``GET /metrics``), with prometheus_client.

One registry per server (not the library's global one), so a test or a second app in the
same process starts from zero. What is counted is what an operator on Kubernetes watches:
requests by route and status and their latency, jobs by outcome, audio seconds in, the
real-time factor (and the diarizer's, for diarized jobs), jobs running and waiting, the
batch sizes the engine formed, the model load time, and GPU memory where there is a GPU
(read with NVML when its library is present).
Label values are fixed sets (routes as declared, error codes), never user input, so a
client cannot grow the series without bound.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The server's metrics; ``render()`` is the body of ``GET /metrics``."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "whisper_http_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "whisper_http_request_seconds",
            "Time to answer an HTTP request",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.connections_cut = Counter(
            "whisper_http_connections_cut",
            "Connections closed by the server's guards: slow_headers, slow_body (a request "
            "slower than the receive deadline allows), headers_too_large, pipeline_too_long, or "
            "slow_reader (a client, HTTP or live WebSocket, that stopped reading its answers)",
            ["reason"],
            registry=r,
        )
        self.jobs = Counter(
            "whisper_jobs",
            "Jobs ended, by outcome (ok or the error code)",
            ["outcome"],
            registry=r,
        )
        self.audio = Counter("whisper_audio_seconds", "Seconds of audio transcribed", registry=r)
        self.rtf = Histogram(
            "whisper_realtime_factor",
            "Model seconds per audio second, per job",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.diarization_rtf = Histogram(
            "whisper_diarization_realtime_factor",
            "Diarizer seconds per audio second, per diarized job (beside the transcription: "
            "above whisper_realtime_factor, the diarizer is what the job waits for)",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.batches = Histogram(
            "whisper_batch_size",
            "Windows per batched model call a job rode in",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.running = Gauge("whisper_jobs_running", "Jobs in the model slots", registry=r)
        self.waiting = Gauge(
            "whisper_jobs_waiting", "Jobs admitted, waiting for a slot", registry=r
        )
        self.sessions = Gauge("whisper_realtime_sessions", "Live sessions open", registry=r)
        self.load = Gauge(
            "whisper_model_load_seconds", "Seconds the model load and warm-up took", registry=r
        )
        self.gpu_memory = Gauge(
            "whisper_gpu_memory_used_bytes", "GPU memory in use (NVML)", ["gpu"], registry=r
        )

    def job_done(self, result: Any) -> None:
        """Count one finished job from its result (an output or an error dict)."""
        if not isinstance(result, Mapping):
            return
        code = result.get("error_code")
        self.jobs.labels("ok" if "error" not in result else str(code or "INTERNAL")).inc()
        if "error" in result:
            return
        # A multichannel job transcribed each channel (but those that repeat another).
        heard = [c for c in result.get("channels") or () if c.get("same_as") is None]
        duration = float(result.get("duration") or 0.0) * max(1, len(heard))
        self.audio.inc(duration)
        transcribe = (result.get("timings") or {}).get("transcribe")
        if duration > 0 and transcribe is not None:
            self.rtf.observe(float(transcribe) / duration)
        diarize = (result.get("timings") or {}).get("diarize")
        if duration > 0 and diarize is not None:
            self.diarization_rtf.observe(float(diarize) / duration)
        for size in result.get("batch_sizes") or ():
            self.batches.observe(size)

    def render(self) -> bytes:
        for index, used in gpu_memory_used().items():
            self.gpu_memory.labels(str(index)).set(used)
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: count each HTTP request by route and status, and time it to the end
    of its body (a stream's whole length). Paths outside ``routes()`` count as ``other``.

    Pure ASGI rather than Starlette's BaseHTTPMiddleware, which gets between a streaming
    response and the client's disconnect."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Callable[[], set[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes() else "other"
        start = time.perf_counter()
        status = ["500"]

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.metrics.requests.labels(route, status[0]).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_nvml: list[Any] = []


def gpu_memory_used() -> dict[int, int]:
    """Bytes of memory used on each GPU, from NVML; empty without a GPU driver.

    Not exercised on the CPU-only machines that run the tests (no libnvidia-ml there).
    """
    if not _nvml:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            _nvml.append(lib if lib.nvmlInit_v2() == 0 else None)
        except (OSError, AttributeError):
            _nvml.append(None)
    lib = _nvml[0]
    if lib is None:
        return {}
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return {}
    used: dict[int, int] = {}
    for i in range(count.value):
        handle, mem = ctypes.c_void_p(), _NvmlMemory()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
            continue
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0:
            used[i] = int(mem.used)
    return used
