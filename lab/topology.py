"""The parts of a run, one description for `lab run` (processes on 127.0.0.1) and
`lab compose` (containers, `compose.yaml` is generated from it).

    prepare ─► server ─► mitmproxy ─► nemesis / toxiproxy ─► master ─► worker × N
    (compose:                         toxics (the schedule) ┘             report
     one-shot)

Each part says its command line, how to tell it is ready (a line it prints, for `lab
run`; a health probe, for compose), what it needs first, and whether it is one-shot
(done when it exits 0) or long-running. A `Site` says where the parts run: the address
they bind, their ports (0: the part picks one and prints it), the program paths and the
run folder as the parts see it. `lab run` walks the parts in order on `LOCAL`, feeding
each the address the previous one printed; `lab compose` renders them on a compose site
with fixed service names and ports. Nothing here starts a process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Final, Literal

from lab.faults.launch import FAULT_ADDON, mitmdump_argv, ready_prefix

Condition = Literal["healthy", "completed", "started"]
"""What a part waits for of one it needs: ready (health probe passed), exited 0, or started."""

SERVE_READY: Final = "lab-serve listening on "
NEMESIS_READY: Final = "lab-nemesis api "
PROXY_READY: Final = ready_prefix(FAULT_ADDON)
LOCUSTFILE: Final = Path(str(resources.files("lab.load").joinpath("locustfile.py")))
"""The lab's locustfile: a module of the `lab` package, so it is wherever `lab` is."""


@dataclass(frozen=True, slots=True)
class Site:
    """Where the parts run and how they reach one another."""

    name: Literal["local", "compose"]
    bind: str
    """The address every listening part binds."""
    ports: Mapping[str, int]
    """Listening port of each part (0: the part picks a free one and prints it)."""
    program: Callable[[str], str]
    """The command that runs a program (`lab`, `locust`, `mitmdump`) on this site."""
    addon: str
    """The fault addon's path, as the mitmproxy part sees it."""
    locustfile: str
    """The locustfile's path, as the Locust parts see it."""


def _beside_python(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


LOCAL: Final = Site(
    name="local",
    bind="127.0.0.1",
    ports={"server": 0, "mitmproxy": 0, "nemesis": 0},
    program=_beside_python,
    addon=str(FAULT_ADDON),
    locustfile=str(LOCUSTFILE),
)

COMPOSE_RESULTS: Final = "/results/compose"
PLAN_FILE: Final = "proxy/plan.json"
"""The fault plan in a run folder: written by `lab run` (or `lab prepare`), read by the
addon, its clock set by the Locust master when the load starts."""
COMPOSE_OPEN_FILES: Final = 65_536
"""The open-files limit of every compose part a client's connection passes through. A
proxy holds two descriptors per connection and a mostly idle client about one
connection: one process under a 20,000 limit ran out at ~9,000 clients
(docs/architecture.md); 65,536 leaves each proxy room for ~30,000."""
TOXIPROXY_IMAGE: Final = "ghcr.io/shopify/toxiproxy:2.12.0"
COMPOSE: Final = Site(
    name="compose",
    bind="0.0.0.0",
    ports={"server": 8000, "mitmproxy": 8080, "master": 5557, "toxiproxy-api": 8474, "toxiproxy": 8666},
    program=lambda name: name,
    # The image's working directory holds the repository (Dockerfile): the same files the
    # installed `lab_addons` package has, at a path compose can write down.
    addon="addons/mcp_faults.py",
    locustfile="lab/load/locustfile.py",
)


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    argv: tuple[str, ...]
    ready_line: str | None = None
    """`lab run`: the part is ready once its log has a line starting with this (the rest
    of the line is its address). None: ready when started."""
    probe: tuple[str, ...] | None = None
    """compose: the health check command (exit 0 = ready). None for one-shot parts."""
    needs: tuple[tuple[str, Condition], ...] = ()
    one_shot: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    expose: tuple[int, ...] = ()
    image: str | None = None
    """compose: an image of its own (None: the lab's image, which runs every lab part)."""
    volumes: tuple[str, ...] = ()
    """compose: extra mounts `host:container[:ro]` (every lab part mounts ./results)."""
    open_files: int | None = None
    """compose: the container's open-files limit, soft and hard (None: the engine's default)."""


def tcp_probe(port: int) -> tuple[str, ...]:
    """A health probe that passes once something accepts TCP connections on `port`."""
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2).close()"
    return ("python", "-c", code)


