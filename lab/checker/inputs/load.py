"""Loading a run folder into pandas, file by file, without ever raising on a bad file.

`load_run(run_dir)` reads (layout and fields: docs/ledgers.md):

    run.json                  -> RunData.run            (dict, mcpLabRun.v1)
    clients/*.sqlite          -> RunData.client[table]  (all workers concatenated)
    server/ledger.sqlite      -> RunData.server[table]
    proxy/tap.jsonl           -> RunData.tap[type]      (one frame per record type)
    nemesis.jsonl             -> RunData.nemesis        (one frame, a `type` column)

Every file ends up in `RunData.sources` as ok, missing or error; an error (unreadable,
corrupted, unknown schema, a field the contract requires is absent, a run.json field of
the wrong type) is also a `Problem` naming the file. A source in error is treated as
absent by the gates, which then say which file they could not use, and the run cannot
pass. SQLite files are opened read-only (`mode=ro`), so checking a run never changes it;
a WAL that was not checkpointed is still read. Every SQLite ledger is first checked with
`PRAGMA quick_check`: a damaged page anywhere refuses the whole file (random bytes in a
page can otherwise read as plausible rows), and any SQLite error at any depth becomes
that file's one-line reason, never an exception.

Each row keeps where it came from, so witnesses can point at their raw evidence:
`_rowid` (SQLite rowid; absent for WITHOUT ROWID tables), `_src` (client rows: the index
of the file in `RunData.client_files`) and `_line` (JSON lines: the 1-based line).

Times stay Unix epoch seconds (float); nothing is converted to datetimes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lab.checker.inputs import schemas
from lab.checker.inputs.columns import ColumnParts, TextPool
from lab.checker.inputs.jsonl import LedgerError, read_jsonl
from lab.checker.model import Problem, SourceInfo

ROWID = "_rowid"
"""The SQLite rowid of a ledger row (where the table has one)."""
SOURCE = "_src"
"""Client rows: the index of their file in `RunData.client_files`."""


class MissingInput(Exception):
    """A gate cannot be computed because an input it needs is absent or refused; the
    message says which file and why. The gate is then inconclusive."""


@dataclass(slots=True)
class RunData:
    run_dir: Path
    run: dict[str, Any] | None = None
    client: dict[str, pd.DataFrame] | None = None
    client_files: list[str] = field(default_factory=list)
    client_tables_absent: set[str] = field(default_factory=set)
    server: dict[str, pd.DataFrame] | None = None
    tap: dict[str, pd.DataFrame] | None = None
    nemesis: pd.DataFrame | None = None
    sources: list[SourceInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def source_errors(self, kind: str) -> list[SourceInfo]:
        return [s for s in self.sources if s.kind == kind and s.status == "error"]

    def why_absent(self, kind: str) -> str:
        """A phrase saying why a source cannot be used (for inconclusive verdicts)."""
        errors = self.source_errors(kind)
        if errors:
            return "; ".join(f"{s.path}: {s.error}" for s in errors)
        names = {
            "client": schemas.CLIENTS_GLOB,
            "server": schemas.SERVER_FILE,
            "tap": schemas.TAP_FILE,
            "nemesis": schemas.NEMESIS_FILE,
            "run": schemas.RUN_FILE,
        }
        return f"{names.get(kind, kind)} is missing"

    def client_table(self, table: str) -> pd.DataFrame:
        """A client ledger table over every readable worker file; `MissingInput` if there
        is no readable client ledger or no worker file has the table."""
        if self.client is None:
            raise MissingInput(f"no client ledger could be read ({self.why_absent('client')})")
        if table in self.client_tables_absent:
            raise MissingInput(f"no client ledger has a table '{table}'")
        return self.client[table]

    def tap_records(self, kind: str) -> pd.DataFrame:
        if self.tap is None:
            raise MissingInput(f"no proxy record ({self.why_absent('tap')})")
        return self.tap[kind]


def as_object_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as plain object columns. pandas 3 reads text as its `str` dtype,
    which without pyarrow is stored as Python objects anyway but compares and tests for
    null element by element in Python; the checker's joins are several times faster on
    object columns (C loops), and nothing here needs the `str` dtype's semantics."""
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.StringDtype):
            frame[name] = frame[name].astype(object)
    return frame


