"""The server ledger's batches have the outcome of writing their rows one by one: streams
that open and close within one batch keep their close (a batch grouped by statement alone
once put the last close before its own stream's insert, and lost it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.server import ledger as L


def _stream(n: int) -> tuple[Any, ...]:
    return ("s1", f"g{n}", "GET", None, None, None, float(n), None, None, None, None, None)


def _close(n: int) -> tuple[Any, ...]:
    return (10.0 + n, "abandoned", None, None, None, "s1", f"g{n}")


FIRST = [(L.INSERT_STREAM, _stream(1)), (L.INSERT_STREAM, _stream(2))]
"""Two standalone streams, committed in an earlier batch."""


def _batch() -> list[tuple[str, Sequence[Any]]]:
    """Three more at a bound of two, in one batch: each open closes the oldest first (the
    order `lab.server.state` writes them in), with an event between."""
    writes: list[tuple[str, Sequence[Any]]] = []
    for n in range(3, 6):
        writes.append((L.CLOSE_STREAM, _close(n - 2)))
        writes.append((L.INSERT_STREAM, _stream(n)))
        writes.append((L.INSERT_EVENT, ("s1", f"g{n}", f"e{n}", 0, "d", "priming", None, float(n), 0, None)))
    return writes


def _apply(path: Path, groups: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    db.executescript(L._DDL)
    with db:
        db.executemany(L.INSERT_STREAM, [row for _, row in FIRST])
    with db:
        for sql, rows in groups:
            db.executemany(sql, rows)
    got = list(db.execute("SELECT stream_id, close_reason FROM streams ORDER BY opened_at"))
    db.close()
    return got


def test_a_batch_grouped_in_order_equals_writing_it_row_by_row(tmp_path: Path) -> None:
    writes = _batch()
    one_by_one = _apply(tmp_path / "one.sqlite", [(sql, [row]) for sql, row in writes])
    assert one_by_one == [
        ("g1", "abandoned"),
        ("g2", "abandoned"),
        ("g3", "abandoned"),
        ("g4", None),
        ("g5", None),
    ]
    groups = L.group_in_order(writes)
    assert _apply(tmp_path / "grouped.sqlite", groups) == one_by_one
    # Still one executemany per table where nothing else touched it: the events in one.
    assert [sql for sql, _ in groups].count(L.INSERT_EVENT) == 1


def test_grouping_by_statement_alone_loses_a_close(tmp_path: Path) -> None:
    """The detector's bad case: the old grouping gives a different table."""
    by_statement: dict[str, list[Sequence[Any]]] = {}
    for sql, row in _batch():
        by_statement.setdefault(sql, []).append(row)
    got = _apply(tmp_path / "old.sqlite", list(by_statement.items()))
    assert ("g3", None) in got


def test_the_writer_keeps_every_close_of_a_batch(tmp_path: Path) -> None:
    ledger = L.Ledger(tmp_path / "ledger.sqlite")
    for sql, row in FIRST:
        ledger.write(sql, row)
    ledger.barrier().result(timeout=10)
    for sql, params in _batch():
        ledger.write(sql, params)
    ledger.barrier().result(timeout=10)
    ledger.close()
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    closed = [r[0] for r in db.execute("SELECT close_reason FROM streams ORDER BY opened_at")]
    db.close()
    assert closed == ["abandoned"] * 3 + [None, None]
