"""What every gate shares: the budgets, the run's event count, the client-ledger evidence,
and a cache for the joins several gates use.

Budgets come from run.json `budgets` (docs/ledgers.md). Where run.json does not give
one, the default (docs/report.md) is used and the name is listed in `Budgets.defaulted` (reported);
the reconnect QPS budget has no default (it is "the configured budget"), so without it gate
6 is inconclusive. Evidence minima without a value default to 1 (at least one), except
`min_events`, which defaults to the gate table's 100,000 events. A minimum given as 0 is used as 1 by
the gates: no evidence is never a pass ("0 of 0" is inconclusive, whatever the scenario).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from lab.checker.inputs.load import RunData
from lab.checker.model import Evidence, Scalar
from lab.wire.budgets import GATE_EVENTS, SPEC_BUDGETS
from lab.wire.revisions import ERAS, MODERN_REVISIONS, eras_of

SPEC_DEFAULTS: dict[str, float | int] = {
    **SPEC_BUDGETS,
    "min_events": GATE_EVENTS,
    "min_recoveries": 1,
    "min_404": 1,
    "min_illegal_origin": 1,
}
INTEGER_BUDGETS = frozenset(
    {
        "cross_stream_max",
        "duplicate_dispatch_max",
        "missing_rehandshake_max",
        "min_events",
        "min_recoveries",
        "min_404",
        "min_illegal_origin",
    }
)


@dataclass(frozen=True, slots=True)
class Budgets:
    reconnect_qps: float | None
    resume_p99_s: float
    cross_stream_max: int
    duplicate_dispatch_max: int
    missing_rehandshake_max: int
    origin_reject_rate: float
    min_events: int
    min_recoveries: int
    min_404: int
    min_illegal_origin: int
    defaulted: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    """Names whose run.json value was not a usable number (the default was used)."""

    def as_dict(self) -> dict[str, Scalar]:
        return {name: getattr(self, name) for name in ("reconnect_qps", *SPEC_DEFAULTS)}


def parse_budgets(run: dict[str, Any] | None) -> Budgets:
    given = run.get("budgets") if run is not None else None
    raw: dict[str, Any] = given if isinstance(given, dict) else {}
    values: dict[str, Any] = {}
    defaulted: list[str] = []
    invalid: list[str] = []
    for name in ("reconnect_qps", *SPEC_DEFAULTS):
        value = raw.get(name)
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is not None and math.isfinite(number) and number >= 0:
            values[name] = int(number) if name in INTEGER_BUDGETS else float(number)
            continue
        if value is not None:
            invalid.append(name)
        values[name] = SPEC_DEFAULTS.get(name)
        defaulted.append(name)
    return Budgets(**values, defaulted=tuple(defaulted), invalid=tuple(invalid))


@dataclass(slots=True)
class Context:
    data: RunData
    budgets: Budgets
    witness_limit: int = 5
    _cache: dict[str, Any] = field(default_factory=dict)

    def cached[T](self, name: str, make: Callable[[], T]) -> T:
        """Compute a shared join once; an exception is cached too, so every gate that
        needs a broken join reports the same error."""
        if name not in self._cache:
            try:
                self._cache[name] = make()
            except Exception as e:
                self._cache[name] = e
        hit = self._cache[name]
        if isinstance(hit, Exception):
            raise hit
        return cast(T, hit)

    def eras(self) -> frozenset[str]:
        """The protocol eras the run tested (docs/eras.md): run.json `target.era`
        (`handshake`, `modern`, or `both`); where run.json does not say (a client under
        test, an older run), the wire's: a flow carrying a modern revision in
        `MCP-Protocol-Version` is the modern era's, any other the handshake era's."""
        return self.cached("eras", self._eras)

    def _eras(self) -> frozenset[str]:
        target = (self.data.run or {}).get("target")
        said = target.get("era") if isinstance(target, dict) else None
        if said in ERAS:
            return eras_of(str(said))
        flows = None if self.data.tap is None else self.data.tap["flow"]
        if flows is None or not len(flows) or "protocol_version_in" not in flows.columns:
            return frozenset({"handshake"})
        versions = flows["protocol_version_in"].astype("object")
        modern = versions.isin(MODERN_REVISIONS)
        found = ({"modern"} if modern.any() else set()) | ({"handshake"} if (~modern).any() else set())
        return frozenset(found)

    def event_count(self) -> tuple[int | None, str]:
        """(count, source): SSE events carrying a message that the server sent, as the tap
        saw them (`sent`, has_data true, priming false); without a tap, the server
        ledger's non-priming `events_sent` rows; (None, "none") without either."""
        return self.cached("event_count", self._count_events)

    def _count_events(self) -> tuple[int | None, str]:
        data = self.data
        if data.tap is not None:
            sent = data.tap["sent"]
            has_data = sent["has_data"].fillna(False).astype(bool)
            priming = sent["priming"].fillna(False).astype(bool)
            return int((has_data & ~priming).sum()), "tap"
        if data.server is not None:
            events = data.server["events_sent"]
            return int((events["kind"] != "priming").sum()), "server"
        return None, "none"

    def events_evidence(self) -> Evidence:
        count, source = self.event_count()
        need = max(1, self.budgets.min_events)  # no event at all is no evidence, whatever the budget
        if count is None:
            return Evidence(
                "events",
                need,
                None,
                False,
                "no event count: neither the proxy's record (tap) nor the server ledger could be read",
            )
        said = {"tap": "as the proxy recorded them", "server": "as the server ledger records them"}
        return Evidence(
            "events", need, count, count >= need, f"SSE events with a message the server sent, {said[source]}"
        )

    def client_evidence(self) -> list[Evidence]:
        """Every worker's client ledger was readable (else the clients of a broken file
        are unchecked and the gate cannot pass)."""
        broken = self.data.source_errors("client")
        if not broken:
            return []
        names = ", ".join(s.path for s in broken)
        return [Evidence("client ledgers readable", True, False, False, f"unreadable: {names}")]

    def require_client(self, table: str) -> pd.DataFrame:
        return self.data.client_table(table)

    @property
    def origin(self) -> float | None:
        """The run's start (epoch s), the zero of `T+` times in explanations."""
        run = self.data.run or {}
        started = run.get("started_at")
        return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else None

    @property
    def stopped_at(self) -> float | None:
        run = self.data.run or {}
        stopped = run.get("stopped_at")
        return float(stopped) if isinstance(stopped, int | float) and not isinstance(stopped, bool) else None


