"""Reading JSON-lines ledgers (the proxy tap, the nemesis log) fast, in bounded memory,
and refusing bad ones.

The file is read in pieces of `PIECE_BYTES` cut at line ends. Each piece is parsed with
one decoder call (its lines joined into one JSON array; msgspec's decoder, about 2.4
times quicker than `json.loads` on the tap) and turned into columns at once
(`lab.checker.inputs.columns`), so reading holds the columns and one piece, never the
file's records as Python dicts. Only when a piece does not parse does it go line by
line, to name the first bad line.

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

import msgspec
import pandas as pd

from lab.checker.inputs import jsonl_fast, tap_forms
from lab.checker.inputs.columns import ColumnParts, TextPool
from lab.checker.inputs.schemas import TAP_SCHEMA

PIECE_BYTES = 8 << 20
"""How much of a JSON-lines file is parsed at once (a piece holds whole lines: a longer
line is read whole). About 25,000 tap records; their dicts are the transient cost."""

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
    path: Path,
    rel: str,
    record_fields: Mapping[str, tuple[str, ...]],
    schema: str,
    pool: TextPool | None = None,
) -> JsonlFrames:
    """Read `path` into frames by `type`; raise `LedgerError` naming `rel` if it is bad.
    Text is taken from `pool` (`lab.checker.inputs.columns.TextPool`) when one is given."""
    reader = _Reader(rel, record_fields, schema, pool)
    try:
        with path.open("rb") as f:
            carry = b""
            while block := f.read(PIECE_BYTES):
                data = carry + block if carry else block
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if cut:
                    reader.piece(data[:cut])
    except OSError as e:
        raise LedgerError(rel, f"cannot be read ({e.strerror or e})") from e
    tail = carry.strip()
    if tail:
        try:
            json.loads(tail)
            reader.piece(tail + b"\n")
        except ValueError:
            reader.notes.append(
                f"{rel}: the last line is cut off (the writer stopped mid-line); it was ignored"
            )
        except RecursionError as e:
            raise LedgerError(rel, f"line {reader.line} is nested too deeply to be read") from e
    return reader.result()


class _Reader:
    """The pieces of one file, as they are read: their columns by record type."""

    def __init__(
        self, rel: str, record_fields: Mapping[str, tuple[str, ...]], schema: str, pool: TextPool | None
    ) -> None:
        self.rel = rel
        self.record_fields = record_fields
        self.schema = schema
        self.pool = pool
        self.parts = {kind: ColumnParts(pool) for kind in record_fields}
        self.skipped: Counter[str] = Counter()
        self.records = 0
        self.line = 1
        """The number of the next piece's first line."""
        self.notes: list[str] = []

    def piece(self, body: bytes) -> None:
        """Whole lines (ending with a newline)."""
        if not self._fast(body):
            objects, first_line = _parse(body, self.rel, self.line)
            self.records += len(objects)
            by_type, skipped = _group(objects, self.rel, self.record_fields, self.schema, first_line)
            del objects
            self.skipped.update(skipped)
            for kind, rows in by_type.items():
                self.parts[kind].add_dicts(rows)
        self.line += body.count(b"\n")

    def _fast(self, body: bytes) -> bool:
        array = _as_array(body, self.line)
        if array is None:
            return True
        decoded = jsonl_fast.decode_piece(
            *array,
            self.record_fields,
            self.schema,
            self.schema == TAP_SCHEMA,
            LINE,
            self.pool,
        )
        if decoded is None:
            return False
        columns, count = decoded
        self.records += count
        for kind, piece in columns.items():
            self.parts[kind].add_columns(piece)
        return True

    def result(self) -> JsonlFrames:
        if self.skipped:
            kinds = ", ".join(f"{n} '{kind}'" for kind, n in sorted(self.skipped.items()))
            self.notes.append(f"{self.rel}: skipped records of types {self.schema} does not define: {kinds}")
        frames: dict[str, pd.DataFrame] = {}
        for kind, required in self.record_fields.items():
            columns = [c for name in required for c in tap_forms.columns_of(kind, name)]
            frame = self.parts[kind].frame([*columns, LINE])
            missing = [
                name
                for name in required
                if not all(c in frame.columns for c in tap_forms.columns_of(kind, name))
            ]
            if missing:
                raise LedgerError(
                    self.rel, f"'{kind}' records lack field(s) {', '.join(missing)} ({self.schema})"
                )
            frames[kind] = frame
        return JsonlFrames(frames, self.records, self.notes)


def _parse(body: bytes, rel: str, first: int = 1) -> tuple[list[Any], int]:
    """(the records, the line number of the first one when they are not `_Numbered`);
    `first` is the number of the first line of `body` in its file."""
    array = _as_array(body, first)
    if array is None:
        return [], first
    try:
        parsed = msgspec.json.decode(array[0])
        if isinstance(parsed, list):
            return parsed, array[1]
    except (msgspec.DecodeError, RecursionError):
        pass  # named line by line, with the standard library's words
    return _parse_lines(body, rel, first), first


def _as_array(body: bytes, first: int) -> tuple[bytes, int] | None:
    """(the lines of `body` as one JSON array, the number of its first record's line);
    None for blank lines only. `first`: the number of `body`'s first line in its file.
    JSON strings cannot hold a raw newline, so every newline separates records (a blank
    line inside makes ",,", which does not parse: such a piece is read line by line)."""
    stripped = body.strip()
    if not stripped:
        return None
    leading = body[: len(body) - len(body.lstrip())].count(b"\n")
    return b"[" + stripped.replace(b"\n", b",") + b"]", first + leading


def _parse_lines(body: bytes, rel: str, first: int = 1) -> list[Any]:
    objects: list[Any] = []
    for number, line in enumerate(body.split(b"\n"), start=first):
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
        if short_forms:
            extra = tap_forms.as_read(obj)  # a `sent` record that also stands for its `forwarded` one
            if extra is not None:
                extra[LINE] = number
                by_type["forwarded"].append(extra)
    return by_type, skipped
