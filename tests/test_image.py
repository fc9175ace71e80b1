"""The built image as a container, through its own entry point (image tier).

`bench/image.sh test VARIANT` runs this file with ``WHISPER_TEST_IMAGE=whisper-worker:VARIANT``
after building that variant with podman from the unchanged Dockerfile; without the variable
(or without podman) every test here is skipped. Nothing imports the worker: the container's
CMD runs it, the emulator and the clients (the runpod SDK, the openai SDK) run on the host and
reach it over 127.0.0.1 as the platform and a caller would. Every container is named and
removed at the end; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from runpod_emulator import Emulator
from tests.helpers import DATA, JFK_TEXT, b64, wait_for, wer

IMAGE = os.environ.get("WHISPER_TEST_IMAGE", "")
PODMAN = ["podman", "--runtime", "runc"]
ROOT = Path(__file__).resolve().parent.parent
READY_S = 120.0
JOB_S = 180.0
# RunPod sends SIGKILL this long after SIGTERM (shared/runpod-protocol.md's stop grace).
GRACE_S = 30.0

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="set WHISPER_TEST_IMAGE (bench/image.sh test)"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]


def podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def image_config() -> dict[str, Any]:
    out = podman("image", "inspect", IMAGE).stdout
    return json.loads(out)[0]["Config"]


def image_env() -> dict[str, str]:
    return dict(item.split("=", 1) for item in image_config().get("Env") or [])


def diarization_image() -> bool:
    return image_env().get("WHISPER_DIARIZATION") == "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Container names a test starts; all removed at the end, whatever happened."""
    started: list[str] = []
    yield started
    for name in started:
        podman("rm", "-f", "-t", "0", name, check=False, timeout=60)


def test_the_image_runs_as_uid_10001_offline_and_quiet():
    config = image_config()
    assert config["User"] == "10001:10001"
    assert config["Cmd"] == ["python", "-m", "handler"]
    env = image_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["RUNPOD_LOG_LEVEL"] == "INFO"
    uid = podman("run", "--rm", "--network", "none", "--entrypoint", "id", IMAGE, "-u")
    assert uid.stdout.strip() == "10001"


def test_the_default_command_transcribes_jfk_with_no_network():
    run = podman("run", "--rm", "--network", "none", IMAGE)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-2000:]
    assert "Job local_test completed successfully" in log, log[-2000:]
    assert "ask not what your country can do for you" in log.lower()
    assert "Traceback" not in log


def test_a_read_only_root_with_a_tmpfs_serves_jobs():
    """RunPod and Kubernetes (readOnlyRootFilesystem) may mount / read-only: only /tmp is
    written (the job's temporary files)."""
    run = podman("run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", IMAGE)
    log = run.stdout + run.stderr
    assert run.returncode == 0 and "ask not what your country" in log.lower(), log[-2000:]
    assert "Traceback" not in log and "Read-only file system" not in log, log[-2000:]


def run_once_offline(job: dict[str, Any], *flags: str) -> subprocess.CompletedProcess:
    """The image's queue worker run once on ``job`` (its --test_input), with no network."""
    return podman(
        "run",
        "--rm",
        "--network",
        "none",
        *flags,
        IMAGE,
        "python",
        "-m",
        "handler",
        "--test_input",
        json.dumps(job),
        check=False,
    )


def test_nothing_is_fetched_at_run_time_even_asked_for_a_url():
    """With no network a job whose audio is a URL fails with the fetch's own code; the
    worker itself started and loaded everything from the image."""
    run = run_once_offline({"input": {"audio_url": "https://example.com/a.mp3"}})
    log = run.stdout + run.stderr
    assert "loaded model" in log, log[-2000:]
    assert "SOURCE_UNREACHABLE" in log, log[-2000:]
    assert "Traceback" not in log


def test_forced_word_times_run_in_the_image_on_a_read_only_root():
    """The aligner's wheel (pocketsphinx, with its model) is in the image, for its Python,
    and aligns offline with only /tmp writable."""
    job = json.loads((ROOT / "test_input.json").read_text())
    job["input"].update({"word_alignment": "forced", "output": ["text", "words"]})
    run = run_once_offline(job, "--read-only", "--tmpfs", "/tmp")
    log = run.stdout + run.stderr
    assert run.returncode == 0 and "'word_alignment': 'forced'" in log, log[-2000:]
    assert "Traceback" not in log


