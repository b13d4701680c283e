"""The Kubernetes examples in deploy/k8s against the Kubernetes schemas (kubernetes-validate, strict: no
unknown field) and KEDA's ScaledObject schema (cloudcoil-models-keda, generated from KEDA's CRDs), and
against talkgate itself: the commands parse with talkgate's own parser, the grace period covers the drain,
the metric the autoscalers read is one talkgate exports. No cluster: deploy/k8s is not run on a live one.
(deploy/nginx and deploy/envoy run for real in tests/system/test_fleet.py.)"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from talkgate.cli import main as cli
from talkgate.server.gateway import CLOSE_WAIT_S
from talkgate.server.metrics import Metrics

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def kind(name: str, k: str) -> dict:
    (doc,) = [d for d in documents(name) if d["kind"] == k]
    return doc


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", ["deployment.yaml", "service.yaml", "hpa.yaml", "prometheus-adapter.yaml"])
def test_kubernetes_schemas(name, version):
    for doc in documents(name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_wrong_field_is_caught():
    hpa = kind("hpa.yaml", "HorizontalPodAutoscaler")
    hpa["spec"]["minReplica"] = hpa["spec"].pop("minReplicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[-1], strict=True)


def keda_ok(doc: dict) -> bool:
    """KEDA's models ignore unknown fields: the round trip must give back every field written."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    return ScaledObject.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json") == doc


def test_keda_scaled_object_schema():
    doc = kind("keda.yaml", "ScaledObject")
    assert keda_ok(doc) and doc["spec"]["triggers"][0]["type"] == "prometheus"
    doc["spec"]["minReplicaCont"] = doc["spec"].pop("minReplicaCount")
    assert not keda_ok(doc)


def container() -> dict:
    return kind("deployment.yaml", "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_deployment_serves_and_drains_with_talkgates_own_flags():
    """`talkgate serve ARGS` and the preStop's `talkgate drain ...` parse with talkgate's parser; the probes
    are /health (liveness) and /ready (readiness); the grace period covers the preStop's sleep, the drain's
    deadline, the closing of sockets and a few seconds more."""
    pod = kind("deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    c = container()
    assert c["command"][:2] == ["talkgate", "serve"]
    serve = cli.parser().parse_args(c["command"][1:] + c["args"])
    assert serve.func.__module__ == "talkgate.cli.serve" and serve.port == 8080
    assert c["livenessProbe"]["httpGet"]["path"] == "/health" and c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {p["containerPort"] for p in c["ports"]} == {serve.port}

    sh, flag, script = c["lifecycle"]["preStop"]["exec"]["command"]
    assert (sh, flag) == ("sh", "-c")
    sleep, drain = script.split(" && ")
    sleep_s = float(sleep.split()[1])
    words = shlex.split(drain)
    assert words[:2] == ["talkgate", "drain"]
    parsed = cli.parser().parse_args(words[1:])
    assert parsed.wait and parsed.url == f"http://127.0.0.1:{serve.port}"
    assert parsed.timeout >= serve.shutdown_deadline + CLOSE_WAIT_S
    assert pod["terminationGracePeriodSeconds"] >= sleep_s + serve.shutdown_deadline + CLOSE_WAIT_S + 10
    assert any(e["name"] == "TALKGATE_API_KEYS" for e in c["env"]), "the drain needs the key serve requires"


def test_autoscalers_read_a_gauge_talkgate_exports():
    exported = set(re.findall(r"(?m)^# TYPE (\w+) gauge$", Metrics().render().decode()))
    hpa = kind("hpa.yaml", "HorizontalPodAutoscaler")
    (metric,) = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert metric in exported
    (rule,) = yaml.safe_load(kind("prometheus-adapter.yaml", "ConfigMap")["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric and re.fullmatch(rule["name"]["matches"], metric)
    assert rule["seriesQuery"].startswith(metric + "{")
    query = kind("keda.yaml", "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert set(re.findall(r"\btalkgate_\w+", query)) == {metric}
    target = kind("deployment.yaml", "Deployment")["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == target
    assert kind("keda.yaml", "ScaledObject")["spec"]["scaleTargetRef"]["name"] == target


def test_deployment_runs_the_image_with_its_volumes_and_user():
    """The pod mounts the image's volumes (deploy/Containerfile's VOLUME) and runs as its user, whom the
    volumes must be writable to; the image is named, not a placeholder."""
    containerfile = (K8S.parent / "Containerfile").read_text()
    (volumes,) = re.findall(r"(?m)^VOLUME (\[.*\])$", containerfile)
    (uid,) = re.findall(r"useradd --uid (\d+)", containerfile)
    pod = kind("deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    c = container()
    assert set(yaml.safe_load(volumes)) <= {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == security["fsGroup"] == int(uid)
    assert re.fullmatch(r"[\w.-]+(:\d+)?/[\w./-]+:cuda", c["image"])