def load_run(run_dir: Path) -> RunData:
    data = RunData(run_dir=run_dir)
    pool: TextPool = {}  # one object per distinct text across the ledgers (freed on return)
    _load_run_json(data)
    _load_clients(data, pool)
    _load_server(data, pool)
    _load_tap(data, pool)
    _load_nemesis(data, pool)
    return data


def _fail(data: RunData, rel: str, kind: str, schema: str, message: str) -> None:
    data.sources.append(SourceInfo(rel, kind, schema, "error", message))
    data.problems.append(Problem(rel, message))


def _load_run_json(data: RunData) -> None:
    rel = schemas.RUN_FILE
    path = data.run_dir / rel
    if not path.exists():
        data.sources.append(SourceInfo(rel, "run", schemas.RUN_SCHEMA, "missing"))
        data.problems.append(
            Problem(rel, "missing: budgets fall back to the defaults, and the run cannot pass")
        )
        return
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        _fail(data, rel, "run", schemas.RUN_SCHEMA, f"cannot be read ({e})")
        return
    except json.JSONDecodeError as e:
        _fail(data, rel, "run", schemas.RUN_SCHEMA, f"is not JSON (line {e.lineno}: {e.msg})")
        return
    except RecursionError:
        _fail(data, rel, "run", schemas.RUN_SCHEMA, "is nested too deeply to be read")
        return
    if not isinstance(run, dict):
        _fail(data, rel, "run", schemas.RUN_SCHEMA, "is not a JSON object")
        return
    if run.get("schema") != schemas.RUN_SCHEMA:
        _fail(
            data,
            rel,
            "run",
            schemas.RUN_SCHEMA,
            f"unknown schema {run.get('schema')!r} (the checker reads {schemas.RUN_SCHEMA})",
        )
        return
    wrong = schemas.run_json_errors(run)
    if wrong:
        # Kept (the budgets and times that are well-formed are still used), but the run's
        # own record cannot be trusted: the run cannot pass.
        data.run = run
        _fail(data, rel, "run", schemas.RUN_SCHEMA, "; ".join(wrong))
        return
    data.run = run
    data.sources.append(SourceInfo(rel, "run", schemas.RUN_SCHEMA, "ok"))


# ---------------------------------------------------------------------------- SQLite

_DAMAGE_ERRORS = (sqlite3.Error, OSError)
"""What reading a damaged or vanished SQLite file can raise, at any depth."""


def _open_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _quick_check(db: sqlite3.Connection, rel: str) -> None:
    """Refuse a file with any damaged page (b-tree structure, cell bounds, row order)."""
    try:
        rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise  # not SQLite at all: said as such by the caller
        raise LedgerError(rel, f"is damaged (PRAGMA quick_check: {_why(e)})") from e
    if rows != [("ok",)]:
        first = " ".join(str(rows[0][0]).split()) if rows else "no answer"
        raise LedgerError(rel, f"is damaged (PRAGMA quick_check: {first[:200]})")


def _check_meta(db: sqlite3.Connection, rel: str, known: frozenset[str]) -> str | None:
    """The schema name the file declares (None if it declares none); refuse unknown ones."""
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if has_meta is None:
        return None
    declared = None
    marks = ",".join("?" for _ in schemas.META_NAMES)
    query = f"SELECT name, value FROM meta WHERE name IN ({marks})"
    for name, value in db.execute(query, schemas.META_NAMES):
        if value not in known:
            raise LedgerError(rel, f"meta {name}={value!r} is a schema the checker does not know")
        declared = declared or str(value)
    return declared