def _container_worker(em: Emulator, names: list[str], **env: str) -> str:
    """A worker that is this image as a container: the emulator's variables passed as the
    platform passes them (environment), the host's loopback reached with --network host."""
    name = f"ww-test-{uuid.uuid4().hex[:8]}"
    names.append(name)
    keys = [*em.worker_env("x"), *env]
    command = [
        *PODMAN,
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp",
        *[arg for key in keys for arg in ("-e", key)],  # values from podman's environment
        IMAGE,
    ]
    wid = em.start_worker(env, command=command, cwd=str(ROOT))
    em.wait_worker(wid, {"idle", "busy"}, READY_S)
    return wid


def _emulator(tmp_path: Path) -> Emulator:
    return Emulator(ping_interval_ms=1000, stop_grace_s=GRACE_S, log_dir=str(tmp_path)).start()


def test_the_queue_worker_in_the_container_serves_the_runpod_sdk(tmp_path, names, monkeypatch):
    import runpod

    em = _emulator(tmp_path)
    try:
        _container_worker(em, names, WHISPER_STREAM="true")
        monkeypatch.setattr(runpod, "api_key", em.api_key)
        monkeypatch.setattr(runpod, "endpoint_url_base", em.base_url)
        endpoint = runpod.Endpoint(em.config.endpoint_id)
        job = endpoint.run({"audio_base64": b64(DATA / "jfk.mp3")})
        streamed = [item for item in job.stream()]
        segments = [i["segment"] for i in streamed if isinstance(i, dict) and "segment" in i]
        final = em.wait_job(job.job_id, JOB_S)
        assert final["status"] == "COMPLETED", final
        whole = final["output"][-1] if isinstance(final["output"], list) else final["output"]
        assert wer(JFK_TEXT, whole["text"]) <= 0.05
        assert len(segments) == len(whole["segments"])
        bad = em.wait_job(em.submit({"audio_url": "ftp://example.com/a.wav"}), JOB_S)
        assert bad["status"] == "FAILED" and "URL_NOT_ALLOWED" in json.dumps(bad), bad
    finally:
        em.stop()


def test_sigterm_mid_job_answers_the_job_and_exits_within_the_grace(tmp_path, names):
    from tests.test_platform import long_job

    em = _emulator(tmp_path)
    try:
        wid = _container_worker(em, names)
        job_id = em.submit(long_job(40))
        wait_for(lambda: em.status(job_id)["status"] == "IN_PROGRESS", JOB_S, "job to start")
        t0 = time.monotonic()
        em.stop_worker(wid, graceful=True)  # SIGTERM to `podman run`, proxied to the worker
        status = em.wait_job(job_id, JOB_S)
        em.wait_worker(wid, "stopped", GRACE_S + 30)
        took = time.monotonic() - t0
        # Answered (drained) or handed back to the queue: never lost, never a hole.
        assert status["status"] in ("COMPLETED", "IN_QUEUE"), status
        if status["status"] == "COMPLETED":
            assert status["output"]["text"]
        assert took < GRACE_S, f"stopped {took:.1f} s after SIGTERM"
        assert em.exit_code(wid) == 0
    finally:
        em.stop()


