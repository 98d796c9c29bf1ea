"""Kubernetes manifests of a run, generated from the same topology as compose.yaml
(`lab.topology.compose_parts`): `lab kubernetes --scenario S --workers N > lab.yaml`.

No cluster was run here (docs/scaling.md): the manifests are validated against the
Kubernetes API's schemas in a test (tests/run/test_kubernetes.py), and their parts, ports
and commands are the topology's, the ones compose and `lab run` use. The mapping:

    a serving part        a Deployment (server, mitmproxy, toxiproxy), a Service where it
                          listens, its health probe as the readiness probe, and an
                          init container that waits for what it needs (a TCP port of a
                          Service, or the run folder `prepare` wrote)
    prepare               a Job (it runs first; the others wait for its run.json)
    report                a Job printed alone by `--report`, applied after the load ended
    master, workers,      Jobs (the workers: N pods at once): they end with the load, and a
    toxics                Deployment would start them again
    ./results             a ReadWriteMany PersistentVolumeClaim, `lab-results`, mounted
                          at /results by every lab part (the run folder is shared, as in
                          compose)
    toxiproxy's config    a ConfigMap, the same proxy as compose/toxiproxy.json
    secrets               LAB_LEDGER_KEY and LAB_ADMIN_TOKEN from a Secret `lab-secrets`
                          the user makes (never in a manifest)

The Locust workers are a plain Job: the Locust operator's custom resource is not
used (its schema is not part of the Kubernetes API this is validated against). Open-file
limits (compose's `ulimits`) have no per-container field in Kubernetes: the nodes' own
limits apply (docs/scaling.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from lab import topology
from lab.run.compose import TOKENS

IMAGE = "mcp-lab:latest"
ADMIN_TOKEN = "$(LAB_ADMIN_TOKEN)"
"""Kubernetes expands `$(VAR)` in a command from the container's environment."""
RESULTS_CLAIM = "lab-results"
SECRETS = "lab-secrets"
TOXIPROXY_CONFIG = "toxiproxy-config"
LABELS_KEY = "app.kubernetes.io/part-of"
LABELS_VALUE = "mcp-lab"
RUN_TO_THEIR_END = frozenset({"prepare", "toxics", "master", "worker", "report"})
"""Parts that end by themselves (the load's end ends the master, the workers and the
watch): Jobs, since a Deployment would start them again. The others serve until the run
is torn down (`kubectl delete -l app.kubernetes.io/part-of=mcp-lab ...`)."""


def _results_volume() -> dict[str, Any]:
    """The run folder, shared by every lab part and the init containers that wait for it."""
    return {"name": "results", "persistentVolumeClaim": {"claimName": RESULTS_CLAIM}}


def _results_mount() -> dict[str, Any]:
    return {"name": "results", "mountPath": "/results"}


def _labels(name: str) -> dict[str, str]:
    return {LABELS_KEY: LABELS_VALUE, "app.kubernetes.io/name": name}


def _env(part: topology.Part) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "LAB_LEDGER_KEY", "valueFrom": {"secretKeyRef": {"name": SECRETS, "key": "LAB_LEDGER_KEY"}}}
    ]
    if part.name in ("mitmproxy", "server"):
        # The addon reads it from there; the server's `--admin-token $(LAB_ADMIN_TOKEN)` is
        # expanded from there by Kubernetes: the token is in no manifest.
        env.append(
            {
                "name": "LAB_ADMIN_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": SECRETS, "key": "LAB_ADMIN_TOKEN"}},
            }
        )
    env += [{"name": k, "value": v} for k, v in part.env.items()]
    return env


def _probe(part: topology.Part) -> dict[str, Any] | None:
    if part.probe is None:
        return None
    command = (
        ["sh", "-c", part.probe[1].replace("$$", "$")] if part.probe[0] == "CMD-SHELL" else list(part.probe)
    )
    return {"exec": {"command": command}, "periodSeconds": 1, "timeoutSeconds": 5, "failureThreshold": 120}


def _waits(part: topology.Part, ports: Mapping[str, tuple[int, ...]], run_dir: str) -> list[dict[str, Any]]:
    """Init containers: one per thing the part needs (compose's `depends_on`)."""
    out = []
    for name, condition in part.needs:
        if condition == "completed":
            code = f"import os,time\nwhile not os.path.exists({run_dir + '/run.json'!r}): time.sleep(1)"
        else:
            port = ports[name][0]
            code = (
                "import socket,time\nwhile True:\n"
                f"    try: socket.create_connection(({name!r}, {port}), 2).close(); break\n"
                "    except OSError: time.sleep(1)"
            )
        out.append(
            {
                "name": f"wait-for-{name}",
                "image": IMAGE,
                "command": ["python", "-c", code],
                "volumeMounts": [_results_mount()],
            }
        )
    return out


