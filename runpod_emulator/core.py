"""The `Emulator`: one emulated RunPod serverless endpoint with its worker processes.

It owns the HTTP server, the endpoint state, the worker processes, a monitor thread
(time-based rules, process exits, SIGKILL after the stop grace period), webhook
delivery and event dispatch. The worker-management methods are the API an
autoscaler builds on.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from .config import TERMINAL, EmulatorConfig
from .server import EmulatorHTTPServer
from .state import EndpointState, Event, Job
from .workers import WorkerProcess, spawn_worker, worker_env

log = logging.getLogger(__name__)

Listener = Callable[[Event], None]


class Emulator:
    """A local RunPod serverless endpoint on 127.0.0.1.

    `Emulator(config, on_event=fn, **overrides)`; fields of `EmulatorConfig` may be
    given as keyword overrides. Use as a context manager or call start()/stop().
    """

    def __init__(
        self,
        config: EmulatorConfig | None = None,
        *,
        on_event: Listener | None = None,
        **overrides: Any,
    ) -> None:
        self.config = replace(config or EmulatorConfig(), **overrides)
        self._listeners: list[Listener] = [self._on_stop_pod]
        if on_event:
            self._listeners.append(on_event)
        self._events: queue.Queue[Event | None] = queue.Queue()
        self.state = EndpointState(self.config, self._events.put, self._schedule_webhook)
        self._procs: dict[str, WorkerProcess] = {}
        self._procs_lock = threading.Lock()
        self._next_worker = 0
        self._server: EmulatorHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._running = threading.Event()
        self.log_dir = self.config.log_dir or tempfile.mkdtemp(prefix="rp-emulator-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> Emulator:
        self._server = EmulatorHTTPServer(self.config, self.state)
        self._running.set()
        self.started_at = time.time()
        for target, name in (
            (self._server.serve_forever, "rp-emulator-http"),
            (self._monitor, "rp-emulator-monitor"),
            (self._dispatch, "rp-emulator-events"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("emulator serving %s", self.client_url)
        for _ in range(self.config.initial_workers):
            self.start_worker()
        return self

    def stop(self, timeout: float | None = None, *, cancel_running: bool = False) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after `timeout`), then the server.

        Workers go first: the SDK's loop retries without backoff when the server is gone.
        A worker told SIGTERM drains its jobs first, as on the platform; with
        ``cancel_running`` those jobs are cancelled first (the command line's Ctrl-C), so
        the drain takes about a second instead of the rest of each job.
        """
        if not self._running.is_set():
            return
        if cancel_running:
            cancelled = self.state.cancel_running()
            if cancelled:
                log.info("cancelled %d running job(s) before stopping", len(cancelled))
                self._await_stop_polls(cancelled)
        grace = self.config.stop_grace_s if timeout is None else timeout
        with self._procs_lock:
            procs = list(self._procs.values())
        for proc in procs:
            self.stop_worker(proc.worker_id, graceful=True)
        deadline = time.time() + grace
        for proc in procs:
            try:
                proc.popen.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s still up after %.0fs; killing it", proc.worker_id, grace)
                proc.kill_group()
                proc.popen.wait(5)
            self._reap(proc)
        self._running.clear()
        self.state.close()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self._events.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        self.stopped_at = time.time()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """What RUNPOD_ENDPOINT_BASE_URL would be: http://127.0.0.1:PORT/v2."""
        return f"http://127.0.0.1:{self.port}/v2"

    @property
    def client_url(self) -> str:
        return f"{self.base_url}/{self.config.endpoint_id}"

    @property
    def api_key(self) -> str:
        return self.config.api_key

    def add_listener(self, listener: Listener) -> None:
        """Called (from one dispatcher thread, in order) with every event dict:
        {"type": job_queued|job_taken|job_finished|job_requeued|worker_started|
        worker_ready|worker_stopping|worker_stopped, "t": time.time(), ...ids}."""
        self._listeners.append(listener)

    # ------------------------------------------------------------- workers
    def worker_env(self, worker_id: str) -> dict[str, str]:
        """The environment a worker with this id needs to serve this endpoint."""
        return worker_env(
            self.base_url,
            self.config.endpoint_id,
            self.api_key,
            worker_id,
            self.config.ping_interval_ms,
        )

    def start_worker(
        self,
        env_extra: dict[str, str] | None = None,
        *,
        command: list[str] | None = None,
        cwd: str | None = None,
    ) -> str:
        """Spawn a worker process; returns its id (its RUNPOD_POD_ID)."""
        with self._procs_lock:
            self._next_worker += 1
            worker_id = f"w{self._next_worker:03d}-{uuid.uuid4().hex[:6]}"
        env = {**self.config.worker_env, **(env_extra or {}), **self.worker_env(worker_id)}
        log_path = os.path.join(self.log_dir, f"{worker_id}.log")
        proc = spawn_worker(
            worker_id,
            list(command or self.config.worker_command),
            cwd=cwd or self.config.worker_cwd,
            env=env,
            log_path=log_path,
        )
        with self._procs_lock:
            self._procs[worker_id] = proc
        self.state.add_worker(worker_id, pid=proc.pid, log_path=log_path)
        return worker_id

    def _await_stop_polls(self, job_ids: list[str], limit_s: float = 5.0) -> None:
        """Let workers see the cancel before SIGTERM: a worker stops polling for cancels
        once told to shut down, and would then drain the whole job."""
        deadline = time.time() + limit_s
        while time.time() < deadline:
            with self.state.cond:
                unseen = [
                    w
                    for w in self.state.workers.values()
                    if w.stopped_at is None and set(w.pending_stops) & set(job_ids)
                ]
            if not unseen:
                return
            time.sleep(0.05)

    def stop_worker(self, worker_id: str, graceful: bool = True) -> None:
        """Graceful: SIGTERM (jobs in flight drain; SIGKILL after stop_grace_s).
        Otherwise SIGKILL at once. Returns without waiting: see wait_worker()."""
        with self._procs_lock:
            proc = self._procs.get(worker_id)
        if proc is None:
            if worker_id in self.state.workers:
                return  # already stopped (or not ours to signal)
            raise KeyError(f"unknown worker {worker_id}")
        self.state.stop_requested(worker_id)
        if graceful:
            proc.terminate()
        else:
            proc.kill_group()

    def kill_worker(self, worker_id: str) -> None:
        """Fault injection: SIGKILL the worker and its children mid-whatever."""
        self.stop_worker(worker_id, graceful=False)

    def worker_state(self, worker_id: str) -> str:
        """starting | idle | busy | stopping | stopped."""
        with self.state.cond:
            return self.state.workers[worker_id].state

    def worker_states(self) -> dict[str, str]:
        with self.state.cond:
            return {w.id: w.state for w in self.state.workers.values()}

    def wait_worker(self, worker_id: str, states: set[str] | str, timeout: float) -> str:
        """Block until the worker is in one of `states`; TimeoutError otherwise."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.time() + timeout
        with self.state.cond:
            while True:
                worker = self.state.workers.get(worker_id)
                if worker is not None and worker.state in wanted:
                    return worker.state
                remaining = deadline - time.time()
                if remaining <= 0:
                    found = worker.state if worker else "unknown"
                    raise TimeoutError(f"worker {worker_id} is {found}, not {sorted(wanted)}")
                self.state.cond.wait(min(remaining, 0.2))

    def exit_code(self, worker_id: str) -> int | None:
        with self.state.cond:
            return self.state.workers[worker_id].exit_code

    def queue_length(self) -> int:
        with self.state.cond:
            return len(self.state.queue)

    def queue_delay(self) -> float:
        """Seconds the oldest queued job has waited (0 when the queue is empty): the
        signal of RunPod's queue-delay scaler."""
        with self.state.cond:
            if not self.state.queue:
                return 0.0
            oldest = min(self.state.jobs[j].queued_at for j in self.state.queue)
            return max(0.0, time.time() - oldest)

    def jobs_in_progress(self) -> int:
        with self.state.cond:
            return sum(len(w.held) for w in self.state.workers.values())

    # ------------------------------------------------------------- fault injection
    def fail_job_done(self, count: int, status: int = 503, *, after_commit: bool = False) -> None:
        """The next `count` job-done posts (results or progress) answer `status`; with
        ``after_commit`` each post is applied first (the platform stored the result, then
        the answer was lost), so a worker that re-posts sends a late duplicate."""
        with self.state.cond:
            self.state.done_failures_left = count
            self.state.done_failure_status = status
            self.state.done_failure_after_commit = after_commit

    def set_take_delay(self, seconds: float) -> None:
        """Sleep this long before answering each job-take (a slow control plane)."""
        assert self._server is not None, "start() first"
        self._server.take_delay_s = seconds

    # ------------------------------------------------------------- client shortcuts
    def submit(
        self,
        job_input: Any,
        *,
        webhook: str | None = None,
        policy: dict[str, Any] | None = None,
    ) -> str:
        """Queue a job as `POST /run` would (without HTTP); returns its id."""
        size = len(json.dumps({"input": job_input}).encode())
        return self.state.submit(job_input, webhook=webhook, policy=policy, input_bytes=size).id

    def status(self, job_id: str) -> dict[str, Any] | None:
        """What `GET /status/{id}` answers (None: 404)."""
        return self.state.status(job_id)

    def wait_job(self, job_id: str, timeout: float) -> dict[str, Any]:
        """The final status object; TimeoutError if the job has not ended in time."""
        status = self.state.wait_terminal(job_id, timeout)
        if status is None:
            raise KeyError(job_id)
        if status["status"] not in TERMINAL:
            raise TimeoutError(f"job {job_id} still {status['status']} after {timeout}s")
        return status

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        return self.state.cancel(job_id)

    def records(self) -> dict[str, Any]:
        """Every worker and job with all timestamps (time.time() seconds)."""
        with self.state.cond:
            return {
                "endpoint_id": self.config.endpoint_id,
                "started_at": self.started_at,
                "stopped_at": self.stopped_at,
                "config": {
                    k: v
                    for k, v in asdict(self.config).items()
                    if k not in ("api_key", "worker_env")
                },
                "workers": {w.id: w.record() for w in self.state.workers.values()},
                "jobs": {j.id: j.record() for j in self.state.jobs.values()},
            }

    # ------------------------------------------------------------- internals
    def _monitor(self) -> None:
        # Process exits are checked often (they time the end of billing); the
        # time-based job rules need less precision.
        rounds = 0
        while self._running.is_set():
            try:
                if rounds % 4 == 0:
                    for worker_id in self.state.tick():
                        self.state.worker_gone(worker_id, None, "silent")
                self._check_processes()
            except Exception:  # noqa: BLE001 - the monitor must outlive a bug
                log.exception("emulator monitor")
            rounds += 1
            time.sleep(0.05)

    def _check_processes(self) -> None:
        now = time.time()
        with self._procs_lock:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is not None:
                self._reap(proc)
                continue
            with self.state.cond:
                asked = self.state.workers[proc.worker_id].stop_requested_at
            if asked is not None and now - asked > self.config.stop_grace_s and not proc.killed:
                log.warning(
                    "worker %s still draining %.0f s after SIGTERM; killing it",
                    proc.worker_id,
                    now - asked,
                )
                proc.kill_group()

    def _reap(self, proc: WorkerProcess) -> None:
        code = proc.poll()
        if code is None:
            return
        with self._procs_lock:
            if self._procs.pop(proc.worker_id, None) is None:
                return
        proc.close()
        reason = "exited" if code >= 0 else f"signal {-code}"
        self.state.worker_gone(proc.worker_id, code, reason)

    def _on_stop_pod(self, event: dict[str, Any]) -> None:
        """A result with stopPod (the SDK's refresh_worker): stop that worker, as the
        platform does; an autoscaler starts a fresh one when jobs wait."""
        if event["type"] == "worker_stop_pod":
            with self._procs_lock:
                ours = event["worker_id"] in self._procs
            if ours:
                self.stop_worker(event["worker_id"], graceful=True)

    def _dispatch(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:  # noqa: BLE001 - a listener bug must not stop events
                    log.exception("emulator event listener")

    def _schedule_webhook(self, job: Job, status: dict[str, Any]) -> None:
        # Called with the state lock held: only start a thread here.
        if job.webhook:
            threading.Thread(
                target=self._deliver_webhook, args=(job, job.webhook, status), daemon=True
            ).start()

    def _deliver_webhook(self, job: Job, url: str, status: dict[str, Any]) -> None:
        body = json.dumps(status).encode()
        for attempt in range(self.config.webhook_attempts):
            if attempt:
                time.sleep(self.config.webhook_retry_delay_s)
            if not self._running.is_set():
                return
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.config.webhook_timeout_s) as r:
                    code = r.status
            except urllib.error.HTTPError as exc:
                code = exc.code
            except (OSError, ValueError):
                code = None
            with self.state.cond:
                job.webhook_attempts.append({"t": time.time(), "status": code})
            if code is not None and 200 <= code < 300:
                return
