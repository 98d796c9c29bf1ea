"""compose.yaml is generated from lab/topology.py (`lab compose`), and cannot run here (no
container engine), so it is checked against the repository: it is exactly what `lab
compose` prints; every command parses with our CLI (or is a flag Locust/mitmdump really
has); every path it names exists; every service:port it dials is one that service
listens on; every long-running service has a health check and every dependency waits
for the right condition."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from lab.cli import build_parser
from lab.run.options import PROXY_NAME
from tests.livesrv import LAB, ROOT

COMPOSE = ROOT / "compose.yaml"
ENV = {"SCENARIO": "smoke", "WORKERS": "3", "LAB_LEDGER_KEY": "ab" * 32, "LAB_ADMIN_TOKEN": "t" * 16}
ONE_SHOT = {"prepare", "report"}
HERE = Path(__file__).resolve().parent


def expand(text: str) -> str:
    """${VAR}, ${VAR:-default}, ${VAR:?message} as compose does, from ENV; $$ is a $."""

    def sub(m: re.Match[str]) -> str:
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if name in ENV:
            return ENV[name]
        if op == ":-":
            return rest or ""
        raise KeyError(f"${{{name}}} is not set and has no default")

    return re.sub(r"\$\{([A-Z_]+)(?:(:-|:\?)([^}]*))?\}", sub, text).replace("$$", "$")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    doc = YAML(typ="safe").load(COMPOSE.read_text())
    return dict(doc["services"])


def argv(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    assert isinstance(cmd, list), "commands are lists: no shell splitting, no quoting surprises"
    return [expand(c) for c in cmd]


def listens(services: dict[str, dict[str, Any]], name: str) -> set[int]:
    return {int(p) for p in services[name].get("expose", [])}


def test_compose_yaml_is_what_lab_compose_prints() -> None:
    out = subprocess.run([LAB, "compose"], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout == COMPOSE.read_text(), "compose.yaml is stale: run `lab compose > compose.yaml`"


def test_the_topology_is_all_there(services: dict[str, dict[str, Any]]) -> None:
    assert {"prepare", "server", "mitmproxy", "toxiproxy", "toxics", "master", "worker", "report"} <= set(
        services
    )
    assert services["toxiproxy"]["image"].startswith("ghcr.io/shopify/toxiproxy:")
    assert "deploy" not in services["worker"]  # --scale decides
    assert services["report"]["profiles"] == ["report"]


def test_every_part_on_the_clients_path_may_hold_tens_of_thousands_of_connections(
    services: dict[str, dict[str, Any]],
) -> None:
    # Two descriptors per connection in each proxy: one process under a 20,000 limit ran out
    # at ~9,000 clients; compose sets the limit rather than take the engine's default.
    for name in ("worker", "toxiproxy", "mitmproxy", "server"):
        nofile = services[name].get("ulimits", {}).get("nofile")
        assert nofile == {"soft": 65536, "hard": 65536}, (name, nofile)
    assert "ulimits" not in services["report"]  # a one-shot reader of files needs no more


def test_health_checks_and_dependency_conditions(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if name in ONE_SHOT:
            assert "healthcheck" not in svc, f"{name} is one-shot: its exit is its readiness"
        else:
            test = svc["healthcheck"]["test"]
            assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        for needed, how in (svc.get("depends_on") or {}).items():
            expected = "service_completed_successfully" if needed in ONE_SHOT else "service_healthy"
            assert how["condition"] == expected, f"{name} waits for {needed} with {how['condition']}"
    # Everything that writes into the run folder waits for prepare to have made it fresh.
    for name in ("server", "mitmproxy", "toxics", "master"):
        assert "prepare" in services[name]["depends_on"], name
    assert "master" in services["worker"]["depends_on"]


def test_the_checker_sees_a_bad_dependency() -> None:
    # The same rule on a service that waits for a one-shot with service_healthy: it must be caught.
    bad = {
        "prepare": {},
        "server": {
            "healthcheck": {"test": ["CMD", "x"]},
            "depends_on": {"prepare": {"condition": "service_healthy"}},
        },
    }
    with pytest.raises(AssertionError, match="waits for prepare"):
        test_health_checks_and_dependency_conditions(bad)


def test_the_master_waits_a_bounded_time_for_workers(services: dict[str, dict[str, Any]]) -> None:
    master = argv(services["master"])
    assert master[master.index("--expect-workers") + 1] == ENV["WORKERS"]
    assert 0 < int(master[master.index("--expect-workers-max-wait") + 1]) <= 120


@pytest.mark.parametrize("name", ["prepare", "server", "toxics", "report"])
def test_lab_commands_parse_with_our_cli(services: dict[str, dict[str, Any]], name: str) -> None:
    args = argv(services[name])
    assert args[0] == "lab"
    parsed = build_parser().parse_args(args[1:])  # SystemExit here means a flag or value is wrong
    assert parsed.func is not None


def test_no_secret_in_an_argv_but_the_servers(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if name != "server":
            assert ENV["LAB_ADMIN_TOKEN"] not in " ".join(argv(svc)), (
                f"{name} has the admin token in its argv"
            )
    assert "LAB_ADMIN_TOKEN" in services["mitmproxy"]["environment"]  # the addon reads it there


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
    assert proxy["name"] == PROXY_NAME  # the proxy `lab watch` puts toxics on
    assert proxy["upstream"] == f"mitmproxy:{mitm_port}"
    listen_port = int(proxy["listen"].rsplit(":", 1)[1])
    assert listen_port in listens(services, "toxiproxy")
    assert prepare.client_url == f"http://toxiproxy:{listen_port}/mcp"
    watch = build_parser().parse_args(argv(services["toxics"])[1:])
    assert watch.toxiproxy == "http://toxiproxy:8474" and 8474 in listens(services, "toxiproxy")


def test_every_dialled_service_port_is_listened_on(services: dict[str, dict[str, Any]]) -> None:
    text = " ".join(" ".join(argv(svc)) for svc in services.values() if "command" in svc)
    text += (ROOT / "compose" / "toxiproxy.json").read_text()
    for host, port in re.findall(r"\b(server|mitmproxy|toxiproxy|master):(\d+)\b", text):
        assert int(port) in listens(services, host), f"{host}:{port} is dialled but {host} does not expose it"
    worker = argv(services["worker"])
    master = argv(services["master"])
    assert worker[worker.index("--master-port") + 1] == master[master.index("--master-bind-port") + 1]
    assert worker[worker.index("--master-host") + 1] == "master"
    for name, svc in services.items():  # a TCP health probe looks where the service listens
        probe = " ".join(svc.get("healthcheck", {}).get("test", []))
        for port in re.findall(r"'127\.0\.0\.1', (\d+)", probe):
            assert int(port) in listens(services, name), f"{name} probes {port}, which it does not expose"


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
    for name in ("master", "worker"):
        assert services[name]["environment"]["LAB_LOCUST_SETTINGS"] == f"{prepare.out}/locust-settings.json"
    mitm = argv(services["mitmproxy"])
    plan = next(a.split("=", 1)[1] for a in mitm if a.startswith("mcpfaults_plan="))
    assert plan == f"{prepare.out}/proxy/plan.json"
    for name in ("report", "toxics"):
        parsed = build_parser().parse_args(argv(services[name])[1:])
        assert str(parsed.run_dir) == str(prepare.out), name
    copies = re.findall(r"^COPY (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for line in copies:
        for src in line.split():
            assert (ROOT / src).exists(), f"the Dockerfile copies {src}, which does not exist"


def _prepare(
    services: dict[str, dict[str, Any]], out: Path, scenario: str = "smoke"
) -> subprocess.CompletedProcess[str]:
    args = argv(services["prepare"])
    args[args.index("--out") + 1] = str(out)
    args[2] = scenario
    return subprocess.run([LAB, *args[1:]], cwd=out.parent, capture_output=True, text=True, timeout=60)


def test_prepare_writes_what_the_containers_read(tmp_path: Path, services: dict[str, dict[str, Any]]) -> None:
    out = tmp_path / "compose"
    proc = _prepare(services, out)
    assert proc.returncode == 0, proc.stderr
    settings = json.loads((out / "locust-settings.json").read_text())
    assert settings["url"] == "http://toxiproxy:8666/mcp" and settings["workers"] == 3
    assert ["lab-compose-token", "lab"] in settings["tokens"]
    assert json.loads((out / "proxy" / "plan.json").read_text())["schema"] == "mcpLabFaultPlan.v1"
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "running" and run["nemesis_proxy"] == PROXY_NAME
    assert (out / "nemesis.jsonl").exists()


def test_prepare_gives_every_run_a_fresh_folder(tmp_path: Path, services: dict[str, dict[str, Any]]) -> None:
    out = tmp_path / "compose"
    assert _prepare(services, out).returncode == 0
    (out / "proxy" / "tap.jsonl").write_text('{"type": "sent"}\n')  # evidence of the first run
    first_id = json.loads((out / "run.json").read_text())["started_at"]
    proc = _prepare(services, out, scenario="storm")  # a scenario without toxics: still one-shot, 0
    assert proc.returncode == 0, proc.stderr
    assert not (out / "proxy" / "tap.jsonl").exists(), "the second run must not append to the first's tap"
    (moved,) = [p for p in tmp_path.iterdir() if p.name.startswith("compose-")]
    assert (moved / "proxy" / "tap.jsonl").exists(), "the first run's evidence is kept, moved aside"
    assert json.loads((moved / "run.json").read_text())["started_at"] == first_id
    assert f"moved to {moved}" in proc.stdout