def _pod(part: topology.Part, ports: Mapping[str, tuple[int, ...]], run_dir: str) -> dict[str, Any]:
    """The pod template of one part."""
    if part.image is None:
        container: dict[str, Any] = {
            "name": part.name,
            "image": IMAGE,
            "command": list(part.argv),
            "env": _env(part),
            "volumeMounts": [_results_mount()],
        }
        volumes: list[dict[str, Any]] = [_results_volume()]
    else:  # toxiproxy: its own image, its config from the ConfigMap
        container = {
            "name": part.name,
            "image": part.image,
            "args": list(part.argv),
            "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}],
        }
        volumes = [{"name": "config", "configMap": {"name": TOXIPROXY_CONFIG}}]
    if part.expose:
        container["ports"] = [{"containerPort": p} for p in part.expose]
    probe = _probe(part)
    if probe is not None:
        container["readinessProbe"] = probe
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
    waits = _waits(part, ports, run_dir)
    if waits:
        spec["initContainers"] = waits
        if _results_volume() not in volumes:
            volumes.append(_results_volume())
    if part.name in RUN_TO_THEIR_END:
        spec["restartPolicy"] = "Never"
    return {"metadata": {"labels": _labels(part.name)}, "spec": spec}


def _workload(
    part: topology.Part, workers: int, ports: Mapping[str, tuple[int, ...]], run_dir: str
) -> dict[str, Any]:
    meta = {"name": part.name, "labels": _labels(part.name)}
    if part.name in RUN_TO_THEIR_END:
        n = workers if part.name == "worker" else 1
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "backoffLimit": 0,
                "parallelism": n,
                "completions": n,
                "template": _pod(part, ports, run_dir),
            },
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _labels(part.name)},
            "template": _pod(part, ports, run_dir),
        },
    }


def _service(part: topology.Part) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": part.name, "labels": _labels(part.name)},
        "spec": {
            "selector": _labels(part.name),
            "ports": [{"name": f"p{p}", "port": p, "targetPort": p} for p in part.expose],
        },
    }


def toxiproxy_config() -> list[dict[str, Any]]:
    """The real Toxiproxy's proxy: the clients' front door, in front of mitmdump (as
    compose/toxiproxy.json)."""
    p = topology.COMPOSE.ports
    return [
        {
            "name": "mcp",
            "listen": f"0.0.0.0:{p['toxiproxy']}",
            "upstream": f"mitmproxy:{p['mitmproxy']}",
            "enabled": True,
        }
    ]


def manifests(scenario: str, workers: int, *, report: bool = False) -> list[dict[str, Any]]:
    """Every object of a run of `scenario` with `workers` Locust workers; with `report`,
    only the report's Job (applied once the load ended)."""
    parts = topology.compose_parts(scenario, str(workers), TOKENS, ADMIN_TOKEN)
    ports = {p.name: p.expose for p in parts}
    run_dir = topology.COMPOSE_RESULTS
    if report:
        return [_workload(p, workers, ports, run_dir) for p in parts if p.name == "report"]
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": RESULTS_CLAIM, "labels": _labels("results")},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": TOXIPROXY_CONFIG, "labels": _labels("toxiproxy")},
            "data": {"toxiproxy.json": json.dumps(toxiproxy_config(), indent=2)},
        },
    ]
    for p in parts:
        if p.name == "report":
            continue
        out.append(_workload(p, workers, ports, run_dir))
        if p.expose:
            out.append(_service(p))
    return out


HEADER = """\
# GENERATED by `lab kubernetes` from lab/topology.py (the topology of compose.yaml and `lab run`).
# No cluster ran these here: they are validated against the Kubernetes API's schemas in the tests.
#
#   kubectl create secret generic lab-secrets \\
#     --from-literal=LAB_LEDGER_KEY=$(openssl rand -hex 32) --from-literal=LAB_ADMIN_TOKEN=$(openssl rand -hex 16)
#   kubectl apply -f lab.yaml                      # the run: prepare, the chain, the load
#   kubectl wait --for=condition=complete job/master job/toxics --timeout=1h
#   lab kubernetes --report | kubectl apply -f -   # the report, into the same run folder
#
# The run folder is the `lab-results` claim (ReadWriteMany), /results/compose in every part.
"""


def yaml_text(docs: Iterable[Mapping[str, Any]]) -> str:
    """Multi-document YAML (JSON is YAML: each document is written as JSON, one per `---`)."""
    return HEADER + "".join(f"---\n{json.dumps(d, indent=2)}\n" for d in docs)