def file_probe(path: str) -> tuple[str, ...]:
    """A health probe that passes once `path` exists."""
    return ("test", "-f", path)


# --------------------------------------------------------------------------- the parts


def server(
    site: Site, run_dir: str, settings: Sequence[str], *, name: str = "server", ledger: bool = True
) -> Part:
    """The reference server. `settings`: its options (a `--config FILE`, or flags).
    `ledger`: False for replicas each with a state of their own (one ledger file is one
    server's account; the wire is the truth then)."""
    port = site.ports["server"]
    return Part(
        name=name,
        argv=(
            site.program("lab"),
            "serve",
            "--host",
            site.bind,
            "--port",
            str(port),
            *(("--ledger", f"{run_dir}/server/ledger.sqlite") if ledger else ()),
            *settings,
        ),
        ready_line=SERVE_READY,
        probe=tcp_probe(port),
        needs=(("prepare", "completed"),) if site.name == "compose" else (),
        expose=(port,) if port else (),
    )


def fault_proxy(site: Site, run_dir: str, upstream: str, options: Mapping[str, str]) -> Part:
    """mitmdump with the fault addon, in reverse mode in front of `upstream` (http://host:port)."""
    port = site.ports["mitmproxy"]
    argv = mitmdump_argv(
        upstream,
        options={
            "mcpfaults_plan": f"{run_dir}/{PLAN_FILE}",
            "mcpfaults_tap": f"{run_dir}/proxy/tap.jsonl",
            **options,
        },
    )
    # One command line for every site (lab.faults.launch): only where it listens, the
    # program and the addon's path differ.
    argv[0] = site.program("mitmdump")
    argv[argv.index("--listen-host") + 1] = site.bind
    argv[argv.index("--listen-port") + 1] = str(port)
    argv[argv.index("-s") + 1] = site.addon
    needs: tuple[tuple[str, Condition], ...] = (
        (("prepare", "completed"), ("server", "healthy")) if site.name == "compose" else ()
    )
    return Part(
        name="mitmproxy",
        argv=tuple(argv),
        ready_line=PROXY_READY,
        probe=tcp_probe(port),
        needs=needs,
        expose=(port,) if port else (),
    )


def nemesis(site: Site, run_dir: str, seed: int) -> Part:
    """The embedded TCP nemesis (Toxiproxy API); its randomness comes from the scenario's seed."""
    return Part(
        name="nemesis",
        argv=(
            site.program("lab"),
            "nemesis",
            "--api-port",
            str(site.ports["nemesis"]),
            "--log",
            f"{run_dir}/nemesis.jsonl",
            "--seed",
            str(seed),
        ),
        ready_line=NEMESIS_READY,
    )


def master(
    site: Site, run_dir: str, *, port: int, workers: str, ui_port: int | None = None, worker_wait: int = 60
) -> Part:
    """The Locust master: the load shape, the budget split, progress.json. It waits at
    most `worker_wait` seconds for its `workers`, then starts with those it has."""
    argv = [
        site.program("locust"),
        "-f",
        site.locustfile,
        "--master",
        "--master-bind-host",
        site.bind,
        "--master-bind-port",
        str(port),
        "--expect-workers",
        workers,
        "--expect-workers-max-wait",
        str(worker_wait),
        "--stop-timeout",
        "10",
        "--only-summary",
        "--exit-code-on-error",  # failed calls are what a chaos run is about, not a failure of the run
        "0",
        "--json-file",
        f"{run_dir}/locust",
    ]
    if ui_port is None:
        argv.append("--headless")
    else:
        argv += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(ui_port)]
    needs: tuple[tuple[str, Condition], ...] = (
        (("prepare", "completed"), ("mitmproxy", "healthy"), ("toxiproxy", "healthy"))
        if site.name == "compose"
        else ()
    )
    return Part(
        name="master",
        argv=tuple(argv),
        probe=tcp_probe(port),
        needs=needs,
        env={"LAB_LOCUST_SETTINGS": f"{run_dir}/locust-settings.json"},
        expose=(port,),
    )


