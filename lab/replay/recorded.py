"""What a finished run did, read back from its folder for a replay.

The scenario comes from the file the run was made from (`run.json` `scenario_file`):
run.json keeps the scenario without its bearer tokens, which a replay needs. The clients'
operations come from the client ledger (`clients/*.sqlite`, table `operations`); a client
under test (`lab run --client ...`) keeps no such ledger (its record is the application
log, `clients/app-<worker>.jsonl`), so its operations come from the proxy tap instead
(`tap_operations`): its tool calls, as the proxy saw them. The fault firings come from
`fault_triggers.jsonl` (written by `lab report`), or from the checker when the run was
never reported. The client itself is run.json's `client` (`recorded_client`).
"""

from __future__ import annotations

import json
import sqlite3
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.faults.pins import client_of
from lab.load.settings import TOOL_OF_OP, ClientScript

OPERATION_OF_TOOL = {tool: op for op, tool in TOOL_OF_OP.items()}
"""The lab client's tools, as the scenario's operations name them (lab.load.settings)."""
TAP = "proxy/tap.jsonl"


class ReplayError(Exception):
    """The run cannot be replayed: the message says why (exit 3)."""


@dataclass(frozen=True)
class Recorded:
    run_dir: Path
    run: dict[str, Any]
    scenario_path: Path
    scenario: dict[str, Any]
    """The scenario file as TOML data (tokens and all)."""
    scripts: tuple[ClientScript, ...]
    """Each client of the run: its ID and its operations with their start (s since the run's zero)."""
    triggers: tuple[dict[str, Any], ...]
    """fault_triggers.jsonl's rows, in its order (`line` numbers them from 1)."""
    report: dict[str, Any] | None
    """report.json, if the run was reported."""

    @property
    def run_id(self) -> str:
        return str(self.run.get("run_id") or self.run_dir.name)

    @property
    def client(self) -> str:
        """Who the run's clients were, as `lab run --client` takes it (`recorded_client`)."""
        try:
            return recorded_client(self.run, self.scenario)
        except ReplayError as e:
            raise ReplayError(f"{self.run_dir}: {e}") from None

    @property
    def target(self) -> str | None:
        """The run's target as `lab run --target` takes it: `reference`, or its URL."""
        target = self.run.get("target") or {}
        return "reference" if target.get("kind") == "reference" else target.get("url")


def recorded_client(run: dict[str, Any], scenario: dict[str, Any]) -> str:
    """The run's client as `lab run --client` takes it: `lab`, `python-sdk`,
    `typescript-sdk` or `cmd:<command>`, from run.json `client` (`spec`; a run.json of
    before that dict: the string itself, or nothing: the lab's own). run.json keeps no
    `cmd:` adapter's command (only `cmd`): it is the scenario file's `[load] client`, or
    the run cannot be replayed with it."""
    about = run.get("client")
    spec = str((about.get("spec") or about.get("kind") if isinstance(about, dict) else about) or "lab")
    if spec != "cmd":
        return spec
    load = scenario.get("load")
    command = str(load.get("client") or "") if isinstance(load, dict) else ""
    if command.startswith("cmd:"):
        return command
    raise ReplayError(
        "its clients were a `cmd:` adapter given with `lab run --client`, and run.json does not keep "
        'its command: put it in the scenario file as [load] client = "cmd:..." to replay it'
    )


def read_recorded(run_dir: Path) -> Recorded:
    if not (run_dir / "run.json").is_file():
        raise ReplayError(f"{run_dir}: not a run folder (no run.json)")
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReplayError(f"{run_dir / 'run.json'}: unreadable ({e})") from None
    if not isinstance(run, dict):
        raise ReplayError(f"{run_dir / 'run.json'}: not a JSON object")
    path = Path(str(run.get("scenario_file") or ""))
    if not path.is_file():
        raise ReplayError(
            f"{run_dir}: the scenario file it was made from is gone ({path or 'not recorded'}); a replay "
            "needs it (run.json keeps the scenario without its bearer tokens)"
        )
    try:
        scenario = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReplayError(f"{path}: unreadable as TOML ({e})") from None
    report = read_json_object(run_dir / "report.json")
    return Recorded(
        run_dir, run, path, scenario, tuple(read_scripts(run_dir, run)), tuple(read_triggers(run_dir)), report
    )


