"""Small helpers that turn ledger rows into witness rows and one-line explanations."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.model import Scalar


def scalar(value: Any) -> Scalar:
    """A JSON-ready scalar: numpy numbers become Python ones, NaN/NA/inf become None."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def row_of(row: Mapping[str, Any] | pd.Series, names: Iterable[str]) -> dict[str, Scalar]:
    return {name: scalar(row[name]) for name in names if name in row}


def finite_or_none(value: float) -> float | None:
    """A figure for report.json: infinity and NaN (no value) become null."""
    return value if math.isfinite(value) else None


def short(digest: Any, n: int = 12) -> str:
    return "?" if digest is None or (isinstance(digest, float) and math.isnan(digest)) else str(digest)[:n]


def present(value: Any) -> bool:
    return not (value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)))


def at(t: Any, origin: float | None) -> str:
    """A time as `T+12.345 s` from the run's start (or epoch seconds without one)."""
    if not present(t):
        return "at an unknown time"
    t = float(t)
    if origin is None:
        return f"at {t:.3f}"
    return f"at T+{t - origin:.3f} s"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def who(subject: Any) -> str:
    """The authenticated subject behind a server ledger row, in words ("-" or none: there
    was none, the request carried no bearer token)."""
    return (
        "not authenticated" if not present(subject) or subject in ("", "-") else f"authenticated as {subject}"
    )


def token(auth: Any) -> str:
    """The bearer token (its pseudonym `t_…`) a request carried, in words ("-" or none: it
    carried none)."""
    return "no bearer token" if not present(auth) or auth in ("", "-") else f"bearer token {auth}"


def short_reason(reason: object, limit: int = 160) -> str:
    """The first line of run.json's end_reason, cut to `limit` characters (an `error: …`
    reason can hold a whole usage message; report.json keeps it whole)."""
    first = str(reason or "unknown").strip().splitlines()[0] if reason else "unknown"
    return first if len(first) <= limit else first[: limit - 1] + "…"


# ---------------------------------------------------------------------------- refs
# Where a witness's raw evidence is in the run folder (docs/report.md, "refs").


def _int(value: Any) -> int | None:
    if not present(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def client_ref(
    files: Sequence[str], table: str, row: Mapping[str, Any] | pd.Series, prefix: str = ""
) -> list[str]:
    """`clients/<file>#<table>/<rowid>` of a client ledger row (`prefix`: of the merged-in
    columns, e.g. "next_"); [] when the row does not say where it came from."""
    src, rowid = _int(row.get(f"{prefix}_src")), _int(row.get(f"{prefix}_rowid"))
    if src is None or rowid is None or not 0 <= src < len(files):
        return []
    return [f"{files[src]}#{table}/{rowid}"]


def server_ref(table: str, row: Mapping[str, Any] | pd.Series, prefix: str = "") -> list[str]:
    rowid = _int(row.get(f"{prefix}_rowid"))
    return [] if rowid is None else [f"server/ledger.sqlite#{table}/{rowid}"]


def tap_ref(row: Mapping[str, Any] | pd.Series, prefix: str = "") -> list[str]:
    line = _int(row.get(f"{prefix}_line"))
    return [] if line is None else [f"proxy/tap.jsonl:{line}"]


def fault_refs(decisions: Iterable[Any]) -> list[str]:
    return [f"fault:{d}" for d in dict.fromkeys(decisions) if present(d) and str(d)]


def spread_head(frame: pd.DataFrame, limit: int, column: str = "check") -> pd.DataFrame:
    """The first `limit` rows, but the first row of each kind (`column`) before any second
    one: a gate failing on several checks shows a witness of each, not `limit` of the
    commonest (a reader, and `lab selftest`, look for a particular check)."""
    if len(frame) <= limit or column not in frame.columns:
        return frame.head(limit)
    rank = frame.groupby(column, sort=False).cumcount()
    order = np.lexsort((np.arange(len(frame)), rank.to_numpy()))
    return frame.iloc[np.sort(order[:limit])]
