"""deploy/kubernetes against the schemas (no cluster exists here): Kubernetes' own kinds
with kubernetes-validate's strict schemas, KEDA's ScaledObject and the HTTP add-on's
InterceptorRoute with their CRDs' schemas (vendored in deploy/kubernetes/schemas, made
strict here as kubeconform's strict mode does); and what the manifests must agree on with
the worker: settings it knows, the queue KEDA watches, the grace period a drain needs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from handler.faces.broker.queue import QUEUE
from handler.faces.broker.store import INFLIGHT
from handler.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33"
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
    ("http.keda.sh/v1beta1", "InterceptorRoute"): "interceptorroute-http.keda.sh-v1beta1.json",
    ("serving.knative.dev/v1", "Service"): "service-serving.knative.dev-v1.json",
}


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(DEPLOY)), doc))
    return out


def _strict(schema: Any) -> Any:
    """No field the schema does not name (as Kubernetes' strict field validation)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in schema
        ):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


def _crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    name = CRDS[(doc["apiVersion"], doc["kind"])]
    schema = json.loads((DEPLOY / "schemas" / name).read_text())
    return dict(_strict(schema))


def validate(doc: dict[str, Any]) -> None:
    """Raises when ``doc`` breaks its kind's schema."""
    if (doc["apiVersion"], doc["kind"]) in CRDS:
        jsonschema.validate(doc, _crd_schema(doc))
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


DOCS = _docs()


@pytest.mark.parametrize("where,doc", DOCS, ids=[f"{w}:{d['kind']}" for w, d in DOCS])
def test_every_manifest_is_valid_against_its_schema(where: str, doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_validation_can_fail() -> None:
    """A typo'd field and a wrong type are caught, in a built-in kind and in a CRD."""
    kinds = {d["kind"]: d for _, d in DOCS}
    bad = copy.deepcopy(kinds["Deployment"])
    bad["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(kinds["ScaledObject"])
    bad["spec"]["minReplicaCount"] = "zero"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(kinds["ScaledObject"])
    bad["spec"]["coolDownPeriod"] = 30
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_every_folder_applies_all_its_files() -> None:
    for kust in DEPLOY.rglob("kustomization.yaml"):
        listed = set(yaml.safe_load(kust.read_text())["resources"])
        present = {p.name for p in kust.parent.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, kust


def _containers(kind: str, name: str) -> list[dict[str, Any]]:
    for _, doc in DOCS:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return list(doc["spec"]["template"]["spec"]["containers"])
    raise AssertionError(f"no {kind} {name}")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_the_workers_settings_are_ones_the_worker_takes() -> None:
    for _, doc in DOCS:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            env = {k: v for k, v in _env(c).items() if k.startswith("WHISPER_")}
            if env:
                load_settings(env)  # refuses an unknown WHISPER_* name or a bad value


def test_keda_watches_the_queue_and_the_jobs_in_hand() -> None:
    scaled = next(
        d
        for _, d in DOCS
        if d["kind"] == "ScaledObject" and d["spec"]["triggers"][0]["type"] == "redis"
    )
    lists = {t["metadata"]["listName"] for t in scaled["spec"]["triggers"]}
    assert lists == {QUEUE, INFLIGHT}
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["scaleTargetRef"]["name"] == "whisper-consumer"


def test_a_consumers_grace_period_covers_its_longest_job() -> None:
    from handler.pipeline.runtime import compute_budget

    doc = next(
        d
        for _, d in DOCS
        if d["metadata"]["name"] == "whisper-consumer" and d["kind"] == "Deployment"
    )
    env = _env(doc["spec"]["template"]["spec"]["containers"][0])
    s = load_settings({k: v for k, v in env.items() if k.startswith("WHISPER_")})
    assert s.mode == "consume" and s.broker_url is not None
    longest = (
        s.download_timeout_s + s.decode_timeout_s + (compute_budget(s, s.max_audio_seconds) or 0)
    )
    assert doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= longest


def test_the_gateways_probe_is_a_route_that_waits_for_nothing() -> None:
    (gateway,) = _containers("Deployment", "whisper-gateway")
    env = _env(gateway)
    assert env["WHISPER_MODE"] == "http" and env["WHISPER_BROKER_URL"].startswith("redis://")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "resources" in gateway and "nvidia.com/gpu" not in gateway["resources"]["limits"]


def test_redis_refuses_writes_before_its_container_is_killed_for_memory() -> None:
    """Without maxmemory Redis grew until the kernel killed it at the container's limit,
    then replayed its AOF into the same limit; at maxmemory (noeviction) it refuses writes
    and the gateway refuses new jobs before that (handler.faces.broker.store)."""
    (redis_container,) = _containers("StatefulSet", "whisper-redis")
    args = redis_container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    maxmemory = args[args.index("--maxmemory") + 1]
    assert maxmemory.endswith("mb")
    limit = redis_container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    # AOF rewrites fork: leave the limit room above maxmemory
    assert int(maxmemory[:-2]) * 2**20 <= 0.8 * float(limit[:-2]) * 2**30
