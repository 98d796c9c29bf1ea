"""The checker's frames built column by column, one bounded piece of a ledger at a time.

A ledger is read in pieces (a few MiB of JSON lines, or some tens of thousands of SQLite
rows); each piece becomes one array per column at once, and its rows (dicts, tuples) are
dropped before the next piece is read. So reading holds the file's columns plus one
piece, never the whole file as Python objects: a 160 MB tap read as one list of dicts
peaked at over 1 GiB.

Two things keep the columns small:
- numbers, as in pandas' own inference, are numpy arrays (int64 when every value is an
  integer, float64 with NaN where one is missing), not Python objects;
- text that repeats (a flow's ID on each of its events, a client's ID on each of its
  receipts) is held once per piece: every row points at one string object. JSON and
  SQLite hand back a new string for every occurrence.

Inference follows `pandas.DataFrame.from_records` on the same rows, except that text
stays an object column (the checker's joins are several times faster on object columns
than on pandas 3's `str` dtype without pyarrow) and a value absent from a row reads as
None rather than NaN (both are null to pandas).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

SHARE_MIN_REPEAT = 2
"""Share text in a column only when its values repeat on average this often in a piece
(an event ID is unique: a lookup table of them would cost without saving)."""
SAMPLE = 2048
"""The first values of a piece's column that decide whether it repeats."""


TextPool = dict[str, str]
"""One object per distinct text across every ledger of a run (an event ID is in the tap,
the inbox and the outbox: without it, each holds its own copy). Lives while a run is
read; the frames keep the strings, not the pool."""


def column_array(values: Sequence[Any], pool: TextPool | None = None) -> np.ndarray:
    """One column of a piece, inferred as pandas infers a column of records; its text
    taken from `pool` when one is given."""
    n = len(values)
    arr = np.fromiter(values, dtype=object, count=n)
    kind = pd.api.types.infer_dtype(arr, skipna=True)
    if kind == "integer":
        if not pd.isna(arr).any():
            try:
                return arr.astype(np.int64)
            except OverflowError:
                return arr  # beyond 64 bits: kept as Python ints
        return arr.astype(np.float64)  # None -> NaN, as pandas does
    if kind in ("floating", "mixed-integer-float"):
        return arr.astype(np.float64)
    if kind == "boolean":
        return arr.astype(np.bool_) if not pd.isna(arr).any() else arr
    if kind == "string":
        return shared_strings(arr, pool)
    return arr


def shared_strings(arr: np.ndarray, pool: TextPool | None = None) -> np.ndarray:
    """`arr` (text and nulls) with every repeated text pointing at one object (and, with a
    pool, at the pool's object for that text)."""
    sample = arr[:SAMPLE]
    if len(set(sample.tolist())) * SHARE_MIN_REPEAT > len(sample):
        # Mostly distinct (event IDs, digests): a lookup table within the piece would cost
        # without saving; the pool, if any, is asked value by value.
        if pool is None:
            return arr
        values = arr.tolist()
        return np.fromiter(map(pool.setdefault, values, values), dtype=object, count=len(values))
    codes, uniques = pd.factorize(arr, use_na_sentinel=True)
    texts = np.asarray(uniques, dtype=object)
    if pool is not None:
        names = texts.tolist()
        texts = np.fromiter(map(pool.setdefault, names, names), dtype=object, count=len(names))
    out = texts.take(codes)
    missing = codes < 0
    if missing.any():
        out[missing] = arr[missing]  # None stays None, NaN stays NaN
    return out


class ColumnParts:
    """The columns of one record type (or table), gathered piece by piece."""

    __slots__ = ("_parts", "pool", "rows")

    def __init__(self, pool: TextPool | None = None) -> None:
        self._parts: list[tuple[int, dict[str, np.ndarray]]] = []
        self.pool = pool
        self.rows = 0

    def add_dicts(self, rows: list[dict[str, Any]]) -> None:
        """A piece of JSON records: every field that any of them has becomes a column."""
        if not rows:
            return
        names = list(dict.fromkeys(chain.from_iterable(rows)))
        if len(names) > 1 and set(map(len, rows)) == {len(names)}:
            # Every row has every field (the usual case): one C-level pass per piece.
            columns: Iterable[Sequence[Any]] = zip(*map(itemgetter(*names), rows), strict=True)
        else:
            columns = ([row.get(name) for row in rows] for name in names)
        self._add(
            len(rows),
            {name: column_array(values, self.pool) for name, values in zip(names, columns, strict=True)},
        )

    def add_tuples(self, rows: list[tuple[Any, ...]], names: Sequence[str]) -> None:
        """A piece of SQLite rows, in the order of `names`."""
        if not rows:
            return
        columns = zip(*rows, strict=True)
        self._add(
            len(rows),
            {name: column_array(values, self.pool) for name, values in zip(names, columns, strict=True)},
        )

    def add_columns(self, columns: dict[str, np.ndarray]) -> None:
        """A piece already in columns (of equal lengths)."""
        if columns:
            self._add(len(next(iter(columns.values()))), columns)

    def _add(self, n: int, columns: dict[str, np.ndarray]) -> None:
        self._parts.append((n, columns))
        self.rows += n

    def frame(self, columns: Iterable[str] = ()) -> pd.DataFrame:
        """The gathered rows as one frame (empty with `columns` when there are none).
        The pieces are released column by column as the frame is built."""
        if not self._parts:
            return pd.DataFrame(columns=list(columns))
        names = dict.fromkeys(name for _, part in self._parts for name in part)
        out: dict[str, pd.Series] = {}
        for name in names:
            pieces = [(n, part.pop(name, None)) for n, part in self._parts]
            column = concat_pieces(pieces)
            # The dtype said, or pandas 3 would make text columns its `str` dtype.
            out[name] = pd.Series(column, dtype=column.dtype, copy=False)
        self._parts.clear()
        return pd.DataFrame(out, copy=False)


def concat_pieces(pieces: list[tuple[int, np.ndarray | None]]) -> np.ndarray:
    """One column from its pieces, inferred as if it had been read whole: a piece without
    the column, or with only nulls in it, takes the type of the others (NaN beside
    numbers, as pandas infers [1, None] as float64)."""
    present = [a for _, a in pieces if a is not None and not _all_null(a)]
    numeric = bool(present) and all(a.dtype.kind in "iuf" for a in present)
    arrays: list[np.ndarray] = []
    for n, a in pieces:
        if a is None or (numeric and _all_null(a)):
            a = np.full(n, np.nan) if numeric else np.full(n, None, dtype=object)
        arrays.append(a)
    if len(arrays) == 1:
        return arrays[0]
    kinds = {a.dtype.kind for a in arrays}
    if len(kinds) > 1 and not kinds <= set("iuf"):
        # bool beside numbers or text: pandas makes that an object column, numpy would
        # turn True into 1.0.
        arrays = [a.astype(object) for a in arrays]
    return np.concatenate(arrays)


def _all_null(a: np.ndarray) -> bool:
    return a.dtype == object and bool(pd.isna(a).all())
