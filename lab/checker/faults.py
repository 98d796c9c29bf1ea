"""How many times each fault fired: proof the run tested what it claims.

Counted per fault kind, from:
    tap_flow       the `faults` list of tap `flow` records (one per fault per flow)
    tap_forwarded  tap `forwarded` records whose `fault` is set
    tap_dropped    tap `dropped` records
    tap_fault      tap `fault` records (faults that fired outside an event)
    nemesis        `toxic_added` records of nemesis.jsonl, as kind `toxic:<type>`
A kind listed in run.json `fault_windows` (the scenario configured it) that never fired
is reported in `never_fired` — a run that claims a fault it never applied.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pandas as pd

from lab.checker.load import RunData
from lab.checker.model import FaultCount


def configured_faults(run: dict[str, object] | None) -> list[tuple[str, float, float]]:
    """(fault, start, end) for every well-formed entry of run.json `fault_windows`."""
    windows = (run or {}).get("fault_windows")
    out = []
    for w in windows if isinstance(windows, list) else []:
        if not isinstance(w, dict):
            continue
        fault, start, end = w.get("fault"), w.get("start"), w.get("end")
        if isinstance(fault, str) and isinstance(start, int | float) and isinstance(end, int | float):
            out.append((fault, float(start), float(end)))
    return out


def _count(values: Iterable[object]) -> Counter[str]:
    return Counter(str(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v)))


def count_faults(data: RunData) -> tuple[list[FaultCount], list[str]]:
    """(counts per kind, configured kinds that never fired), both sorted by kind."""
    by_source: dict[str, Counter[str]] = {}
    if data.tap is not None:
        flow_faults = (
            f.get("fault")
            for faults in data.tap["flow"]["faults"]
            if isinstance(faults, list)
            for f in faults
            if isinstance(f, dict)
        )
        by_source["tap_flow"] = _count(flow_faults)
        by_source["tap_forwarded"] = _count(data.tap["forwarded"]["fault"])
        by_source["tap_dropped"] = _count(data.tap["dropped"]["fault"])
        by_source["tap_fault"] = _count(data.tap["fault"]["fault"])
    if data.nemesis is not None and len(data.nemesis):
        added = data.nemesis[data.nemesis["type"] == "toxic_added"]
        by_source["nemesis"] = _count(f"toxic:{k}" for k in added["kind"])
    configured = {fault for fault, _, _ in configured_faults(data.run)}
    kinds = set().union(*(c.keys() for c in by_source.values())) if by_source else set()
    counts = []
    for kind in sorted(kinds | configured):
        per = {source: c[kind] for source, c in by_source.items() if c[kind]}
        counts.append(FaultCount(kind, sum(per.values()), per, kind in configured))
    fired = {c.fault for c in counts if c.total}
    # A toxic scheduled as `latency` in the scenario fires as `toxic:latency` here.
    never = sorted(k for k in configured if k not in fired and f"toxic:{k}" not in fired)
    return counts, never
