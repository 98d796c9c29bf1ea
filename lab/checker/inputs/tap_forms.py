"""The tap's short forms, expanded at read time: the one place that knows them.

An SSE event the proxy forwarded untouched, at once, as the server sent it has no
`forwarded` record of its own: its `sent` record carries `"fwd": N` (N its index among
the events forwarded on the flow) and stands for both (docs/ledgers.md, *Proxy tap*).
Every reader of the tap (the checker's `read_jsonl` and `run_data_from_records`, tests
reading a tap file) expands it here into exactly the `forwarded` record the proxy wrote
before the short form existed, on the same line of the file.

The checker reads a `forwarded` record's `source` (`{"flow", "index"}`: the sent event
it carries) as two columns, `src_flow` and `src_index` (`flatten_source`): a dict per
row cost more memory than the rest of the row together.
"""

from __future__ import annotations

from typing import Any, Final

SHORT_FORWARD: Final = "fwd"
"""The field of a `sent` record that stands for its untouched `forwarded` record."""
SOURCE: Final = "source"
SOURCE_COLUMNS: Final = ("src_flow", "src_index")
"""The columns a `forwarded` record's `source` is read into."""


def expand(record: dict[str, Any]) -> dict[str, Any] | None:
    """The `forwarded` record a `sent` record's short form stands for (None: it has none).

    Removes the short-form field from `record`, which then reads as the `sent` record of
    the long form."""
    if record.get("type") != "sent" or SHORT_FORWARD not in record:
        return None
    index = record.pop(SHORT_FORWARD)
    if index is None:
        return None
    return {
        "type": "forwarded",
        "flow": record.get("flow"),
        "t": record.get("t"),
        "index": index,
        "event_id": record.get("event_id"),
        "digest": record.get("digest"),
        "source": {"flow": record.get("flow"), "index": record.get("index")},
        "fault": None,
        "rule": None,
        "decision": None,
    }


def flatten_source(record: dict[str, Any]) -> None:
    """A `forwarded` record's `source` as `src_flow` and `src_index` (in place). A record
    without `source` keeps lacking it (the contract check then names the field)."""
    if SOURCE not in record:
        return
    source = record.pop(SOURCE)
    if isinstance(source, dict):
        record["src_flow"] = source.get("flow")
        record["src_index"] = source.get("index")
    else:
        record["src_flow"] = record["src_index"] = None


def as_read(record: dict[str, Any]) -> dict[str, Any] | None:
    """A tap record as the checker reads it (in place: a `forwarded` record's `source` in
    two columns), and the `forwarded` record a `sent` short form stands for, read the same
    way (None: it stands for none)."""
    if record.get("type") == "forwarded":
        flatten_source(record)
    extra = expand(record)
    if extra is not None:
        flatten_source(extra)
    return extra


def columns_of(kind: str, field: str) -> tuple[str, ...]:
    """The frame columns a contract field of a tap record of type `kind` is read into."""
    return SOURCE_COLUMNS if (kind, field) == ("forwarded", SOURCE) else (field,)


def expand_all(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records in file order, each short form followed by the record it stands for."""
    out: list[dict[str, Any]] = []
    for r in records:
        out.append(r)
        extra = expand(r)
        if extra is not None:
            out.append(extra)
    return out