def test_http_mode_with_a_published_port_serves_the_openai_sdk(names):
    from openai import AuthenticationError, OpenAI

    port = free_port()
    key = secrets.token_hex(32)
    name = f"ww-http-{uuid.uuid4().hex[:8]}"
    names.append(name)
    podman(
        "run",
        "-d",
        "--name",
        name,
        "-p",
        f"127.0.0.1:{port}:8000",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "-e",
        "WHISPER_MODE=http",
        "-e",
        "PORT=8000",
        "-e",
        f"WHISPER_API_KEY={key}",
        IMAGE,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return requests.get(f"{base}/ping", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_for(healthy, READY_S, "the HTTP server to answer /ping")
    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    with open(DATA / "jfk.wav", "rb") as f:
        text = client.audio.transcriptions.create(model="whisper-1", file=f).text
    assert wer(JFK_TEXT, text) <= 0.05
    with open(DATA / "jfk.wav", "rb") as f:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and deltas.strip() == done[0].text.strip()
    metrics = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
    assert metrics.status_code == 200 and "whisper_" in metrics.text
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{base}/v1", api_key="x" * 32, max_retries=0).models.list()


def test_broker_mode_a_gateway_and_a_consumer_as_containers(names):
    """The image in both broker roles on the host's network, Redis (Debian's, started by
    runpod_emulator.broker_stack) on the host: WHISPER_MODE=http with WHISPER_BROKER_URL is
    the gateway, WHISPER_MODE=consume the consumer; a job through the gateway's job API is
    transcribed by the consumer; SIGTERM to the consumer's container exits it cleanly."""
    from runpod_emulator.broker_stack import RedisServer

    rds = RedisServer()
    port = free_port()
    gateway, consumer = (f"ww-{role}-{uuid.uuid4().hex[:8]}" for role in ("gw", "con"))
    names += [gateway, consumer]
    common = [
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "-e",
        f"WHISPER_BROKER_URL={rds.url}",
    ]
    try:
        podman("run", "-d", "--name", consumer, *common, "-e", "WHISPER_MODE=consume", IMAGE)
        role = ["-e", "WHISPER_MODE=http", "-e", f"PORT={port}", "-e", "HOST=127.0.0.1"]
        podman("run", "-d", "--name", gateway, *common, *role, IMAGE)
        base = f"http://127.0.0.1:{port}/v2/e"

        def ready() -> bool:
            try:
                return requests.get(f"{base}/health", timeout=2).json()["workers"]["idle"] > 0
            except (requests.RequestException, ValueError, KeyError):
                return False

        wait_for(ready, READY_S, "the consumer to beat in Redis")
        job = requests.post(f"{base}/run", json={"input": {"audio_base64": b64(DATA / "jfk.wav")}})
        job_id = job.json()["id"]

        def ended() -> dict[str, Any] | None:
            st = requests.get(f"{base}/status/{job_id}", timeout=5).json()
            return st if st["status"] in ("COMPLETED", "FAILED") else None

        st = wait_for(ended, JOB_S, "the job")
        assert st["status"] == "COMPLETED" and wer(JFK_TEXT, st["output"]["text"]) <= 0.05, st
        stop = podman("stop", "-t", str(int(GRACE_S)), consumer, timeout=GRACE_S + 30)
        assert stop.returncode == 0
        state = podman("inspect", consumer, "--format", "{{.State.ExitCode}}").stdout.strip()
        assert state == "0", podman("logs", consumer, check=False).stderr[-2000:]
        assert "Traceback" not in podman("logs", gateway, check=False).stderr
    finally:
        rds.close()


def test_a_diarized_job_in_the_diarization_image(tmp_path):
    if not diarization_image():
        pytest.skip("not a DIARIZATION=true image")
    job = {
        "input": {
            "audio_base64": b64(DATA / "jfk.mp3"),
            "diarize": True,
            "output": ["text", "diarized_json"],
        }
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    path.chmod(0o644)
    run = podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{path}:/home/worker/test_input.json:ro,Z",
        IMAGE,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0 and "'speaker': 'A'" in log, log[-2000:]


def test_the_cuda_libraries_resolve_in_the_cuda_image():
    """The CUDA image's cuBLAS comes from NVIDIA's PyPI wheel (builder/cuda.txt): what
    CTranslate2 dlopens must load by name, as it does on a GPU host (where the container
    toolkit adds only the driver, libcuda.so.1). With DIARIZER_GPU, every library
    onnxruntime's CUDA provider links resolves too."""
    env = image_env()
    if "NVIDIA_VISIBLE_DEVICES" not in env:
        assert "LD_LIBRARY_PATH" not in env  # the CPU image carries no CUDA at all
        pytest.skip("not a CUDA image")
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    probe = "import ctypes; [ctypes.CDLL(n) for n in ('libcublas.so.12', 'libcublasLt.so.12')]"
    run = podman("run", "--rm", "--network", "none", IMAGE, "python", "-c", probe, check=False)
    assert run.returncode == 0, run.stderr
    if env.get("IMAGE_CTRANSLATE2"):  # an older driver's variant: its CTranslate2 and cuDNN 9
        probe = (
            "import ctypes, ctranslate2; ctypes.CDLL('libcudnn.so.9'); "
            "print(ctranslate2.__version__)"
        )
        run = podman("run", "--rm", "--network", "none", IMAGE, "python", "-c", probe)
        assert run.stdout.strip() == env["IMAGE_CTRANSLATE2"], run.stdout
    if env.get("WHISPER_DIARIZATION") != "true":
        return
    script = (
        "import glob, onnxruntime, os, subprocess; "
        "lib = glob.glob(os.path.dirname(onnxruntime.__file__) + "
        "'/capi/libonnxruntime_providers_cuda.so')[0]; "
        "print(subprocess.run(['ldd', lib], capture_output=True, text=True).stdout)"
    )
    ldd = podman("run", "--rm", "--network", "none", IMAGE, "python", "-c", script).stdout
    missing = [ln for ln in ldd.splitlines() if "not found" in ln and "libcuda.so" not in ln]
    assert "libcudnn.so.9" in ldd and not missing, ldd


@pytest.mark.parametrize("platform", ["knative", "cloud-run", "runpod-lb"])
def test_each_platforms_file_runs_the_image_as_that_platform_does(platform, names):
    """The manifest's (or the Hub form's) environment, the port the platform injects (and
    RunPod's separate PORT_HEALTH), a read-only root, the platform's health probe polled
    until 200, a transcription through the openai SDK, then SIGTERM (``podman stop``): the
    container exits 0. Substituted: the CPU and the image's baked model for the GPU and
    the model the manifest names (WHISPER_DEVICE and WHISPER_MODEL left out)."""
    from openai import OpenAI

    from tests.test_platforms import CLOUD_RUN, KNATIVE, RUNPOD_LB, Contract, knative_service

    c = {
        "knative": lambda: Contract(knative_service(KNATIVE)),
        "cloud-run": lambda: Contract(knative_service(CLOUD_RUN)),
        "runpod-lb": lambda: Contract(hub=json.loads(RUNPOD_LB.read_text())),
    }[platform]()
    env = {k: v for k, v in c.env.items() if k not in ("WHISPER_DEVICE", "WHISPER_MODEL")}
    env |= {**c.injected, "PORT": str(c.port), "WHISPER_DEVICE": "cpu"}
    port, health = free_port(), free_port()
    publish = ["-p", f"127.0.0.1:{port}:{c.port}"]
    if c.health_port:
        env["PORT_HEALTH"] = str(c.port + 1)
        publish += ["-p", f"127.0.0.1:{health}:{c.port + 1}"]
    else:
        health = port
    name = f"ww-{platform}-{uuid.uuid4().hex[:8]}"
    names.append(name)
    flags = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    # Docker (RunPod's runtime) lets any user bind ports under 1024 since 20.10; podman
    # does not by default, and RunPod's load balancer sets PORT=80 when the endpoint names
    # none: the container gets Docker's default here.
    sysctl = ["--sysctl", "net.ipv4.ip_unprivileged_port_start=0"]
    ro = ["--read-only", "--tmpfs", "/tmp"]
    podman("run", "-d", "--name", name, *ro, *sysctl, *publish, *flags, IMAGE)
    seen: set[int] = set()

    def probe() -> bool:
        try:
            code = requests.get(f"http://127.0.0.1:{health}{c.probe_path}", timeout=2).status_code
        except requests.RequestException:
            return False
        seen.add(code)
        return code == 200

    wait_for(probe, READY_S, f"{c.probe_path} to answer 200")
    if c.health_port:
        assert seen <= {200, 204}, seen  # RunPod's LB: anything else is unhealthy
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    with open(DATA / "jfk.wav", "rb") as f:
        text = client.audio.transcriptions.create(model="whisper-1", file=f).text
    assert wer(JFK_TEXT, text) <= 0.1
    podman("stop", "-t", str(int(GRACE_S)), name, timeout=GRACE_S + 30)
    state = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    logs = podman("logs", name, check=False).stderr + podman("logs", name, check=False).stdout
    assert state == "0", logs[-2000:]
    assert "Traceback" not in logs, logs[-2000:]


def test_port_80_where_the_runtime_keeps_low_ports_for_root_is_one_line_and_exit_1(names):
    """RunPod's load balancer sets PORT=80 when the endpoint names none; podman and a
    Kubernetes pod (unlike Docker) keep ports under 1024 for root, and the image runs as uid
    10001. The worker exited 3 with uvicorn's traceback there; now one line that says what
    to set, and exit 1, before any model is loaded."""
    name = f"ww-port80-{uuid.uuid4().hex[:8]}"
    names.append(name)
    flags = ["--read-only", "--tmpfs", "/tmp", "-e", "WHISPER_MODE=http", "-e", "PORT=80"]
    sysctl = ["--sysctl", "net.ipv4.ip_unprivileged_port_start=1024"]  # podman's default
    done = podman("run", "--name", name, *flags, *sysctl, IMAGE, check=False, timeout=READY_S)
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, out[-2000:]
    assert "Traceback" not in out and "cannot listen on 0.0.0.0:80 (PORT)" in out, out[-2000:]
    assert "set PORT to 1024 or more" in out, out[-2000:]
