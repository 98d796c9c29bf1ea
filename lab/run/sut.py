"""`lab run --client`: which client the load is, checked before anything starts, and what
run.json says about it.

- `resolve` names the client (`--client`, else the scenario's `[load] client`, else
  `lab`) and its known failures (`--baseline FILE`, else the scenario's
  `[expected_failures]`, for that client's kind). An adapter that cannot run here is
  refused at once (`ClientRefused`, exit 3), with what to install: no Node.js, or the
  TypeScript SDK not installed (`make node-adapter`).
- `probe` starts the adapter once, reads its `ready` line (the implementation's name and
  version, for run.json and the report) and stops it: a broken adapter is refused before
  the run, not found dead in a Locust worker.
- After the run, `adapters_of` reads the `ready` line of each worker's application log
  (`clients/app-<worker>.jsonl`), and `stop_leftovers` ends any adapter still alive by
  its PID (a worker that was killed before it could stop its adapter).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import __version__
from lab.scenario import Scenario, ScenarioError, load_baseline
from lab.sut.host import (
    NODE_DIR_ENV,
    AdapterCommand,
    AdapterFailed,
    AdapterProcess,
    AdapterUnavailable,
    adapter_command,
    node_dir,
    read_app_log,
)
from lab.wire.revisions import BOTH_ERAS, eras_of

APP_LOG_GLOB = "clients/app-*.jsonl"
PROBE_TIMEOUT_S = 60.0
"""How long the adapter may take to say `ready` (Node and the Python SDK import for a second or two)."""


class ClientRefused(RuntimeError):
    """The client cannot be used here; the message says what to do."""


@dataclass(frozen=True)
class ClientUnderTest:
    spec: str
    """As given: `lab`, `python-sdk`, `typescript-sdk` or `cmd:<command>`."""
    command: AdapterCommand | None
    """None for `lab` (the lab's own client core under Locust)."""
    expected_failures: tuple[str, ...] = ()
    baseline: str | None = None
    """Where the known failures come from: the baseline file, `scenario`, or None."""
    implementation: dict[str, Any] | None = None
    """The adapter's `ready` record's `implementation` ({"name", "version"}), once probed."""

    @property
    def kind(self) -> str:
        """The key of `[expected_failures]`: `cmd` for any `cmd:<command>`."""
        return "cmd" if self.spec.startswith("cmd:") else self.spec

    @property
    def under_test(self) -> bool:
        return self.command is not None

    def as_json(self) -> dict[str, Any]:
        """run.json `client` (docs/ledgers.md)."""
        impl = self.implementation or (
            {"name": "lab", "version": __version__} if not self.under_test else None
        )
        return {
            "kind": self.kind,
            "spec": "cmd" if self.kind == "cmd" else self.spec,
            "adapter": None if self.command is None else self.command.name,
            "implementation": impl,
            "expected_failures": list(self.expected_failures),
            "baseline": self.baseline,
        }


def resolve(spec: str | None, scenario: Scenario, baseline: Path | None) -> ClientUnderTest:
    """The run's client and its known failures (ClientRefused when it cannot run here)."""
    from lab.checker import REGISTRY, unknown_ids

    chosen = spec or scenario.load.client
    command = None
    if chosen != "lab":
        try:
            command = adapter_command(chosen)
        except (AdapterUnavailable, ValueError) as e:
            raise ClientRefused(str(e)) from None
    kind = "cmd" if chosen.startswith("cmd:") else chosen
    if baseline is not None:
        try:
            table = load_baseline(baseline)
        except ScenarioError as e:
            raise ClientRefused(f"--baseline: {e}") from None
        source, where = str(baseline), str(baseline)
    else:
        table, source, where = dict(scenario.expected_failures), "scenario", str(scenario.path)
    expected = tuple(table.get(kind, ()))
    bad = unknown_ids(expected)
    if bad:
        raise ClientRefused(
            f"{where}: expected_failures.{kind}: {', '.join(map(repr, bad))} name no gate or check "
            f"(known: {', '.join(REGISTRY.ids())})"
        )
    return ClientUnderTest(chosen, command, expected, source if kind in table else None)


ADAPTER_CWD_ENV = "LAB_ADAPTER_CWD"
"""Where a worker starts its adapter: the folder `lab run` was started in (the parts run in
the run folder), so a `cmd:` adapter's relative paths mean what they meant to the user."""


def worker_env(client: ClientUnderTest) -> dict[str, str]:
    """What a Locust worker needs to start the same adapter `lab run` checked: the folder
    it was started in, and where the TypeScript SDK is installed (absolute)."""
    if client.command is None:
        return {}
    return {ADAPTER_CWD_ENV: os.getcwd(), NODE_DIR_ENV: str(node_dir())}


ERAS_SPOKEN: dict[str, frozenset[str]] = {
    "python-sdk": BOTH_ERAS,
    "typescript-sdk": frozenset({"handshake"}),
}
"""The protocol eras each bundled adapter speaks (docs/clients.md): the TypeScript SDK's
`Client` asks for 2025-11-25 only. A `cmd:` adapter is the user's to say (not checked)."""


def check_era(client: ClientUnderTest, era: str) -> None:
    """ClientRefused when the client's adapter does not speak an era the run asks for."""
    spoken = ERAS_SPOKEN.get(client.kind)
    if spoken is None or eras_of(era) <= spoken:
        return
    raise ClientRefused(
        f"--client {client.spec} speaks the {' and '.join(sorted(spoken))} era only, and the run asks for "
        f'era = "{era}" (docs/eras.md): run it with --era handshake, or choose a client that speaks '
        "the modern era (python-sdk, or the lab's own)"
    )


def probe(client: ClientUnderTest) -> ClientUnderTest:
    """Start the adapter once and read its `ready` line; ClientRefused if it never says it."""
    if client.command is None:
        return client
    with tempfile.TemporaryDirectory(prefix="lab-adapter-probe-") as tmp:
        log = Path(tmp) / "app.jsonl"
        try:
            adapter = AdapterProcess(client.command, log, key=secrets.token_bytes(32), die_with_parent=True)
        except AdapterUnavailable as e:
            raise ClientRefused(str(e)) from None
        try:
            ready = adapter.wait_ready(PROBE_TIMEOUT_S)
        except AdapterFailed as e:
            raise ClientRefused(f"the {client.spec} adapter did not start: {e}") from None
        finally:
            adapter.stop(timeout=10)
    impl = ready.get("implementation")
    return ClientUnderTest(
        client.spec,
        client.command,
        client.expected_failures,
        client.baseline,
        impl if isinstance(impl, dict) else None,
    )


def adapters_of(run_dir: Path) -> list[dict[str, Any]]:
    """Each worker's adapter as its application log's `ready` line says: file, pid,
    adapter, implementation (a log that cannot be read says why)."""
    out = []
    for path in sorted(run_dir.glob(APP_LOG_GLOB)):
        entry: dict[str, Any] = {"log": str(path.relative_to(run_dir))}
        try:
            first = next((r for r in read_app_log(path) if r["ev"] == "ready"), None)
        except (OSError, ValueError) as e:
            entry["error"] = str(e)
        else:
            if first is None:
                entry["error"] = "no `ready` line"
            else:
                entry |= {k: first[k] for k in ("pid", "adapter", "implementation")}
        out.append(entry)
    return out


def _running(pid: int, argv: tuple[str, ...]) -> bool:
    """Whether PID still runs the adapter's command line (not a process that reused the number)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.rstrip(b"\0").split(b"\0") == [a.encode() for a in argv]


def stop_leftovers(adapters: list[dict[str, Any]], command: AdapterCommand, grace: float = 5.0) -> list[int]:
    """SIGTERM (then SIGKILL) by PID every adapter of this run still alive; the PIDs it had to stop."""
    pids = [a["pid"] for a in adapters if isinstance(a.get("pid"), int)]
    alive = [pid for pid in pids if _running(pid, command.argv)]
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(p, command.argv) for p in alive):
        time.sleep(0.1)
    for pid in alive:
        if _running(pid, command.argv):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return alive
