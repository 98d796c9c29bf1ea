"""`lab kubernetes`: the run's Kubernetes objects, from the topology compose.yaml and
`lab run` share. No cluster runs here (docs/scaling.md), so they are checked as the API
server would check their shape, against the Kubernetes API's own schemas
(kubernetes-validate, strict: no field the API does not have), and against compose.yaml:
the same parts, the same commands, the same ports."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from lab.run.kubernetes import ADMIN_TOKEN, manifests, toxiproxy_config
from tests.livesrv import LAB, ROOT
from tests.run.test_compose import COMPOSE, ENV, argv

K8S_VERSION = "1.31"
WORKERS = int(ENV["WORKERS"])


def objects() -> list[dict[str, Any]]:
    return manifests(ENV["SCENARIO"], WORKERS)


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


def pod(o: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = o["spec"]["template"]["spec"]
    return spec


def test_every_object_is_valid_against_the_kubernetes_api_schemas() -> None:
    docs = objects() + manifests(ENV["SCENARIO"], WORKERS, report=True)
    assert {o["kind"] for o in docs} == {"PersistentVolumeClaim", "ConfigMap", "Job", "Deployment", "Service"}
    for o in docs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    # The validator is seen to refuse what the API server would.
    bad = copy.deepcopy(by_kind("Deployment")["server"])
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    unknown = copy.deepcopy(by_kind("Job")["worker"])
    unknown["spec"]["template"]["spec"]["containers"][0]["ulimits"] = {"nofile": 65536}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, K8S_VERSION, strict=True)


def test_the_same_parts_commands_and_ports_as_compose() -> None:
    services = dict(YAML(typ="safe").load(COMPOSE.read_text())["services"])
    workloads = {**by_kind("Deployment"), **by_kind("Job")}
    report = {o["metadata"]["name"]: o for o in manifests(ENV["SCENARIO"], WORKERS, report=True)}
    assert set(workloads) | set(report) == set(services)
    for name, svc in services.items():
        (container,) = pod({**workloads, **report}[name])["containers"]
        command = container.get("command") or container["args"]
        token = ENV["LAB_ADMIN_TOKEN"]
        assert [c.replace(ADMIN_TOKEN, token) for c in command] == argv(svc), name
        assert {p["containerPort"] for p in container.get("ports", [])} == {
            int(p) for p in svc.get("expose", [])
        }
    # Every port a part listens on is a Service of its name, so `http://server:8000` in a
    # command resolves in the cluster as it does on compose's network.
    for name, service in by_kind("Service").items():
        assert {p["port"] for p in service["spec"]["ports"]} == {int(p) for p in services[name]["expose"]}
    # The workers: N pods at once; the parts that end with the load are Jobs.
    assert by_kind("Job")["worker"]["spec"]["parallelism"] == WORKERS
    assert set(by_kind("Deployment")) == {"server", "mitmproxy", "toxiproxy"}
    # Toxiproxy's proxy is compose's.
    assert toxiproxy_config() == json.loads((ROOT / "compose" / "toxiproxy.json").read_text())


def test_what_each_part_waits_for_is_what_compose_waits_for() -> None:
    services = dict(YAML(typ="safe").load(COMPOSE.read_text())["services"])
    workloads = {**by_kind("Deployment"), **by_kind("Job")}
    for name, o in workloads.items():
        waits = {c["name"].removeprefix("wait-for-") for c in pod(o).get("initContainers", [])}
        assert waits == set(services[name].get("depends_on", {})), name


def test_no_secret_is_in_a_manifest() -> None:
    text = subprocess.run(
        [LAB, "kubernetes", "--workers", str(WORKERS)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert text.returncode == 0, text.stderr
    docs = [d for d in YAML(typ="safe").load_all(text.stdout) if d is not None]
    assert docs == objects()
    for o in docs:
        for c in pod(o)["containers"] if "template" in o.get("spec", {}) else []:
            for e in c.get("env", []):
                if e["name"] in ("LAB_LEDGER_KEY", "LAB_ADMIN_TOKEN"):
                    assert set(e) == {"name", "valueFrom"}, e  # from the Secret, never written here
    assert ENV["LAB_LEDGER_KEY"] not in text.stdout and "$(LAB_ADMIN_TOKEN)" in text.stdout
    refused = subprocess.run(
        [LAB, "kubernetes", "--scenario", "no-such"], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 3 and "no such scenario file" in refused.stderr
