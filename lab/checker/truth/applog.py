"""The application logs of a client under test (`clients/app-*.jsonl`, mcpLabAppLog.v1,
docs/clients.md): what each implementation delivered to the application and how each
call ended, read into one frame.

Read like every other ledger: a line that is not a record of the contract (an unknown
`ev`, a missing field) refuses the whole file, named (`SourceInfo` status error, a
`Problem`), because a verdict must not rest on half a file; a last line without its
newline (an adapter killed mid-write) is dropped with a note. Each row keeps `_src`
(the index of its file in `AppLogs.files`) and `_line` (1-based), so witnesses can
point at it: `clients/app-0.jsonl:<line>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lab.checker.context import Context, text_ids
from lab.checker.explain import present
from lab.checker.inputs.load import MissingInput, RunData
from lab.checker.model import Problem, SourceInfo
from lab.sut.protocol import RECORD_FIELDS, SCHEMA

APP_LOG_GLOB = "clients/app-*.jsonl"
COLUMNS = (
    "ev",
    "t",
    "client",
    "session",
    "kind",
    "id",
    "method",
    "call",
    "digest",
    "status",
    "error",
    "code",
    "elapsed_s",
    "text",
    "implementation",
    "pid",
)


@dataclass(slots=True)
class AppLogs:
    records: pd.DataFrame
    """Every record of every readable log, in file order (columns COLUMNS, `_src`, `_line`)."""
    files: list[str] = field(default_factory=list)
    """Paths relative to the run folder; `_src` indexes this list."""
    sources: list[SourceInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of(self, ev: str) -> pd.DataFrame:
        return self.records[self.records["ev"] == ev]

    def implementations(self) -> list[str]:
        """`name version` of each adapter's `ready` line, once each."""
        out = []
        for impl in self.of("ready")["implementation"].tolist():
            if isinstance(impl, Mapping):
                text = f"{impl.get('name', '?')} {impl.get('version', '?')}"
                if text not in out:
                    out.append(text)
        return out


def app_logs(ctx: Context) -> AppLogs:
    """The run's application logs (read once per check); MissingInput when none is readable."""
    logs = ctx.cached("app_logs", lambda: load_app_logs(ctx.data))
    if not logs.files or all(s.status != "ok" for s in logs.sources):
        why = "; ".join(f"{p.path}: {p.message}" for p in logs.problems) or f"no {APP_LOG_GLOB}"
        raise MissingInput(f"no application log of the client under test could be read ({why})")
    return logs


def load_app_logs(data: RunData) -> AppLogs:
    frames: list[pd.DataFrame] = []
    logs = AppLogs(pd.DataFrame(columns=[*COLUMNS, "_src", "_line"]))
    for path in sorted(data.run_dir.glob(APP_LOG_GLOB)):
        rel = str(path.relative_to(data.run_dir))
        try:
            rows, notes = _read(path.read_bytes(), rel)
        except OSError as e:
            _refuse(logs, rel, f"cannot be read ({e.strerror or e})")
            continue
        except ValueError as e:
            _refuse(logs, rel, str(e))
            continue
        src = len(logs.files)
        logs.files.append(rel)
        logs.notes += notes
        frame = pd.DataFrame.from_records(rows, columns=[*COLUMNS, "_line"]) if rows else None
        if frame is not None:
            frame["_src"] = src
            frames.append(frame)
        counts = frame["ev"].value_counts().to_dict() if frame is not None else {}
        logs.sources.append(
            SourceInfo(rel, "app_log", SCHEMA, "ok", rows={str(k): int(v) for k, v in counts.items()})
        )
    if frames:
        records = pd.concat(frames, ignore_index=True)
        for name in records.columns:
            if isinstance(records[name].dtype, pd.StringDtype):
                records[name] = records[name].astype(object)
        records["id"] = text_ids(records["id"])  # JSON-RPC ids as text, as the tap's
        logs.records = records
    return logs


def _refuse(logs: AppLogs, rel: str, message: str) -> None:
    logs.sources.append(SourceInfo(rel, "app_log", SCHEMA, "error", error=message))
    logs.problems.append(Problem(rel, message))


def _read(data: bytes, rel: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of one log, each checked against the contract (ValueError names the line)."""
    notes = []
    lines = data.split(b"\n")
    if lines and lines[-1].strip():
        notes.append(f"{rel}: the last line is cut off (the adapter stopped mid-line); it was ignored")
    rows: list[dict[str, Any]] = []
    for n, raw in enumerate(lines[:-1], 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"line {n}: not a JSON line ({e})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"line {n}: a record is a JSON object")
        ev = rec.get("ev")
        fields = RECORD_FIELDS.get(ev) if isinstance(ev, str) else None
        if fields is None:
            raise ValueError(f"line {n}: 'ev' {ev!r} is not a record of {SCHEMA}")
        missing = [f for f in fields if f not in rec]
        if missing or not isinstance(rec.get("t"), int | float):
            what = f"missing {', '.join(missing)}" if missing else "'t' is not a number"
            raise ValueError(f"line {n}: {ev}: {what} ({SCHEMA})")
        if ev == "ready" and rec.get("schema") != SCHEMA:
            raise ValueError(f"line {n}: ready: schema {rec.get('schema')!r} is not {SCHEMA}")
        rec["_line"] = n
        rows.append(rec)
    return rows, notes


def app_ref(logs: AppLogs, row: Mapping[str, Any] | pd.Series, prefix: str = "") -> list[str]:
    """`clients/app-<worker>.jsonl:<line>` of an application-log row."""
    src, line = row.get(f"{prefix}_src"), row.get(f"{prefix}_line")
    if not (
        isinstance(src, int | float) and isinstance(line, int | float) and present(src) and present(line)
    ):
        return []
    if not 0 <= int(src) < len(logs.files):
        return []
    return [f"{logs.files[int(src)]}:{int(line)}"]
