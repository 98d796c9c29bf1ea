"""How mitmdump is started in front of a target: one place for its command line (pure).

Used by `lab run`, the fault-layer tests and bench/bench_proxy.py, so that they all run
the proxy the same way: reverse mode on 127.0.0.1, a port of its own choosing (the addon
prints `<addon> listening on http://HOST:PORT`), and `connection_strategy=lazy`, so that
answers the addon makes itself (storms) open no upstream connection.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from lab.resources import addon_dir

ADDONS = addon_dir()
FAULT_ADDON = ADDONS / "mcp_faults.py"
"""The fault addon; it loads the tap (`TAP_ADDON`) alongside itself, so one `-s` runs both."""
TAP_ADDON = ADDONS / "mcp_tap.py"
"""The tap alone: a proxy that records what passes and injects nothing."""


def mitmdump_argv(
    upstream: str, *, script: Path = FAULT_ADDON, options: dict[str, str] | None = None
) -> list[str]:
    """`mitmdump` (next to this Python) as a reverse proxy to `upstream` (http://host:port),
    loading `script`, with `--set name=value` for each of `options`."""
    argv = [
        str(Path(sys.executable).with_name("mitmdump")),
        "-q",
        "--mode",
        f"reverse:{upstream}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--set",
        "connection_strategy=lazy",
        "-s",
        str(script),
    ]
    for name, value in (options or {}).items():
        argv += ["--set", f"{name}={value}"]
    return argv


def balancer_options(upstreams: Sequence[str], affinity: str = "none") -> dict[str, str]:
    """The fault addon's options that make the proxy a balancer over `upstreams` (their
    `http://host:port` URLs; lab.faults.balance): `affinity` none or session. Give the first
    as `mitmdump_argv`'s upstream too: reverse mode needs one, and the addon routes every
    request it forwards anyway."""
    authorities = [urlsplit(u).netloc or u for u in upstreams]
    return {"mcpfaults_replicas": ",".join(authorities), "mcpfaults_affinity": affinity}


def ready_prefix(script: Path = FAULT_ADDON) -> str:
    """The start of the line the addon prints once the proxy listens."""
    return f"{script.stem} listening on "