def worker(site: Site, run_dir: str, *, master_host: str, master_port: int) -> Part:
    """A Locust worker. Healthy once it has opened its client ledger."""
    return Part(
        name="worker",
        argv=(
            site.program("locust"),
            "-f",
            site.locustfile,
            "--worker",
            "--master-host",
            master_host,
            "--master-port",
            str(master_port),
        ),
        # A worker's ledger is named after its host (compose: the container's).
        probe=("CMD-SHELL", f"test -f {run_dir}/clients/worker-$$(hostname).sqlite"),
        needs=(("master", "healthy"),),
        env={"LAB_LOCUST_SETTINGS": f"{run_dir}/locust-settings.json"},
    )


def report(site: Site, run_dir: str) -> Part:
    """`lab report`: the checker; one-shot."""
    return Part(name="report", argv=(site.program("lab"), "report", run_dir), one_shot=True)


# --------------------------------------------------------------------------- compose


def compose_parts(scenario: str, workers: str, tokens: str, admin_token: str) -> list[Part]:
    """Every service of compose.yaml. Arguments are compose expressions (`${SCENARIO:-smoke}`)."""
    site, run = COMPOSE, COMPOSE_RESULTS
    p = site.ports
    client_url = f"http://toxiproxy:{p['toxiproxy']}/mcp"
    toxiproxy_api = f"http://toxiproxy:{p['toxiproxy-api']}"
    prepare = Part(
        name="prepare",
        argv=(
            "lab",
            "prepare",
            scenario,
            "--out",
            run,
            "--workers",
            workers,
            "--client-url",
            client_url,
            "--tokens",
            tokens,
        ),
        one_shot=True,
    )
    srv = server(
        site,
        run,
        [
            "--tokens",
            tokens,
            "--allowed-hosts",
            f"server:{p['server']},localhost:{p['server']}",
            "--admin-token",
            admin_token,
        ],
    )
    proxy = fault_proxy(
        site,
        run,
        f"http://server:{p['server']}",
        {"mcpfaults_allowed_origins": "http://127.0.0.1:*,http://localhost:*"},
    )
    toxiproxy = Part(
        name="toxiproxy",
        argv=("-host=0.0.0.0", "-config=/config/toxiproxy.json"),
        probe=("/toxiproxy-cli", "list"),
        expose=(p["toxiproxy-api"], p["toxiproxy"]),
        image=TOXIPROXY_IMAGE,
        volumes=("./compose/toxiproxy.json:/config/toxiproxy.json:ro",),
    )
    toxics = Part(
        name="toxics",
        argv=("lab", "watch", run, "--toxiproxy", toxiproxy_api),
        probe=file_probe(f"{run}/nemesis.jsonl"),
        needs=(("prepare", "completed"), ("toxiproxy", "healthy")),
    )
    mst = master(site, run, port=p["master"], workers=workers)
    wrk = worker(site, run, master_host="master", master_port=p["master"])
    parts = [prepare, srv, proxy, toxiproxy, toxics, mst, wrk, report(site, run)]
    on_the_path = {srv.name, proxy.name, toxiproxy.name, wrk.name}  # where the clients' connections go
    return [replace(q, open_files=COMPOSE_OPEN_FILES) if q.name in on_the_path else q for q in parts]
