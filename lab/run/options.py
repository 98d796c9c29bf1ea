"""What a run is given (`RunOptions`), how it fails to be made (`RunError`), and the small
facts `lab run` and compose share: the nemesis proxy's name, a legal Origin for the
clients, the load-started and load-ended files the Locust master writes."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lab.load.clock import load_started_at
from lab.scenario import Scenario

PROXY_NAME = "mcp"
"""The nemesis proxy in front of the fault layer (compose/toxiproxy.json names it too)."""
STOP_GRACE = 10.0
BROKEN_CHAIN = ("traffic stalled", "toxic removal failed", "part died")
"""End reasons after which the chain may not carry the users' goodbyes."""


class RunError(RuntimeError):
    """The run could not be made; the message says which part and why."""


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    target: str | None = None
    """None: the scenario's target; "reference" or a URL overrides it."""
    workers: int | None = None
    toxiproxy: str | None = None
    """A real Toxiproxy API URL; None starts the embedded nemesis."""
    out: Path = Path("results")
    ui: bool = False
    report: bool = True
    figures: bool = True
    """False: `lab report --no-figures` (the verdict and the documents, no PNGs)."""
    quiet: bool = False
    client: str | None = None
    """None: the scenario's `[load] client` (default `lab`); else a client under test (lab.run.sut)."""
    baseline: Path | None = None
    """Known failures of the client (`--baseline FILE`); None: the scenario's `[expected_failures]`."""
    metrics_port: int | None = None
    """`--metrics-port`: serve the run's counters as Prometheus text there (0: a free port)."""
    strict: bool = False
    """`--strict`: refuse a run this box cannot be expected to hold (lab.run.boxfit)."""
    metrics_file: Path | None = None
    """`--metrics-file`: append the run's counters there, one JSON line a second."""


LOAD_ENDED_FILE = "load-ended.json"
"""Written by the Locust master when the load ended with the web UI up (lab/load/locustfile.py,
not imported here: it imports Locust)."""


def load_ended(run_dir: Path) -> str | None:
    """Why the master says the load ended (`stopped_in_ui`, `load_complete`), if it says."""
    try:
        doc = json.loads((run_dir / LOAD_ENDED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(doc.get("reason")) if isinstance(doc, dict) else None


def load_started(run_dir: Path) -> float | None:
    """When the Locust master says the load starts (epoch s; lab.load.clock), once it has."""
    return load_started_at(run_dir)


def wait_for_load_start(
    run_dir: Path, within: float, *, poll: float = 0.05, give_up: Callable[[], bool] = lambda: False
) -> float | None:
    """When the Locust master starts the load, once it has said so within `within` s;
    None if it has not, or as soon as `give_up()` (asked every `poll` s) says to stop."""
    deadline = time.monotonic() + within
    while True:
        at = load_started(run_dir)
        if at is not None or time.monotonic() >= deadline or give_up():
            return at
        time.sleep(poll)


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_LISTEN_PORT = 10000
"""Below this are the well-known and registered services a developer's machine may run."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections and to `bind(0)` (Linux's
    default where the file cannot be read)."""
    try:
        low, high = (int(x) for x in path.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(rng: random.Random | None = None, ephemeral: tuple[int, int] | None = None) -> int:
    """A port for a part to listen on that the part binds later, in another process.

    Not from `bind(0)`: that port is one of the kernel's ephemeral ones, so between our
    check and the part's bind any outgoing connection on the machine, or another
    `bind(0)`, may take it (a Locust master then died with "Address already in use"
    while other runs' clients were connecting). A random free port below the ephemeral
    range is never handed out by the kernel; only another process choosing the same one
    at the same moment could take it."""
    rng = rng or random.Random()
    low, _high = ephemeral or ephemeral_range()
    if low - LOWEST_LISTEN_PORT >= 1000:
        for _ in range(50):
            port = rng.randrange(LOWEST_LISTEN_PORT, low)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below the range, or all of it taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def client_origin(allowed: tuple[str, ...]) -> str | None:
    """A legal Origin for the lab's clients: the first allowed one (a `:*` port made concrete)."""
    if not allowed:
        return None
    first = allowed[0]
    return first[:-2] + ":3000" if first.endswith(":*") else first