def _read_tables(
    db: sqlite3.Connection, rel: str, tables: Mapping[str, tuple[str, ...]], pool: TextPool | None
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Read the contract's columns of every table; (frames, absent table names)."""
    master = {
        row[0]: row[1] or "" for row in db.execute("SELECT name, sql FROM sqlite_master WHERE type='table'")
    }
    frames: dict[str, pd.DataFrame] = {}
    absent: list[str] = []
    for table, columns in tables.items():
        if table not in master:
            absent.append(table)
            continue
        have = {row[1] for row in db.execute(f'PRAGMA table_info("{table}")')}
        missing = [c for c in columns if c not in have]
        if missing:
            raise LedgerError(rel, f"table '{table}' lacks column(s) {', '.join(missing)}")
        extra = [c for c in schemas.OPTIONAL_COLUMNS.get(table, ()) if c in have]
        cols = ", ".join(f'"{c}"' for c in (*columns, *extra))
        if "WITHOUT ROWID" not in master[table].upper() and ROWID not in have:
            cols = f'rowid AS "{ROWID}", {cols}'
        frames[table] = _read_table(db, f'SELECT {cols} FROM "{table}"', pool)
    return frames, absent


SQLITE_PIECE_ROWS = 50_000
"""Rows turned into columns at once (their tuples are the transient cost of reading)."""


def _read_table(db: sqlite3.Connection, query: str, pool: TextPool | None = None) -> pd.DataFrame:
    """A table's rows as a frame, read in pieces (`lab.checker.inputs.columns`): about
    three times quicker than `pandas.read_sql_query`, and its repeated text held once."""
    cursor = db.execute(query)
    names = [d[0] for d in cursor.description]
    parts = ColumnParts(pool)
    while rows := cursor.fetchmany(SQLITE_PIECE_ROWS):
        parts.add_tuples(rows, names)
    return parts.frame(names)


def _read_sqlite(
    path: Path, rel: str, kind: str, tables: Mapping[str, tuple[str, ...]], pool: TextPool | None = None
) -> tuple[dict[str, pd.DataFrame], list[str], str | None]:
    try:
        db = _open_ro(path)
    except _DAMAGE_ERRORS as e:
        raise LedgerError(rel, f"cannot be opened ({_why(e)})") from e
    try:
        _quick_check(db, rel)
        declared = _check_meta(db, rel, schemas.KNOWN_META_SCHEMAS[kind])
        frames, absent = _read_tables(db, rel, tables, pool)
        if kind == "client" and ("inbox" in absent or "outbox" in absent):
            # lab.inbox creates both when it opens the file: without them it is not ours.
            raise LedgerError(rel, "has no inbox/outbox tables: not a client ledger")
    except _DAMAGE_ERRORS as e:
        # "file is not a database", "database disk image is malformed", ...
        raise LedgerError(rel, f"is not a readable SQLite database ({_why(e)})") from e
    finally:
        db.close()
    return frames, absent, declared


def _why(e: BaseException) -> str:
    """One line: the innermost SQLite message."""
    inner: BaseException = e
    while inner.__cause__ is not None and not isinstance(inner, sqlite3.Error):
        inner = inner.__cause__
    text = str(inner) if isinstance(inner, sqlite3.Error) else str(e)
    return " ".join(text.split())[:200] or type(e).__name__


def _load_clients(data: RunData, pool: TextPool | None = None) -> None:
    paths = sorted(data.run_dir.glob(schemas.CLIENTS_GLOB))
    if not paths:
        data.sources.append(SourceInfo(schemas.CLIENTS_GLOB, "client", schemas.CLIENT_SCHEMA, "missing"))
        return
    per_table: dict[str, list[pd.DataFrame]] = {t: [] for t in schemas.CLIENT_TABLES}
    absent_everywhere = set(schemas.CLIENT_TABLES)
    readable = 0
    for path in paths:
        rel = str(path.relative_to(data.run_dir))
        try:
            frames, absent, declared = _read_sqlite(path, rel, "client", schemas.CLIENT_TABLES, pool)
        except LedgerError as e:
            _fail(data, rel, "client", schemas.CLIENT_SCHEMA, e.message)
            continue
        readable += 1
        source = len(data.client_files)
        data.client_files.append(rel)
        for table, frame in frames.items():
            frame[SOURCE] = source
            per_table[table].append(frame)
        absent_everywhere -= set(frames)
        if absent:
            data.notes.append(f"{rel} has no table(s) {', '.join(absent)}: read as empty")
        rows = {t: len(f) for t, f in frames.items()}
        schema = declared or schemas.CLIENT_SCHEMA
        data.sources.append(SourceInfo(rel, "client", schema, "ok", rows=rows))
    if readable == 0:
        return
    data.client = {}
    for table, columns in schemas.CLIENT_TABLES.items():
        parts = [f for f in per_table[table] if len(f)]
        data.client[table] = (
            pd.concat(parts, ignore_index=True)
            if len(parts) > 1
            else (parts[0] if parts else pd.DataFrame(columns=list(columns)))
        )
    data.client_tables_absent = absent_everywhere


def _load_server(data: RunData, pool: TextPool | None = None) -> None:
    rel = schemas.SERVER_FILE
    path = data.run_dir / rel
    if not path.exists():
        data.sources.append(SourceInfo(rel, "server", schemas.SERVER_SCHEMA, "missing"))
        return
    try:
        frames, absent, declared = _read_sqlite(path, rel, "server", schemas.SERVER_TABLES, pool)
    except LedgerError as e:
        _fail(data, rel, "server", schemas.SERVER_SCHEMA, e.message)
        return
    if absent:
        # One writer makes every table of this file: a missing one means another schema.
        _fail(
            data,
            rel,
            "server",
            schemas.SERVER_SCHEMA,
            f"has no table(s) {', '.join(absent)}: not an {schemas.SERVER_SCHEMA} ledger",
        )
        return
    data.server = frames
    rows = {t: len(f) for t, f in frames.items()}
    data.sources.append(SourceInfo(rel, "server", declared or schemas.SERVER_SCHEMA, "ok", rows=rows))


# ---------------------------------------------------------------------------- JSON lines


def check_numeric(frames: Mapping[str, pd.DataFrame], rel: str) -> None:
    for kind, frame in frames.items():
        for name in schemas.NUMERIC_FIELDS.intersection(frame.columns):
            column = frame[name]
            if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
                continue
            coerced = pd.to_numeric(column, errors="coerce")
            bad = coerced.isna() & column.notna()
            if bad.any():
                example = column[bad].iloc[0]
                raise LedgerError(rel, f"field '{name}' of a '{kind}' record is not a number: {example!r}")
            frame[name] = coerced


def _read_jsonl_source(
    data: RunData, rel: str, kind: str, records: Any, schema: str, pool: TextPool | None = None
) -> dict[str, pd.DataFrame] | None:
    """Read one JSON-lines ledger of the run; None (and the reason in `data`) if it is
    missing or refused."""
    path = data.run_dir / rel
    if not path.exists():
        data.sources.append(SourceInfo(rel, kind, schema, "missing"))
        return None
    try:
        read = read_jsonl(path, rel, records, schema, pool)
        check_numeric(read.frames, rel)
    except LedgerError as e:
        _fail(data, rel, kind, schema, e.message)
        return None
    data.notes.extend(read.notes)
    rows = {t: len(f) for t, f in read.frames.items()}
    data.sources.append(SourceInfo(rel, kind, schema, "ok", rows=rows))
    return read.frames


def _load_tap(data: RunData, pool: TextPool | None = None) -> None:
    data.tap = _read_jsonl_source(
        data, schemas.TAP_FILE, "tap", schemas.TAP_RECORDS, schemas.TAP_SCHEMA, pool
    )


def _load_nemesis(data: RunData, pool: TextPool | None = None) -> None:
    frames = _read_jsonl_source(
        data, schemas.NEMESIS_FILE, "nemesis", schemas.NEMESIS_RECORDS, schemas.NEMESIS_SCHEMA, pool
    )
    if frames is None:
        return
    parts = [f.assign(type=kind) for kind, f in frames.items() if len(f)]
    data.nemesis = (
        pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["type", "t", "kind"])
    )
