"""How many times each fault fired, and which could not apply: proof the run tested what it claims.

Counted per fault kind, from:
    tap_flow       the `faults` list of tap `flow` records (one per fault per flow)
    tap_forwarded  tap `forwarded` records whose `fault` is set
    tap_dropped    tap `dropped` records
    tap_fault      tap `fault` records (faults that acted by an HTTP call of the proxy)
    nemesis        `toxic_added` records of nemesis.jsonl, as kind `toxic:<type>`
Which of the tap's sources count for a kind is the kind's own declaration (its `evidence`
in the registry of fault kinds, `lab.faults.kinds`); a kind the registry does not know is
counted from every source. A kind listed in run.json `fault_windows` (the scenario
configured it) that never fired is reported in `never_fired` — a run that claims a fault
it never applied. A kind whose every firing shows the target could not take it (the
kind's `not_applicable`, e.g. `kill_session` answered 405: the target does not let
clients end sessions) is reported in `not_applicable`, with the reason.

`toxic_windows(ctx)` gives every nemesis toxic's window in time (kind `toxic:<type>`, as
counted here), for what reads toxics by time (unanswered requests, fault outcomes).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from lab.checker.context import Context
from lab.checker.inputs.load import RunData
from lab.checker.model import FaultCount
from lab.faults.kinds import REGISTRY, Evidence

SOURCE_OF: Mapping[Evidence, str] = {
    Evidence.FLOW: "tap_flow",
    Evidence.FORWARDED: "tap_forwarded",
    Evidence.DROPPED: "tap_dropped",
    Evidence.FAULT: "tap_fault",
}
"""The source name (FaultCount.by_source) of each kind of tap evidence."""

TOXIC_PREFIX = "toxic:"
"""A nemesis toxic's fault kind is `toxic:<type>` (`toxic:latency`, `toxic:down`)."""


@dataclass(frozen=True, slots=True)
class NotApplicable:
    """A fault kind that fired, but whose every firing the target could not take."""

    fault: str
    reason: str
    """Why, in the kind's words (the first firing's)."""
    firings: int


def faulted_forwards(ctx: Context) -> pd.DataFrame:
    """The tap's forwarded records that a fault touched: flow, event_id, digest, fault,
    rule, decision, src_flow, src_index (once per judging)."""

    def make() -> pd.DataFrame:
        fwd = ctx.data.tap_records("forwarded")
        return fwd[fwd["fault"].notna()].reset_index(drop=True)

    return ctx.cached("faulted_forwards", make)


def rewritten_cursor(flows: pd.DataFrame) -> pd.Series:
    """Per tap `flow` record: the proxy forwarded another `Last-Event-ID` than it received
    (the rewrite_last_event_id fault)."""
    return flows["last_event_id_out"].notna() & (
        flows["last_event_id_in"].astype("object").fillna("") != flows["last_event_id_out"].astype("object")
    )


@dataclass(frozen=True, slots=True)
class ToxicWindow:
    """One nemesis toxic in place, from its `toxic_added` to its `toxic_removed`."""

    fault: str
    """`toxic:<type>`, the kind's name in the fault counts."""
    kind: str
    """The toxic's type as the nemesis names it (`latency`, `down`, ...)."""
    attributes: object
    start: float
    end: float
    """Epoch s; a toxic never removed ends at the run's stop (inf when that is not known)."""


def toxic_windows(ctx: Context) -> list[ToxicWindow]:
    """Every toxic's window, in the order they opened (once per judging). A toxic is named
    by (proxy, toxic): an update is its removal then its addition, so windows of one name
    never overlap."""
    return ctx.cached("toxic_windows", lambda: _toxic_windows(ctx.data.nemesis, ctx.stopped_at))


