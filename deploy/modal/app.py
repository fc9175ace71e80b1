"""The worker on Modal: your built image, HTTP mode, scaled to zero.

    modal deploy deploy/modal/app.py

Modal starts the image (pushed to your registry: docs/deploy.md), runs ``serve`` in it,
which starts the worker's HTTP server, and routes the app's URL to its port once the port
answers: the model loads before that (``startup_timeout`` covers it). One container takes
``MAX_INPUTS`` requests at once: the worker's running jobs and its live sessions, and the
worker's own wait queue is off, so Modal holds the rest and starts containers for them.
A request lives at most ``timeout`` seconds, which covers the longest job the worker's
bounds below allow. The API key, if any, comes from a Modal secret named
``whisper-worker`` holding ``WHISPER_API_KEY``. Not run on Modal here (no account):
tests/test_platforms.py checks these numbers against the worker's settings and starts the
worker the way ``serve`` does.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request

import modal

IMAGE = "YOUR_REGISTRY/whisper-worker:turbo"
GPU = "L4"
PORT = 8000

WORKER_ENV = {
    "WHISPER_MODE": "http",
    "WHISPER_MAX_CONCURRENCY": "16",
    "WHISPER_HTTP_MAX_QUEUE": "0",
    "WHISPER_REALTIME_MAX_SESSIONS": "8",
    # The longest job: download 120 s + decode 120 s + compute 120 s + 0.25 x 3600 s.
    "WHISPER_MAX_AUDIO_SECONDS": "3600",
    "WHISPER_DOWNLOAD_TIMEOUT_S": "120",
    "WHISPER_DECODE_TIMEOUT_S": "120",
    "WHISPER_COMPUTE_BUDGET_FACTOR": "0.25",
}
MAX_INPUTS = 16 + 0 + 8
TIMEOUT_S = 1320
STARTUP_TIMEOUT_S = 600  # image pull, model load and the speech self-test on a cold GPU
SCALEDOWN_S = 60  # idle seconds billed before a container goes (Modal's minimum is 2)

app = modal.App("whisper-worker")
image = modal.Image.from_registry(IMAGE).env(WORKER_ENV)


@app.function(
    image=image,
    gpu=GPU,
    timeout=TIMEOUT_S,
    startup_timeout=STARTUP_TIMEOUT_S,
    scaledown_window=SCALEDOWN_S,
    min_containers=0,
    secrets=[modal.Secret.from_name("whisper-worker")],
)
@modal.concurrent(max_inputs=MAX_INPUTS)
@modal.web_server(port=PORT, startup_timeout=STARTUP_TIMEOUT_S)
def serve() -> subprocess.Popen[bytes]:
    """Start the worker's HTTP server on PORT and return once its model is loaded.

    Modal routes requests to the container as soon as the port accepts connections, and the
    worker opens its port while the model loads (answering 503 NOT_READY meanwhile): so this
    returns only when ``/ready`` answers 200, and no request of a cold start is refused.
    """
    worker = subprocess.Popen(
        ["python", "-m", "handler", "serve"], env={**os.environ, "PORT": str(PORT)}
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode} while starting")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/ready", timeout=2) as answer:
                if answer.status == 200:
                    return worker
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.2)
    worker.terminate()
    raise RuntimeError(f"the worker was not ready after {STARTUP_TIMEOUT_S} s")