KEY_SEP = "|"


def text_key(*columns: pd.Series) -> pd.Series:
    """One text key per row: the columns' values joined by `|`, null written as `-`.

    Joins of the checker match rows on several columns at once (session, stream, event
    ID, digest); a single key column makes that a hash lookup. Built with a plain list
    comprehension: several times faster than adding pandas string columns, which
    dominated the check of large runs.
    """
    parts = []
    for column in columns:
        values = column.to_numpy(dtype=object)
        missing = pd.isna(values)
        if missing.any():
            values = np.where(missing, "-", values)
        # str() only where needed: most key columns already hold strings.
        parts.append(values.tolist() if _all_text(column) else list(map(str, values)))
    joined = parts[0] if len(parts) == 1 else [KEY_SEP.join(row) for row in zip(*parts, strict=True)]
    return pd.Series(joined, index=columns[0].index, dtype="object")


def group_codes(*columns: pd.Series) -> np.ndarray:
    """One integer per row, the same for rows whose values are equal in every column (a
    null equals a null, and no value). Sorting and grouping on these is several times
    faster than on text keys or on object columns; they say nothing across two calls."""
    key = np.zeros(len(columns[0]), dtype="int64")
    for column in columns:
        codes, uniques = pd.factorize(column.to_numpy(dtype=object), use_na_sentinel=True)
        # Re-coded after each column, so the product stays below rows x uniques (no overflow).
        key = pd.factorize(key * (len(uniques) + 1) + (codes + 1))[0].astype("int64")
    return key


def rows_in(left: Sequence[pd.Series], right: Sequence[pd.Series]) -> np.ndarray:
    """For each row of the `left` columns, whether a row of the `right` columns holds the
    same values, column for column (a null matches a null). The test `in_keys` makes on
    `text_key`s, without building a text per row: for large frames several times faster."""
    n = len(left[0])
    if n == 0 or len(right[0]) == 0:
        return np.zeros(n, dtype=bool)
    joint = [
        pd.Series(np.concatenate([a.to_numpy(dtype=object), b.to_numpy(dtype=object)]))
        for a, b in zip(left, right, strict=True)
    ]
    key = group_codes(*joint)
    return np.isin(key[:n], key[n:])


def _all_text(column: pd.Series) -> bool:
    return column.dtype == object and bool(
        pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty")
    )


def in_keys(keys: pd.Series, known: pd.Series | set[str]) -> pd.Series:
    """keys.isin(known), with a Python set (faster than pandas' on object strings)."""
    pool = known if isinstance(known, set) else set(known.tolist())
    return pd.Series([k in pool for k in keys.tolist()], index=keys.index, dtype=bool)


def text_ids(values: pd.Series) -> pd.Series:
    """JSON-RPC IDs as text, the way the client writes them (`post:7`, jsonrpc_id "7"):
    a JSON number read back as a float (7.0, pandas' doing when a column has nulls)
    becomes "7"; strings stay as they are; null stays null."""

    def one(value: object) -> str | None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    return values.map(one).astype("object")


def split_conn(conn: pd.Series) -> tuple[pd.Series, pd.Series]:
    """`x-lab-conn` = "<client-id>:<conn-id>" -> (client_id, conn_id as a nullable int).
    The client ID may itself contain ':' so the split is at the last one."""
    # A list comprehension: pandas' `.str.rpartition` took a tenth of a gate run's report.
    missing = pd.isna(conn.to_numpy(dtype=object))
    parts = [
        ("", "", "") if gone else str(value).rpartition(":")
        for value, gone in zip(conn.tolist(), missing.tolist(), strict=True)
    ]
    client = pd.Series([head if sep else np.nan for head, sep, _ in parts], index=conn.index, dtype="object")
    tails = pd.Series([tail if sep else np.nan for _, sep, tail in parts], index=conn.index, dtype="object")
    number = pd.to_numeric(tails, errors="coerce").astype("Int64")
    return client, number
