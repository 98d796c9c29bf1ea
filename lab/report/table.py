"""The report's blocks and tables, below every block that builds them (`lab.report.sections`,
`lab.report.unanswered_block`): a section as a `Block` of lines and `Table`s, a typed
column spec (`Column`) that turns records into a table's rows, the cell formatters the
blocks share (`num`, `pct`, `secs`), and the markdown rendering of blocks for report.md.
report.html renders the same `Block`s with its template, so both show the same cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

NONE = "—"
"""The cell for a value that is not known (or not applicable)."""


@dataclass(frozen=True)
class Table:
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass(frozen=True)
class Block:
    id: str
    title: str
    lines: Sequence[str] = ()
    tables: Sequence[Table] = field(default_factory=tuple)


@dataclass(frozen=True)
class Column[R]:
    """One column of a table built from records of type `R`: its title, and its cell."""

    title: str
    cell: Callable[[R], str]


def table[R](columns: Sequence[Column[R]], records: Iterable[R], caption: str = "") -> Table:
    """A table with a row per record, a cell per column."""
    return Table([c.title for c in columns], [[c.cell(r) for c in columns] for r in records], caption)


def num(value: Any, fmt: str = "{:g}", none: str = NONE) -> str:
    """A number as `fmt` shows it, a flag as yes/no, anything else as its text."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return fmt.format(value)
    return str(value)


def pct(value: Any) -> str:
    """A share (0..1) as a percentage with two decimals."""
    return NONE if value is None else f"{value:.2%}"


def secs(value: Any) -> str:
    """A duration in seconds, to the millisecond."""
    return num(value, "{:.3f} s")


def md_cell(text: object) -> str:
    """A table cell's text as markdown: a `|` escaped, a line break made a space."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(t: Table) -> list[str]:
    """A table as markdown lines: its caption, its header, its rows, then a blank line."""
    out = [t.caption, ""] if t.caption else []
    out.append("| " + " | ".join(md_cell(c) for c in t.columns) + " |")
    out.append("|" + " --- |" * len(t.columns))
    out += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in t.rows]
    out.append("")
    return out


def markdown(bs: Sequence[Block]) -> list[str]:
    """report.md's sections: each block's title, its lines, then its tables."""
    out: list[str] = []
    for b in bs:
        out += [f"## {b.title}", ""]
        out += [f"{line}  " for line in b.lines if line]
        if b.lines:
            out.append("")
        for t in b.tables:
            out += markdown_table(t)
    return out
