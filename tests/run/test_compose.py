"""compose.yaml cannot run here (no container engine), so it is checked against the repository:
every command parses with our CLI (or is a flag Locust/mitmdump really has), every path it
names exists, every service:port it dials is a port that service listens on."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from lab.cli import build_parser
from lab.run.orchestrator import PROXY_NAME
from tests.livesrv import ROOT

COMPOSE = ROOT / "compose.yaml"
ENV = {"SCENARIO": "smoke", "WORKERS": "3", "LAB_LEDGER_KEY": "ab" * 32, "LAB_ADMIN_TOKEN": "t" * 16}


def expand(text: str) -> str:
    """${VAR}, ${VAR:-default}, ${VAR:?message} as compose does, from ENV."""

    def sub(m: re.Match[str]) -> str:
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if name in ENV:
            return ENV[name]
        if op == ":-":
            return rest or ""
        raise KeyError(f"${{{name}}} is not set and has no default")

    return re.sub(r"\$\{([A-Z_]+)(?:(:-|:\?)([^}]*))?\}", sub, text)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    doc = YAML(typ="safe").load(COMPOSE.read_text())
    return dict(doc["services"])


def argv(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return [expand(c) for c in cmd] if isinstance(cmd, list) else shlex.split(expand(cmd))


def listens(services: dict[str, dict[str, Any]], name: str) -> set[int]:
    return {int(p) for p in services[name].get("expose", [])}


def test_the_topology_is_all_there(services: dict[str, dict[str, Any]]) -> None:
    assert {"prepare", "server", "mitmproxy", "toxiproxy", "master", "worker", "report"} <= set(services)
    assert services["toxiproxy"]["image"].startswith("ghcr.io/shopify/toxiproxy:")
    assert (
        "deploy" not in services["worker"] or "replicas" not in services["worker"]["deploy"]
    )  # --scale decides


@pytest.mark.parametrize("name", ["prepare", "server", "report"])
def test_lab_commands_parse_with_our_cli(services: dict[str, dict[str, Any]], name: str) -> None:
    args = argv(services[name])
    assert args[0] == "lab"
    parsed = build_parser().parse_args(args[1:])  # SystemExit here means a flag or value is wrong
    assert parsed.func is not None


def test_server_and_chain_agree_on_ports(services: dict[str, dict[str, Any]]) -> None:
    serve = build_parser().parse_args(argv(services["server"])[1:])
    assert serve.port in listens(services, "server") and serve.host == "0.0.0.0"
    assert serve.tokens, "binding 0.0.0.0 needs bearer tokens (lab serve refuses otherwise)"
    prepare = build_parser().parse_args(argv(services["prepare"])[1:])
    assert set(serve.tokens.split(",")) <= set(prepare.tokens.split(",")), (
        "clients must hold the server's token"
    )
    assert f"server:{serve.port}" in serve.allowed_hosts.split(","), (
        "mitmdump's reverse mode sends Host: server:PORT"
    )
    mitm = argv(services["mitmproxy"])
    mode = mitm[mitm.index("--mode") + 1]
    assert mode == f"reverse:http://server:{serve.port}"
    mitm_port = int(mitm[mitm.index("--listen-port") + 1])
    assert mitm_port in listens(services, "mitmproxy")
    (proxy,) = json.loads((ROOT / "compose" / "toxiproxy.json").read_text())
    assert proxy["name"] == PROXY_NAME  # the proxy `lab prepare` puts toxics on
    assert proxy["upstream"] == f"mitmproxy:{mitm_port}"
    listen_port = int(proxy["listen"].rsplit(":", 1)[1])
    assert listen_port in listens(services, "toxiproxy")
    assert prepare.client_url == f"http://toxiproxy:{listen_port}/mcp"
    assert prepare.toxiproxy == "http://toxiproxy:8474" and 8474 in listens(services, "toxiproxy")


def test_every_dialled_service_port_is_listened_on(services: dict[str, dict[str, Any]]) -> None:
    text = " ".join(" ".join(argv(svc)) for svc in services.values() if "command" in svc)
    text += (ROOT / "compose" / "toxiproxy.json").read_text()
    for host, port in re.findall(r"\b(server|mitmproxy|toxiproxy|master):(\d+)\b", text):
        assert int(port) in listens(services, host), f"{host}:{port} is dialled but {host} does not expose it"
    worker = argv(services["worker"])
    master = argv(services["master"])
    assert worker[worker.index("--master-port") + 1] == master[master.index("--master-bind-port") + 1]
    assert worker[worker.index("--master-host") + 1] == "master"


def _flags_of(tool: str) -> str:
    exe = str(Path(sys.executable).with_name(tool))
    # mitmdump prints its help and then exits 1; its text is what matters.
    return subprocess.run([exe, "--help"], capture_output=True, text=True, check=False).stdout


def test_locust_commands_use_real_flags_and_files(services: dict[str, dict[str, Any]]) -> None:
    help_text = _flags_of("locust")
    for name in ("master", "worker"):
        args = argv(services[name])
        assert args[0] == "locust"
        for a in args:
            if a.startswith("--"):
                assert a in help_text, f"{name}: locust has no {a}"
        assert (ROOT / args[args.index("-f") + 1]).is_file()
    master = argv(services["master"])
    assert master[master.index("--expect-workers") + 1] == ENV["WORKERS"]


def test_mitmdump_command_uses_the_addon_and_its_options(services: dict[str, dict[str, Any]]) -> None:
    args = argv(services["mitmproxy"])
    assert args[0] == "mitmdump"
    addon = ROOT / args[args.index("-s") + 1]
    assert addon.is_file()
    # The fault addon loads the tap (addons/mcp_tap.py); each declares its options in `load`,
    # from a table of ("mcpfaults_...", default, help).
    sources = addon.read_text() + (ROOT / "addons" / "mcp_tap.py").read_text()
    declared = set(re.findall(r'\(\s*"(mcpfaults_[a-z_]+)",', sources))
    assert {"mcpfaults_plan", "mcpfaults_tap"} <= declared
    help_text = _flags_of("mitmdump")
    for i, a in enumerate(args):
        if a == "--set":
            option = args[i + 1].split("=", 1)[0]
            assert option in declared or option == "connection_strategy", f"unknown option {option}"
        elif a.startswith("--"):
            assert a in help_text, f"mitmdump has no {a}"


def test_paths_and_shared_files_agree(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            host = vol.split(":", 1)[0]
            assert (ROOT / host).exists(), f"{name} mounts {host}, which is not in the repository"
    prepare = build_parser().parse_args(argv(services["prepare"])[1:])
    settings = services["master"]["environment"]["LAB_LOCUST_SETTINGS"]
    assert settings == f"{prepare.out}/locust-settings.json"
    mitm = argv(services["mitmproxy"])
    plan = next(a.split("=", 1)[1] for a in mitm if a.startswith("mcpfaults_plan="))
    assert plan == f"{prepare.out}/proxy/plan.json"
    report = build_parser().parse_args(argv(services["report"])[1:])
    assert str(report.run_dir) == str(prepare.out)
    copies = re.findall(r"^COPY (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for line in copies:
        for src in line.split():
            assert (ROOT / src).exists(), f"the Dockerfile copies {src}, which does not exist"


def test_prepare_writes_what_the_containers_read(tmp_path: Path, services: dict[str, dict[str, Any]]) -> None:
    args = argv(services["prepare"])
    out = tmp_path / "compose"
    i = args.index("--out")
    args[i + 1] = str(out)
    args = [a for a in args if a not in ("--toxiproxy", "http://toxiproxy:8474")]  # no schedule here
    lab = str(Path(sys.executable).with_name("lab"))
    proc = subprocess.run([lab, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    settings = json.loads((out / "locust-settings.json").read_text())
    assert settings["url"] == "http://toxiproxy:8666/mcp" and settings["workers"] == 3
    assert ["lab-compose-token", "lab"] in settings["tokens"]
    assert json.loads((out / "proxy" / "plan.json").read_text())["schema"] == "mcpLabFaultPlan.v1"
    assert json.loads((out / "run.json").read_text())["end_reason"] == "compose"