def _toxic_windows(nem: pd.DataFrame | None, stopped_at: float | None) -> list[ToxicWindow]:
    if nem is None or not len(nem) or "toxic" not in nem.columns:
        return []
    rows = nem[nem["type"].isin(["toxic_added", "toxic_removed"])].sort_values("t", kind="stable")
    attrs = rows["attributes"] if "attributes" in rows.columns else pd.Series(None, index=rows.index)
    opened: dict[tuple[str, str], tuple[str, object, float]] = {}
    out: list[ToxicWindow] = []
    times = pd.to_numeric(rows["t"], errors="coerce").astype("float64").tolist()
    for record, proxy, toxic, t, kind, attributes in zip(
        rows["type"], rows["proxy"], rows["toxic"], times, rows["kind"], attrs, strict=True
    ):
        key = (str(proxy), str(toxic))
        if record == "toxic_added":
            opened.setdefault(key, (str(kind), attributes, t))
        elif key in opened:
            kind_added, attributes_added, start = opened.pop(key)
            out.append(ToxicWindow(TOXIC_PREFIX + kind_added, kind_added, attributes_added, start, t))
    stop = stopped_at if stopped_at is not None else math.inf
    out += [ToxicWindow(TOXIC_PREFIX + k, k, a, start, stop) for k, a, start in opened.values()]
    return sorted(out, key=lambda w: w.start)


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


def firings(records: pd.DataFrame) -> pd.DataFrame:
    """The tap's `forwarded` or `dropped` records of faults, one per firing: the first record
    of each (fault, decision). One decision can act on many events (a cut drops every
    event after it, a replay re-sends several): counted per event, a gate run's cut_stream
    "fired" 5,490 times for 92 cuts. A record without a decision counts alone."""
    hit = records[records["fault"].notna()]
    if not len(hit) or "decision" not in hit.columns:
        return hit
    decided = hit["decision"].notna()
    first = ~hit.duplicated(["fault", "decision"], keep="first")
    return hit[~decided | first]


def _count(values: Iterable[object]) -> Counter[str]:
    return Counter(str(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v)))


def _counts_by_source(data: RunData) -> dict[str, Counter[str]]:
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
        by_source["tap_forwarded"] = _count(firings(data.tap["forwarded"])["fault"])
        by_source["tap_dropped"] = _count(firings(data.tap["dropped"])["fault"])
        by_source["tap_fault"] = _count(data.tap["fault"]["fault"])
    if data.nemesis is not None and len(data.nemesis):
        added = data.nemesis[data.nemesis["type"] == "toxic_added"]
        by_source["nemesis"] = _count(f"{TOXIC_PREFIX}{k}" for k in added["kind"])
    return by_source


def _counts_for(kind: str, by_source: dict[str, Counter[str]]) -> dict[str, int]:
    spec = REGISTRY.get(kind)
    sources = {SOURCE_OF[e] for e in spec.evidence} if spec is not None else set(by_source)
    return {source: c[kind] for source, c in by_source.items() if source in sources and c[kind]}


def count_faults(data: RunData) -> tuple[list[FaultCount], list[str]]:
    """(counts per kind, configured kinds that never fired), both sorted by kind."""
    by_source = _counts_by_source(data)
    configured = {fault for fault, _, _ in configured_faults(data.run)}
    kinds = set().union(*(c.keys() for c in by_source.values())) if by_source else set()
    counts = []
    for kind in sorted(kinds | configured):
        per = _counts_for(kind, by_source)
        counts.append(FaultCount(kind, sum(per.values()), per, kind in configured))
    fired = {c.fault for c in counts if c.total}
    # A toxic scheduled as `latency` in the scenario fires as `toxic:latency` here.
    never = sorted(k for k in configured if k not in fired and f"{TOXIC_PREFIX}{k}" not in fired)
    return counts, never


def not_applicable(data: RunData) -> dict[str, NotApplicable]:
    """The kinds whose every `fault` record says the target could not take them (by kind).

    A kind with one firing that did apply is applicable: the target can take it.
    """
    if data.tap is None or not len(data.tap["fault"]):
        return {}
    reasons: dict[str, list[str | None]] = {}
    frame = data.tap["fault"]
    for kind, detail in zip(frame["fault"], frame["detail"], strict=True):
        spec = REGISTRY.get(str(kind))
        if spec is None:
            continue
        why = spec.not_applicable(detail) if isinstance(detail, dict) else None
        reasons.setdefault(spec.name, []).append(why)
    out = {}
    for kind, whys in sorted(reasons.items()):
        if whys and all(w is not None for w in whys):
            out[kind] = NotApplicable(kind, str(whys[0]), len(whys))
    return out