def read_scripts(run_dir: Path, run: dict[str, Any]) -> list[ClientScript]:
    """Each client's operations in the order they started, from every worker's ledger;
    from the proxy tap when the ledgers hold none (a client under test keeps none)."""
    zero = float(run.get("started_at") or 0.0)
    ops = ledger_operations(run_dir, zero)
    if not ops:
        ops = tap_operations(run_dir, zero)
    if not ops:
        raise ReplayError(
            f"{run_dir}: no operation to replay: no client ledger (clients/*.sqlite) holds one, and the "
            f"proxy tap ({TAP}) has no tool call of a client"
        )
    scripts = []
    for client, done in ops.items():
        done.sort(key=lambda op: op[0])  # stable: a tie keeps the order they were read in
        scripts.append(ClientScript(client, tuple(op for _, op in done), tuple(at for at, _ in done)))
    scripts.sort(key=lambda s: (s.at[:1] or (0.0,), s.id))
    return scripts


def ledger_operations(run_dir: Path, zero: float) -> dict[str, list[tuple[float, str]]]:
    """client -> [(start s since `zero`, op)], from the client ledgers' `operations` (the
    lab's own clients), in the order they started."""
    ops: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
    for path in sorted((run_dir / "clients").glob("*.sqlite")):
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = db.execute(
                    "SELECT client_id, tool, started_at FROM operations ORDER BY started_at"
                ).fetchall()
            finally:
                db.close()
        except sqlite3.Error as e:
            raise ReplayError(f"{path}: the client ledger cannot be read ({e})") from None
        for client, tool, started in rows:
            op = OPERATION_OF_TOOL.get(str(tool))
            if op is not None and started is not None:
                ops[str(client)].append((max(0.0, round(float(started) - zero, 3)), op))
    return dict(ops)


def tap_operations(run_dir: Path, zero: float) -> dict[str, list[tuple[float, str]]]:
    """client -> [(start s since `zero`, op)], from the proxy tap's `tools/call` flows: what
    a client under test called, as the proxy saw it.

    The client is the flow's `conn` (`x-lab-conn`) before its last `:`; a flow without one
    is no lab client's. One operation per idempotency key (a client under test's call ID,
    lab.load.sut_user.call_id), the first time the proxy saw it: a request sent again
    with the same key (a retry) is the same operation. In the order the requests reached
    the proxy (`t_request`; `t`, when the answer passed, for a tap without it), then the
    tap's line. Tools that are no operation of a script (anything but echo, ticker and
    ledger.append) are left out."""
    calls: list[tuple[float, int, str, str, str]] = []
    for line, flow in tap_flows(run_dir, b'"tools/call"'):
        if flow.get("jsonrpc_method") != "tools/call":
            continue
        client = client_of(str(flow.get("conn") or ""))
        op = OPERATION_OF_TOOL.get(str(flow.get("tool")))
        when = _number(flow.get("t_request"))
        when = _number(flow.get("t")) if when is None else when
        if not client or op is None or when is None:
            continue
        key = flow.get("idempotency_key")
        # A call without a key cannot be told from its retries: each request counts.
        calls.append((when, line, client, str(key) if key is not None else f"line {line}", op))
    calls.sort(key=lambda c: (c[0], c[1]))
    ops: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for when, _, client, key, op in calls:
        if (client, key) in seen:
            continue
        seen.add((client, key))
        ops[client].append((max(0.0, round(when - zero, 3)), op))
    return dict(ops)


def tap_flows(run_dir: Path, containing: bytes = b'"flow"') -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) of each `flow` record of the run's proxy tap whose line contains
    `containing` (a cheap filter before the JSON: most lines are SSE events). The tap
    writes a flow record whole, on one line (only `sent` events have a short form,
    lab.checker.inputs.tap_forms); a line that is not JSON (the last one of a proxy
    that was killed mid-write) is skipped. No tap: nothing."""
    try:
        f = (run_dir / TAP).open("rb")
    except OSError:
        return
    with f:
        for line, raw in enumerate(f, 1):
            if containing not in raw:
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("type") == "flow":
                yield line, record


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_triggers(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "fault_triggers.jsonl"
    if path.is_file():
        rows = []
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows
    return triggers_of(run_dir)


def triggers_of(run_dir: Path) -> list[dict[str, Any]]:
    """Every firing of a run the checker reads (a run not reported: no fault_triggers.jsonl)."""
    from lab.checker import fault_triggers_jsonl, load_run

    return [json.loads(line) for line in fault_triggers_jsonl(load_run(run_dir)).splitlines()]


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON file's object (report.json); None when it is missing, unreadable or no object."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
