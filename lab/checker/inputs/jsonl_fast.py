"""The fast path of `read_jsonl`: a piece of a JSON-lines ledger decoded straight into
typed records, then into columns.

msgspec decodes each line into a small struct of the record's type (the contract's
fields, plus the ones writers are known to add: `KNOWN_EXTRA_FIELDS`; absent ones read as `msgspec.UNSET`) instead of a dict,
which halves the time of a tap's reading. It only applies to a piece where every line
is a well-formed record of a known type with no field beyond those, no contract field
missing, and no other `schema` declared: anything else makes `decode_piece` answer None,
and the piece is read by the general path (`lab.checker.inputs.jsonl`), which reads what
it can and names what it cannot. Both paths give the same columns: a known extra field
that no record of the piece has is not a column of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, reduce
from operator import attrgetter, or_
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from lab.checker.inputs import tap_forms
from lab.checker.inputs.columns import TextPool, column_array, concat_pieces

KNOWN_EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    "flow": (
        "stream",
        "session_out",
        "tool",
        "protocol_version_in",
        "protocol_version_out",
        "auth_in",
        "auth_out",
        "t_request",
        "cut",
        "origin_rewritten",
        "replica",
    ),
    "sent": ("retry", "method", tap_forms.SHORT_FORWARD),
    "plan": ("version", "seed", "run_start", "rules"),
    "result": ("index",),
    "fault": ("replica",),
    # The nemesis log (lab.nemesis.log): every change record has the same fields.
    **dict.fromkeys(
        ("proxy_created", "proxy_deleted", "toxic_added", "toxic_removed"),
        ("listen", "upstream", "toxic", "kind", "stream", "toxicity", "attributes"),
    ),
    "toxic_outcome": ("detail",),
}
"""Fields beyond the contract's that the lab's own writers put in records (read as
columns when present). A field not listed sends its piece to the general path."""

_SCHEMA = "schema"


@cache
def _decoder(record_fields: tuple[tuple[str, tuple[str, ...]], ...]) -> msgspec.json.Decoder[Any]:
    types = []
    for kind, required in record_fields:
        extra = [f for f in KNOWN_EXTRA_FIELDS.get(kind, ()) if f not in required]
        types.append(
            msgspec.defstruct(
                f"_{kind}",
                [
                    *((name, Any) for name in required),
                    *((name, Any, msgspec.UNSET) for name in extra),
                    (_SCHEMA, Any, None),
                ],
                tag_field="type",
                tag=kind,
                kw_only=True,
                forbid_unknown_fields=True,
            )
        )
    union: Any = reduce(or_, types)
    return msgspec.json.Decoder(list[union])


def decode_piece(
    joined: bytes,
    first_line: int,
    record_fields: Mapping[str, tuple[str, ...]],
    schema: str,
    short_forms: bool,
    line_column: str,
    pool: TextPool | None = None,
) -> tuple[dict[str, dict[str, np.ndarray]], int] | None:
    """(the piece's columns by record type, with the 1-based line of each row in
    `line_column`; its number of records), or None when the piece needs the general path.
    `joined` is the piece's lines as one JSON array; they are consecutive lines of the
    file from `first_line` on."""
    key = tuple(record_fields.items())
    try:
        records = _decoder(key).decode(joined)
    except (msgspec.DecodeError, RecursionError):
        return None
    count = len(records)
    by_type: dict[str, list[Any]] = {}
    lines: dict[str, list[int]] = {}
    for number, record in enumerate(records, start=first_line):
        tag = type(record).__name__[1:]
        by_type.setdefault(tag, []).append(record)
        lines.setdefault(tag, []).append(number)
    del records
    out: dict[str, dict[str, np.ndarray]] = {}
    for kind, rows in by_type.items():
        names = [n for n in type(rows[0]).__struct_fields__ if n != _SCHEMA]
        declared = list(map(attrgetter(_SCHEMA), rows))
        if any(d is not None and d != schema for d in declared):
            return None  # the general path names the line
        columns: dict[str, np.ndarray] = {"type": np.full(len(rows), kind, dtype=object)}
        required = record_fields[kind]
        for name in names:
            values = list(map(attrgetter(name), rows))
            if name not in required:
                unset = values.count(msgspec.UNSET)
                if unset == len(values):
                    continue  # a known extra field no record of the piece has
                if unset:
                    values = [None if v is msgspec.UNSET else v for v in values]
            if name == tap_forms.SHORT_FORWARD:
                columns[name] = np.fromiter(values, dtype=object, count=len(values))  # as written
            else:
                columns[name] = column_array(values, pool)
        columns[line_column] = np.asarray(lines[kind], dtype=np.int64)
        out[kind] = columns
    if short_forms:
        _short_forms(out, line_column, pool)
    return out, count


def _short_forms(out: dict[str, dict[str, np.ndarray]], line: str, pool: TextPool | None) -> None:
    """Expand `sent` records' short forms into `forwarded` rows, and read `source` as
    `src_flow`/`src_index` (what `tap_forms` does record by record)."""
    fwd = out.get("forwarded")
    if fwd is not None and tap_forms.SOURCE in fwd:
        sources = fwd.pop(tap_forms.SOURCE).tolist()
        fwd["src_flow"] = column_array(
            [s.get("flow") if isinstance(s, dict) else None for s in sources], pool
        )
        fwd["src_index"] = column_array([s.get("index") if isinstance(s, dict) else None for s in sources])
    sent = out.get("sent")
    if sent is None or tap_forms.SHORT_FORWARD not in sent:
        return
    index = sent.pop(tap_forms.SHORT_FORWARD)
    short = ~pd.isna(index)
    if not short.any():
        return
    n = int(short.sum())
    nulls = np.full(n, None, dtype=object)
    expanded = {
        "type": np.full(n, "forwarded", dtype=object),
        "flow": sent["flow"][short],
        "t": sent["t"][short],
        "index": column_array(index[short].tolist()),
        "event_id": sent["event_id"][short],
        "digest": sent["digest"][short],
        "src_flow": sent["flow"][short],
        "src_index": sent["index"][short],
        "fault": nulls,
        "rule": nulls,
        "decision": nulls,
        line: sent[line][short],
    }
    if fwd is None:
        out["forwarded"] = expanded
        return
    # Rows in line order, as the general path gives them; each column typed as if read whole.
    order = np.argsort(np.concatenate([fwd[line], expanded[line]]), kind="stable")
    out["forwarded"] = {
        name: concat_pieces([(len(fwd[line]), fwd.get(name)), (n, expanded.get(name))])[order]
        for name in dict.fromkeys([*fwd, *expanded])
    }
