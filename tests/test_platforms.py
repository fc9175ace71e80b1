"""The platforms RunPod users also deploy on, each through the file a user copies:

- ``deploy/kubernetes/knative/service.yaml`` (Knative Serving, HTTP only, scale to zero),
- ``deploy/cloud-run/service.yaml`` (Google Cloud Run, Knative's API; the CPU image),
- ``deploy/modal/app.py`` (Modal: the image as a web server),
- ``deploy/runpod-lb/hub.json`` (a RunPod Hub listing of the load-balancing type: RunPod
  sets ``PORT`` and ``PORT_HEALTH`` and polls ``/ping``, 204 while loading, 200 ready).

No cluster, Google project or Modal account exists here: the manifests are validated
against Knative's Service CRD schema (vendored from knative/serving, made strict), the Modal
file is imported with the real ``modal`` package (which builds the app offline), and then
the worker is started the way each platform starts the container: the manifest's (or the
Hub form's defaults')
environment, the ``PORT`` the platform injects (Knative's ``K_SERVICE``/``K_REVISION``/
``K_CONFIGURATION`` too), its health probe's path polled until it answers 200, a real
transcription through the openai SDK, and SIGTERM with a request in flight (the request is
answered, the process exits). Substituted: ``WHISPER_DEVICE=cpu`` and the bundled tiny.en
instead of the image's GPU and baked model. The read-only root is the image's test
(tests/test_image.py, ``--read-only``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import openai
import pytest
import requests
import yaml

from handler.pipeline.runtime import compute_budget
from handler.settings import Settings, load_settings
from speech_assets.clips import long_clip, wav_bytes
from tests.helpers import DATA, JFK_TEXT, wait_for, wer
from tests.test_http import START_S, free_port
from tests.test_kubernetes import validate

ROOT = Path(__file__).resolve().parent.parent
KNATIVE = ROOT / "deploy" / "kubernetes" / "knative" / "service.yaml"
CLOUD_RUN = ROOT / "deploy" / "cloud-run" / "service.yaml"
CLOUD_RUN_GPU = ROOT / "deploy" / "cloud-run" / "service-gpu.yaml"
MODAL = ROOT / "deploy" / "modal" / "app.py"
RUNPOD_LB = ROOT / "deploy" / "runpod-lb" / "hub.json"
CLOUD_RUN_MAX_TIMEOUT_S = 3600  # Cloud Run's longest request timeout


def knative_service(path: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return dict(doc)


def modal_app() -> ModuleType:
    pytest.importorskip("modal", reason="pip install '.[dev]' (modal)")
    spec = importlib.util.spec_from_file_location("whisper_modal_app", MODAL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # builds the App offline: no Modal account is asked
    return module


def longest_job_s(s: Settings) -> float:
    return s.download_timeout_s + s.decode_timeout_s + (compute_budget(s, s.max_audio_seconds) or 0)


def held_at_once(s: Settings) -> int:
    """Requests one worker takes without refusing: running jobs, waiting ones, sessions."""
    return s.concurrency + s.http_max_queue + s.realtime_max_sessions


class Contract:
    """What a platform gives the container and expects of it."""

    health_port = False
    """The platform probes health on a port of its own (``PORT_HEALTH``)."""

    def __init__(
        self,
        doc: dict[str, Any] | None = None,
        modal: ModuleType | None = None,
        hub: dict[str, Any] | None = None,
    ):
        if hub is not None:  # the Hub form's defaults, as a deployer who changes none
            self.env = {
                e["key"]: str(e["input"]["default"]).lower()
                if isinstance(e["input"]["default"], bool)
                else str(e["input"]["default"])
                for e in hub["config"]["env"]
                if "default" in e["input"] and e["input"]["default"] != ""
            }
            self.port = 80  # RunPod's PORT when the endpoint sets none
            self.probe_path = "/ping"
            self.health_port = True
            self.concurrency = 0  # no platform-side cap: RunPod answers 400 past its workers
            self.timeout_s = 330  # RunPod's load balancer ends a request after 5.5 min
            self.injected = {"RUNPOD_ENDPOINT_ID": "lb-test", "RUNPOD_POD_ID": "lb-pod"}
        elif doc is not None:
            spec = doc["spec"]["template"]["spec"]
            (c,) = spec["containers"]
            self.env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
            self.port = c["ports"][0]["containerPort"]
            probe = c.get("startupProbe") or c["readinessProbe"]
            self.probe_path = probe["httpGet"]["path"]
            self.concurrency = spec["containerConcurrency"]
            self.timeout_s = spec["timeoutSeconds"]
            self.injected = {
                "K_SERVICE": "whisper",
                "K_REVISION": "whisper-00001",
                "K_CONFIGURATION": "whisper",
            }
        else:
            assert modal is not None
            self.env = dict(modal.WORKER_ENV)
            self.port = modal.PORT
            self.probe_path = "/ready"  # 200 once serve() returns (Modal then routes)
            self.concurrency = modal.MAX_INPUTS
            self.timeout_s = modal.TIMEOUT_S
            self.injected = {"MODAL_TASK_ID": "ta-test"}

    def settings(self) -> Settings:
        return load_settings({k: v for k, v in self.env.items() if k.startswith("WHISPER_")})


def contracts() -> dict[str, Contract]:
    return {
        "knative": Contract(knative_service(KNATIVE)),
        "cloud-run": Contract(knative_service(CLOUD_RUN)),
        "cloud-run-gpu": Contract(knative_service(CLOUD_RUN_GPU)),
        "modal": Contract(modal=modal_app()),
        "runpod-lb": Contract(hub=json.loads(RUNPOD_LB.read_text())),
    }


@pytest.mark.parametrize(
    "path", [KNATIVE, CLOUD_RUN, CLOUD_RUN_GPU], ids=["knative", "cloud-run", "cloud-run-gpu"]
)
def test_the_service_is_valid_against_knatives_schema(path: Path) -> None:
    doc = knative_service(path)
    validate(doc)
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["timeoutSeconds"] = "1320"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


@pytest.mark.parametrize("name", ["knative", "cloud-run", "cloud-run-gpu", "modal"])
def test_the_platform_never_holds_a_request_the_worker_must_refuse(name: str) -> None:
    c = contracts()[name]
    s = c.settings()
    assert s.mode == "http" and s.broker_url is None
    # The platform queues what the worker is not given: the worker's own queue is off and
    # the platform's concurrency is exactly what one worker holds (jobs + live sessions).
    assert s.http_max_queue == 0
    assert c.concurrency == held_at_once(s)
    # The longest job the settings allow ends inside the request's timeout.
    assert longest_job_s(s) <= c.timeout_s
    if name.startswith("cloud-run"):
        assert c.timeout_s <= CLOUD_RUN_MAX_TIMEOUT_S


def test_cloud_runs_gpu_service_runs_the_variant_for_its_driver() -> None:
    """Cloud Run's L4 hosts run driver R535: the service names the image built for it, and
    that variant's CTranslate2 starts there (the worker's own driver check, given R535)."""
    from handler.inference import selftest

    spec = knative_service(CLOUD_RUN_GPU)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"run.googleapis.com/accelerator": "nvidia-l4"}
    assert spec["containers"][0]["image"].endswith("-r535")
    r535 = selftest.Driver("535.230.02", ("NVIDIA L4",))
    assert selftest.variant_for(535) == "cuda-r535"
    assert selftest.driver_refusal(r535) is not None  # the default image refuses it
    ct2 = next(c for c in selftest.CT2_CUDA if c[3] == "cuda-r535")
    assert selftest.driver_refusal(r535, ct2=".".join(map(str, ct2[0]))) is None


def test_the_load_balancing_listing_is_the_queue_listing_in_http_mode() -> None:
    """RunPod's Hub lists a repository as a load-balancing endpoint with ``endpointType:
    LB`` in its hub.json (RunPod's changelog, "Load balancing Serverless repos (beta)").
    Everything else (GPUs, CUDA versions, every setting and its default) is the queue
    listing's, checked against the settings by tests/test_deploy.py; only the mode's
    default and the queue-only preset differ."""
    queue = json.loads((ROOT / ".runpod" / "hub.json").read_text())
    lb = json.loads(RUNPOD_LB.read_text())
    assert lb["config"].pop("endpointType") == "LB" and "endpointType" not in queue["config"]
    assert lb["type"] == queue["type"] == "serverless" and lb["category"] == queue["category"]
    modes = {e["key"]: e["input"] for e in lb["config"]["env"]}["WHISPER_MODE"]
    assert modes["default"] == "http" and {o["value"] for o in modes["options"]} >= {"http"}
    strip = {"WHISPER_MODE"}
    envs = [[e for e in d["config"]["env"] if e["key"] not in strip] for d in (lb, queue)]
    assert envs[0] == envs[1]
    streaming = [p for p in queue["config"]["presets"] if "WHISPER_STREAM" in p["defaults"]]
    assert lb["config"]["presets"] == [p for p in queue["config"]["presets"] if p not in streaming]
    rest = [
        {k: v for k, v in d["config"].items() if k not in ("env", "presets")} for d in (lb, queue)
    ]
    assert rest[0] == rest[1]
    assert load_settings({"WHISPER_MODE": modes["default"]}).mode == "http"


def test_the_modal_app_is_built_as_documented() -> None:
    m = modal_app()
    import modal

    assert isinstance(m.app, modal.App) and isinstance(m.serve, modal.Function)
    # Start-up covers a cold model load (the self-test included) with room to spare.
    assert m.STARTUP_TIMEOUT_S >= 300 and m.SCALEDOWN_S >= 2


def start_as(c: Contract, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, int, Path, int]:
    """The worker as the platform starts it: its process, its port, its log, and the port
    the platform probes (``PORT_HEALTH`` where the platform sets one)."""
    port = free_port()  # the platform's choice; the manifest's port in production
    health = free_port() if c.health_port else port
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"platform-{name}-{port}.log"
    if name == "modal":  # the app's own function starts the worker, as in the container
        m = modal_app()
        monkeypatch.setattr(m, "PORT", port)
        for key in [k for k in os.environ if k.startswith(("WHISPER_", "PORT"))]:
            monkeypatch.delenv(key)
        for key, value in {
            **c.env,
            **c.injected,
            "HOST": "127.0.0.1",
            "WHISPER_DEVICE": "cpu",
        }.items():
            monkeypatch.setenv(key, value)  # WORKER_ENV is the image's environment there
        proc = m.serve.local()
        try:  # Modal routes requests once serve() returns: the worker must be ready by then.
            assert requests.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200
        except BaseException:
            proc.kill()
            proc.wait(10)
            raise
        log.write_text("")
        return proc, port, log, health
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WHISPER_", "PORT"))},
        **c.env,
        **c.injected,
        "PORT": str(port),
        **({"PORT_HEALTH": str(health)} if c.health_port else {}),
        "HOST": "127.0.0.1",
        "WHISPER_DEVICE": "cpu",  # substituted: no GPU here, tiny.en instead of the baked model
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "handler", "serve"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port, log, health


def running(base: str) -> float:
    """The worker's whisper_jobs_running gauge (0 when it does not answer)."""
    try:
        text = requests.get(base + "/metrics", timeout=2).text
    except requests.RequestException:
        return 0
    lines = [ln for ln in text.splitlines() if ln.startswith("whisper_jobs_running")]
    return float(lines[0].split()[-1]) if lines else 0


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["knative", "cloud-run", "modal", "runpod-lb"])
def test_the_worker_starts_serves_and_drains_as_the_platform_runs_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = contracts()[name]
    proc, port, log, health = start_as(c, name, monkeypatch)
    base = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:

        def probe() -> int:
            try:
                code = requests.get(f"http://127.0.0.1:{health}{c.probe_path}", timeout=2)
            except requests.ConnectionError:
                return 0
            seen.add(code.status_code)
            return code.status_code

        wait_for(lambda: probe() == 200 or proc.poll() is not None, START_S, "the probe to pass")
        if c.health_port:  # RunPod's LB: 204 loading, 200 ready, anything else unhealthy;
            assert seen == {200, 204}, seen  # the health port answers while the model loads
        assert proc.poll() is None, log.read_text()[-2000:]
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        with open(DATA / "jfk.wav", "rb") as f:
            assert (
                wer(JFK_TEXT, client.audio.transcriptions.create(model="whisper-1", file=f).text)
                < 0.1
            )

        # SIGTERM while a request is in flight: it is answered, then the process exits.
        answer: dict[str, Any] = {}
        clip = long_clip(90)

        def send() -> None:
            answer["text"] = client.audio.transcriptions.create(
                model="whisper-1", file=("long.wav", wav_bytes(clip.samples))
            ).text

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(lambda: running(base) > 0, 60, "the request's job to run")
        proc.send_signal(signal.SIGTERM)
        sender.join(c.timeout_s)
        assert wer(clip.text, answer.get("text", "")) < 0.2, answer
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "Traceback" not in text, text[-2000:]
