"""docs/faults.md's reference sections, generated from the registry of fault kinds.

    .venv/bin/python -m lab.faults.docs --check    # exit 1 if docs/faults.md is stale
    .venv/bin/python -m lab.faults.docs --write    # regenerate the sections in place

The page's prose (how the addon runs, the plan, decisions) is written by hand; every part
that says what a kind is — the table of kinds, their parameters, the order hooks run in —
sits between `<!-- BEGIN <name> ... -->` and `<!-- END <name> -->` markers and comes
from `lab.faults.kinds`. A test fails when the page and the registry disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lab.faults.kinds import REGISTRY, FaultKind, Unit
from lab.faults.kinds.base import Evidence, params_docs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "faults.md"
GATES = {
    1: "1 crossings",
    2: "2 duplicates",
    3: "3 404s",
    4: "4 Origins",
    5: "5 recoveries",
    6: "6 reconnects",
    15: "15 modern requests",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def kinds_table() -> list[str]:
    rows = [
        "| # | kind | family | unit | applies to | what it does | evidence in the tap | gate evidence | needs | eras |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in REGISTRY.values():
        evidence = ", ".join(f"`{e}`" for e in k.evidence)
        gates = ", ".join(GATES[g] for g in sorted(k.feeds)) or "—"
        if k.breaks_streams:
            gates += " (breaks streams)"
        needs = ", ".join(str(n) for n in sorted(k.needs)) or "—"
        cells = [
            str(k.number),
            f"`{k.name}`",
            k.family,
            str(k.unit),
            k.applies_to,
            k.summary,
            evidence,
            gates,
            needs,
            _eras_cell(k),
        ]
        rows.append("| " + " | ".join(_cell(c) if i > 1 else c for i, c in enumerate(cells)) + " |")
    rows += [
        "",
        "Evidence: " + "; ".join(f"`{e}` — {_EVIDENCE[e]}" for e in Evidence) + ".",
    ]
    return rows


def _eras_cell(k: FaultKind[Any]) -> str:
    """The eras a kind has meaning in, and why not the other."""
    if k.not_modern is not None:
        return f"handshake only: {k.not_modern}"
    if k.only_modern is not None:
        return f"modern only: {k.only_modern}"
    return "both"


_EVIDENCE = {
    Evidence.FLOW: "an entry of the `faults` list of the flow's `flow` record",
    Evidence.FORWARDED: "a `forwarded` record whose `fault` is set",
    Evidence.DROPPED: "a `dropped` record",
    Evidence.FAULT: "a `fault` record (the proxy's own HTTP call, with its `detail`)",
}


def params_tables() -> list[str]:
    rows: list[str] = []
    for k in REGISTRY.values():
        docs = params_docs(k.params_type)
        if not docs:
            continue
        rows += [f"`{k.name}`:", "", "| param | expected | default | meaning |", "| --- | --- | --- | --- |"]
        rows += [f"| `{d.name}` | {d.expected} | {d.default} | {_cell(d.doc)} |" for d in docs]
        rows.append("")
    kinds = ", ".join(f"`{k.name}`" for k in REGISTRY.values() if not params_docs(k.params_type))
    rows.append(f"No parameters: {kinds}.")
    return rows


def order() -> list[str]:
    flow = sorted(
        (k for k in REGISTRY.values() if k.unit is Unit.FLOW), key=lambda k: (not k.answers_alone, k.number)
    )
    event = sorted((k for k in REGISTRY.values() if _acts_on_events(k)), key=lambda k: k.event_order)
    return [
        "On a request, flow-level rules are tried in the order "
        + ", ".join(f"`{k.name}`" for k in flow)
        + " (a storm answers a request alone; the other request faults can combine).",
        "Per SSE event, the kinds that act on events run in the order "
        + ", ".join(f"`{k.name}`" for k in event)
        + "; a cut or a drop ends the event's turn.",
    ]


def _acts_on_events(k: FaultKind[Any]) -> bool:
    return type(k).on_event is not FaultKind.on_event


SECTIONS: dict[str, Callable[[], list[str]]] = {"kinds": kinds_table, "params": params_tables, "order": order}


def _markers(name: str) -> tuple[str, str]:
    begin = f"<!-- BEGIN {name}: generated from lab/faults/kinds by `python -m lab.faults.docs --write` -->"
    return begin, f"<!-- END {name} -->"


def render(page: str) -> str:
    """`page` with every generated section replaced by what the registry says now."""
    for name, make in SECTIONS.items():
        begin, end = _markers(name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(page):
            raise ValueError(f"docs/faults.md has no section {name!r} (markers: {begin} ... {end})")
        body = "\n".join([begin, *make(), end])
        page = pattern.sub(lambda _m: body, page)  # noqa: B023 (used at once, in this iteration)
    return page


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab.faults.docs", description=(__doc__ or "").splitlines()[0]
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    mode.add_argument("--write", action="store_true", help="regenerate the sections in place")
    args = ap.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    fresh = render(current)
    if args.write:
        PAGE.write_text(fresh, encoding="utf-8")
        print(f"wrote {PAGE}")
        return 0
    if fresh != current:
        print(f"{PAGE} is out of date: run `python -m lab.faults.docs --write`", file=sys.stderr)
        return 1
    print(f"{PAGE} matches the registry of fault kinds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
