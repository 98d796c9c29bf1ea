"""The raw ledger rows behind witnesses' `refs`, for report.html's appendix.

A ref names one row in the run folder (docs/report.md):
    proxy/tap.jsonl:<line>                   a line of a JSON-lines ledger
    clients/<file>#<table>/<rowid>           a row of a client ledger (SQLite rowid)
    server/ledger.sqlite#<table>/<rowid>     a row of the server ledger
    fault:<decision ID>                      a proxy fault decision (its tap records)
Each is read from the files as they are, so the appendix shows what the ledger holds,
not the checker's reading of it. A ref that cannot be read is shown with the reason.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

MAX_REFS = 200
"""At most this many raw rows in one report (witnesses are a few per check)."""
MAX_DECISION_SCAN = 64 << 20
"""A fault decision is found by scanning the tap; above this size the appendix says where
to look instead (the witness also refs the tap line the checker found it on)."""
_SQLITE_REF = re.compile(r"^(?P<file>[^#]+\.sqlite)#(?P<table>[A-Za-z_][A-Za-z0-9_]*)/(?P<rowid>\d+)$")
_LINE_REF = re.compile(r"^(?P<file>[^#:]+\.jsonl):(?P<line>\d+)$")


def raw_rows(run_dir: Path, refs: Iterable[str]) -> dict[str, str]:
    """ref -> the raw row as text (JSON), for every distinct ref (first MAX_REFS)."""
    wanted = list(dict.fromkeys(refs))[:MAX_REFS]
    out: dict[str, str] = {}
    lines: dict[str, dict[int, str]] = defaultdict(dict)
    rows: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    decisions: dict[str, str] = {}
    for ref in wanted:
        if m := _LINE_REF.match(ref):
            lines[m["file"]][int(m["line"])] = ref
        elif m := _SQLITE_REF.match(ref):
            rows[m["file"]].append((ref, m["table"], int(m["rowid"])))
        elif ref.startswith("fault:"):
            decisions[ref.removeprefix("fault:")] = ref
        else:
            out[ref] = "(not a reference this report can read)"
    for name, numbered in lines.items():
        out |= _read_lines(run_dir / name, numbered)
    for name, wanted_rows in rows.items():
        out |= _read_rows(run_dir / name, wanted_rows)
    if decisions:
        out |= _read_decisions(run_dir / "proxy" / "tap.jsonl", decisions)
    return {ref: out[ref] for ref in wanted if ref in out}


def _read_lines(path: Path, numbered: dict[int, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    last = max(numbered)
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if number in numbered:
                    out[numbered[number]] = line.decode("utf-8", "replace").rstrip("\n")
                if number >= last:
                    break
    except OSError as e:
        return dict.fromkeys(numbered.values(), f"(cannot be read: {e.strerror or e})")
    return out | {ref: "(no such line)" for ref in numbered.values() if ref not in out}


def _read_rows(path: Path, wanted: list[tuple[str, str, int]]) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        return {ref: f"(cannot be opened: {e})" for ref, _, _ in wanted}
    try:
        db.row_factory = sqlite3.Row
        for ref, table, rowid in wanted:
            try:
                row = db.execute(f'SELECT * FROM "{table}" WHERE rowid = ?', (rowid,)).fetchone()
            except sqlite3.Error as e:
                out[ref] = f"(cannot be read: {e})"
                continue
            out[ref] = "(no such row)" if row is None else json.dumps(dict(row), default=str)
    finally:
        db.close()
    return out


def _read_decisions(tap: Path, decisions: dict[str, str]) -> dict[str, str]:
    """Every tap record naming each decision (a decision fires once; it may be written as a
    flow fault and an event record)."""
    found: dict[str, list[str]] = defaultdict(list)
    needles = {d.encode(): d for d in decisions}
    try:
        if tap.stat().st_size > MAX_DECISION_SCAN:
            return {ref: f"(search proxy/tap.jsonl for {d})" for d, ref in decisions.items()}
        with tap.open("rb") as f:
            for number, line in enumerate(f, start=1):
                for needle, decision in needles.items():
                    if needle in line and len(found[decision]) < 4:
                        text = line.decode("utf-8", "replace").rstrip()
                        found[decision].append(f"proxy/tap.jsonl:{number}: {text}")
    except OSError as e:
        return dict.fromkeys(decisions.values(), f"(cannot be read: {e.strerror or e})")
    return {
        ref: "\n".join(found[d]) or "(no record of the proxy names this decision)"
        for d, ref in decisions.items()
    }
