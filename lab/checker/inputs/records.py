"""The checker's inputs built in memory, for tests that have records rather than a folder.

A Hypothesis state machine (or any test) that drives clients against a model server
holds the very records a run folder would: client ledger records, inbox receipts and
outbox dispatches, the tap records of what the server sent, server ledger rows. Instead
of re-implementing the gates over them, it builds a `RunData` here and calls the real
gates, so the property tests and `lab report` judge by the same code:

    data = run_data_from_records(run={"budgets": {...}}, client=core_records,
                                 inbox=receipts, outbox=dispatches, tap=tap_records)
    report = judge(data)                       # the whole verdict (lab.checker.judge.verdict)
    result = gate_check(data, gate_cross_stream)  # or one gate's GateResult

Every row is shaped exactly as its ledger (docs/ledgers.md) and goes through the same
contract checks as a file would: a table or record type the contract requires a field
of must have it (`LedgerError` otherwise). Rows may be mappings, dataclass instances
(the `lab.wire.client_ledger` records), or objects whose fields are dataclasses one
level deep (an inbox receipt's `key` is flattened into its columns). Missing tables are
empty. `run` is merged over a minimal valid run.json (complete, started at the first
time seen), so only the budgets usually need saying.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lab.checker.inputs import schemas, tap_forms
from lab.checker.inputs.jsonl import LINE, LedgerError
from lab.checker.inputs.load import ROWID, RunData, as_object_strings, check_numeric
from lab.checker.model import SourceInfo

IN_MEMORY = Path("<memory>")


def _flat(row: Any) -> dict[str, Any]:
    """A row as a flat dict: a mapping as is, a dataclass by its fields, with one level of
    nested dataclass/mapping values (an inbox receipt's `key`) flattened into it."""
    if isinstance(row, Mapping):
        raw = dict(row)
    elif dataclasses.is_dataclass(row) and not isinstance(row, type):
        raw = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    else:
        raise TypeError(f"a ledger row must be a mapping or a dataclass, not {type(row).__name__}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        elif isinstance(value, Mapping) and name == "key":
            out |= dict(value)
        else:
            out[name] = value
    return out


def _frame(rows: Iterable[Any], columns: tuple[str, ...], what: str) -> pd.DataFrame:
    flat = [_flat(r) for r in rows]
    if not flat:
        return pd.DataFrame(columns=list(columns))
    frame = pd.DataFrame.from_records(flat)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise LedgerError(what, f"rows lack field(s) {', '.join(missing)}")
    for name in frame.columns:
        if frame[name].dtype == bool:
            frame[name] = frame[name].astype("int64")  # SQLite has no booleans: 0/1 as a file holds
    if ROWID not in frame.columns:
        frame[ROWID] = range(1, len(frame) + 1)  # as SQLite numbers the rows of a fresh table
    return as_object_strings(frame)


def run_data_from_records(
    *,
    run: Mapping[str, Any] | None = None,
    client: Iterable[Any] = (),
    inbox: Iterable[Any] = (),
    outbox: Iterable[Any] = (),
    server: Mapping[str, Iterable[Any]] | None = None,
    tap: Iterable[Mapping[str, Any]] | None = None,
    nemesis: Iterable[Mapping[str, Any]] | None = None,
) -> RunData:
    """A `RunData` from in-memory rows (see the module docstring).

    client: `lab.wire.client_ledger` records (each goes to its `table`);
    inbox/outbox: rows of lab.inbox's `inbox`/`outbox` tables (or receipts/dispatches
    with a `key`); server: server ledger rows per table (None: no server ledger);
    tap / nemesis: JSON-lines records with their `type` (None: no such file).
    """
    data = RunData(run_dir=IN_MEMORY)
    by_table: dict[str, list[Any]] = {"inbox": list(inbox), "outbox": list(outbox)}
    for record in client:
        table = getattr(record, "table", None)
        if not isinstance(table, str) or table not in schemas.CLIENT_TABLES:
            raise TypeError(f"not a client ledger record: {record!r}")
        by_table.setdefault(table, []).append(record)
    data.client = {
        table: _frame(by_table.get(table, ()), columns, f"client {table}").assign(_src=0)
        for table, columns in schemas.CLIENT_TABLES.items()
    }
    data.client_files = ["<memory>"]
    data.sources.append(SourceInfo("<memory>", "client", schemas.CLIENT_SCHEMA, "ok"))
    if server is not None:
        data.server = {
            table: _frame(server.get(table, ()), columns, f"server {table}")
            for table, columns in schemas.SERVER_TABLES.items()
        }
        data.sources.append(SourceInfo("<memory>", "server", schemas.SERVER_SCHEMA, "ok"))
    if tap is not None:
        data.tap = _jsonl(tap, schemas.TAP_RECORDS, "tap")
        data.sources.append(SourceInfo("<memory>", "tap", schemas.TAP_SCHEMA, "ok"))
    if nemesis is not None:
        frames = _jsonl(nemesis, schemas.NEMESIS_RECORDS, "nemesis")
        parts = [f.assign(type=kind) for kind, f in frames.items() if len(f)]
        data.nemesis = (
            pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["type", "t", "kind"])
        )
    data.run = _run_json(run, data)
    data.sources.append(SourceInfo("<memory>", "run", schemas.RUN_SCHEMA, "ok"))
    return data


def _jsonl(
    records: Iterable[Mapping[str, Any]], kinds: Mapping[str, tuple[str, ...]], what: str
) -> dict[str, pd.DataFrame]:
    grouped: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for number, record in enumerate(records, start=1):
        rows = grouped.get(str(record.get("type")))
        if rows is not None:
            row = {**record, LINE: number}
            rows.append(row)
            if what != "tap":
                continue
            # As read_jsonl reads them: short forms expanded, `source` in two columns.
            extra = tap_forms.as_read(row)
            if extra is not None:
                extra[LINE] = number
                grouped["forwarded"].append(extra)
    frames = {
        kind: _frame(
            rows, tuple(c for name in kinds[kind] for c in tap_forms.columns_of(kind, name)), f"{what} {kind}"
        )
        for kind, rows in grouped.items()
    }
    check_numeric(frames, what)
    return frames


def _run_json(given: Mapping[str, Any] | None, data: RunData) -> dict[str, Any]:
    times = [
        float(f[c].min())
        for frames in (data.client or {}, data.tap or {})
        for f in frames.values()
        for c in ("t", "started_at", "accepted_at", "lost_at", "sent_at", "at")
        if c in f.columns and len(f) and pd.notna(f[c].min())
    ]
    run: dict[str, Any] = {
        "schema": schemas.RUN_SCHEMA,
        "run_id": "in-memory",
        "started_at": min(times) if times else 0.0,
        "stopped_at": None,
        "complete": True,
        "end_reason": "in_memory",
    }
    run.update(given or {})
    return run
