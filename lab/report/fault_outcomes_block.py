"""The report's section "What each fault did" (report.json `fault_outcomes`,
`lab.checker.truth.fault_outcomes`), as a block for report.md and report.html: per fault
kind, what it fired, what clients rejected because of it, the recoveries it caused and
their resume latency, the calls that did not end ok on its flows; and last the calls that
did not end ok with no injected fault at all, which tells the lab's faults from real
failures. A run without faults gets one line and no table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.report.table import NONE, Block, Column, Table, num, secs, table

TITLE = "What each fault did"

ATTRIBUTED_BY = {"flow": "its connections (tap)", "time": "its time window (nemesis)"}

HOW = (
    "Each row counts what followed on the connections the fault touched (the proxy's faults: "
    "its tap records) or while it was in place (nemesis toxics: by time only). A rejection, "
    "recovery or call counts under every fault that touched it, so rows can overlap; touched "
    "is not proof of cause. Resume p50/p99 as gate 5 takes them (never recovered = never)."
)

type _Kind = Mapping[str, Any]
"""One kind of report.json `fault_outcomes.kinds`."""


def _latency(k: _Kind, which: str) -> str:
    """A resume percentile: "never" when it lands on a recovery that never came back."""
    if k.get(f"resume_{which}_unbounded"):
        return "never"
    return secs(k.get(f"resume_{which}_s"))


def _recovered(k: _Kind) -> str:
    if k.get("recoveries") is None:
        return NONE
    censored = f" ({k['censored']} censored)" if k.get("censored") else ""
    return f"{num(k.get('recovered'))} of {num(k.get('recoveries'))}{censored}"


_COLUMNS: tuple[Column[_Kind], ...] = (
    Column[_Kind]("fault", lambda k: str(k["fault"])),
    Column[_Kind]("fired", lambda k: num(k.get("fired"))),
    Column[_Kind]("rejected by clients", lambda k: num(k.get("rejected"))),
    Column[_Kind]("recoveries caused", lambda k: num(k.get("recoveries"))),
    Column[_Kind]("recovered", _recovered),
    Column[_Kind]("resume p50", lambda k: _latency(k, "p50")),
    Column[_Kind]("resume p99", lambda k: _latency(k, "p99")),
    Column[_Kind]("calls not ok on its flows", lambda k: num(k.get("errors"))),
    Column[_Kind]("attributed by", lambda k: ATTRIBUTED_BY.get(str(k.get("attributed_by")), NONE)),
)


def _unexplained_row(fo: Mapping[str, Any]) -> list[str]:
    """The last row: what no injected fault explains (recoveries and calls)."""
    cells = [NONE] * len(_COLUMNS)
    cells[0] = "no injected fault (unexplained)"
    cells[3] = num(fo.get("recoveries_unattributed"))
    cells[7] = num(fo.get("failed_calls_unexplained"))
    return cells


def fault_outcomes_block(doc: Mapping[str, Any]) -> Block | None:
    fo = doc.get("fault_outcomes")
    if not isinstance(fo, Mapping):
        return None
    if fo.get("status") == "no_faults":
        return Block("fault_outcomes", TITLE, [str(fo.get("text", ""))])
    kinds = [k for k in fo.get("kinds") or [] if isinstance(k, Mapping)]
    rows = [*table(_COLUMNS, kinds).rows, _unexplained_row(fo)]
    lines = [str(fo.get("text", "")), HOW, *(f"Note: {n}" for n in fo.get("notes") or [])]
    return Block("fault_outcomes", TITLE, lines, [Table([c.title for c in _COLUMNS], rows)])
