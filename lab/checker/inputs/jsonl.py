"""Reading JSON-lines ledgers (the proxy tap, the nemesis log) fast, and refusing bad ones.

The fast path parses the whole file with one `json.loads` call (the lines joined into
one JSON array), which is about three times quicker than `pandas.read_json(lines=True)`
on the tap. Only when that fails does it go line by line, to name the first bad line.

A last line without its newline is what a writer killed mid-write leaves behind (the
tap flushes line by line): if it does not parse it is dropped with a note, not treated
as corruption. Any other line that is not a JSON object, or that declares another
`schema`, makes the whole file refused (`LedgerError`): a half-read ledger would give a
verdict on evidence the checker did not see. A record whose `type` the contract does not
define (a writer may add record types before the contract lists them) is skipped and
counted in a note: nothing the gates read can hide there, since every type they read is
defined.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lab.checker.inputs import tap_forms
from lab.checker.inputs.schemas import TAP_SCHEMA

LINE = "_line"
"""The column holding each record's 1-based line number in its file (for witnesses' refs)."""


class LedgerError(Exception):
    """An input file the checker refuses. `path` is relative to the run folder."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(slots=True)
class JsonlFrames:
    """One DataFrame per record type (every known type present, possibly empty)."""

    frames: dict[str, pd.DataFrame]
    lines: int
    notes: list[str] = field(default_factory=list)


def read_jsonl(
    path: Path, rel: str, record_fields: Mapping[str, tuple[str, ...]], schema: str
) -> JsonlFrames:
    """Read `path` into frames by `type`; raise `LedgerError` naming `rel` if it is bad."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LedgerError(rel, f"cannot be read ({e.strerror or e})") from e
    notes: list[str] = []
    body, tail = _split_tail(data)
    if tail:
        try:
            json.loads(tail)
            body = body + tail + b"\n"
        except ValueError:
            notes.append(f"{rel}: the last line is cut off (the writer stopped mid-line); it was ignored")
    objects, first_line = _parse(body, rel)
    by_type, skipped = _group(objects, rel, record_fields, schema, first_line)
    if skipped:
        kinds = ", ".join(f"{n} '{kind}'" for kind, n in sorted(skipped.items()))
        notes.append(f"{rel}: skipped records of types {schema} does not define: {kinds}")
    frames: dict[str, pd.DataFrame] = {}
    for kind, required in record_fields.items():
        rows = by_type.get(kind, [])
        frame = pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=[*required, LINE])
        for name in frame.columns:  # as in lab.checker.inputs.load.as_object_strings (why: there)
            if isinstance(frame[name].dtype, pd.StringDtype):
                frame[name] = frame[name].astype(object)
        missing = [name for name in required if name not in frame.columns]
        if missing:
            raise LedgerError(rel, f"'{kind}' records lack field(s) {', '.join(missing)} ({schema})")
        frames[kind] = frame
    return JsonlFrames(frames, len(objects), notes)


def _split_tail(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, the unterminated last line or b'')."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:].strip()


def _parse(body: bytes, rel: str) -> tuple[list[Any], int]:
    """(the records, the line number of the first one when they are not `_Numbered`)."""
    stripped = body.strip()
    if not stripped:
        return [], 1
    try:
        # JSON strings cannot hold a raw newline, so every newline separates records (a
        # blank line inside makes ",," and falls back to the line-by-line path).
        parsed = json.loads(b"[" + stripped.replace(b"\n", b",") + b"]")
        if isinstance(parsed, list):
            leading = body[: len(body) - len(body.lstrip())]
            return parsed, leading.count(b"\n") + 1
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass
    return _parse_lines(body, rel), 1


def _parse_lines(body: bytes, rel: str) -> list[Any]:
    objects: list[Any] = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue  # a blank line carries nothing; tolerated
        try:
            objects.append((number, json.loads(line)))
        except RecursionError as e:
            raise LedgerError(rel, f"line {number} is nested too deeply to be read") from e
        except UnicodeDecodeError as e:
            raise LedgerError(rel, f"line {number} is not UTF-8 ({e.reason})") from e
        except ValueError as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise LedgerError(rel, f"line {number} is not JSON ({msg})") from e
    # Keep line numbers for the checks that follow.
    return [_Numbered(number, obj) for number, obj in objects]


@dataclass(frozen=True, slots=True)
class _Numbered:
    number: int
    obj: Any


def _group(
    objects: list[Any],
    rel: str,
    record_fields: Mapping[str, tuple[str, ...]],
    schema: str,
    first_line: int = 1,
) -> tuple[dict[str, list[dict[str, Any]]], Counter[str]]:
    by_type: dict[str, list[dict[str, Any]]] = {kind: [] for kind in record_fields}
    skipped: Counter[str] = Counter()
    short_forms = schema == TAP_SCHEMA
    for position, item in enumerate(objects, start=first_line):
        number, obj = (item.number, item.obj) if isinstance(item, _Numbered) else (position, item)
        if not isinstance(obj, dict):
            raise LedgerError(rel, f"line {number} is not a JSON object")
        declared = obj.get("schema")
        if declared is not None and declared != schema:
            raise LedgerError(rel, f"line {number}: schema {declared!r} is not {schema}")
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise LedgerError(rel, f"line {number} has no record type")
        rows = by_type.get(kind)
        if rows is None:
            skipped[kind] += 1
            continue
        obj[LINE] = number
        rows.append(obj)
        if short_forms:  # a `sent` record that also stands for its `forwarded` one
            extra = tap_forms.expand(obj)
            if extra is not None:
                extra[LINE] = number
                by_type["forwarded"].append(extra)
    return by_type, skipped
