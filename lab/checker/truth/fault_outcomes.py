"""What each kind of fault did, not only that it fired: report.json `fault_outcomes`.

Per fault kind, under the names the fault counts use (lab.checker.truth.faults: the tap's
kinds, and nemesis toxics as `toxic:<type>`):

    fired        the fault count's total (`count_faults`), the same number as *Faults fired*
    rejected     client `events_rejected` rows that lab.checker.truth.rejections explains
                 by this kind: explanation `fault` (a forward of this kind delivered that
                 very message on that connection), `cursor_rewrite` (the kind
                 rewrite_last_event_id rewrote the connection's cursor) or `after_fault`
                 (a cursor gap or regression after this kind took or replaced an event of
                 that connection)
    recoveries   client `recoveries` whose loss happened on a connection this kind touched;
                 `recovered` of them came back; resume p50/p99 over those given a chance
                 (not censored), exactly as gate 5 takes them
                 (lab.checker.truth.recoveries.run_latencies, nearest_rank): one that never
                 came back counts as infinitely slow, a p99 that lands on it is "never"
    errors       client `operations` that did not end ok (outcome `error` or `unknown`)
                 with this kind on one of their flows
and, over the run, the calls that did not end ok with no injected fault on any of their
flows and no toxic in place while they ran (`failed_calls_unexplained`): the failures a
reader cannot put down to the lab's own faults.

How each is joined. `x-lab-conn` = client_id:conn_id names one request in the client
ledger and in the tap (lab.checker.truth.conn_flows, lab.checker.context.split_conn).
- A tap flow is *touched* by a kind when its `flow` record's `faults` list names it, a
  `forwarded` record with that `fault` or a `dropped` record of that `fault` is on it, or
  a `fault` record names it as the flow it raced. A session race (the family of
  expiry_race and kill_session) that applied (not `not_applicable`: a DELETE answered
  405 ended nothing) also touches every flow of the session it ended (the record's
  `detail.session`, else the raced flow's `session`) that was still open at the record's
  time (its `flow_end`, else its `flow` record, at or after it) or began later: the 404s
  and closed streams that follow are its doing.
- A recovery's loss connection is its client's `http_exchanges` row on the same stream key
  that started last before `lost_at` (a resumption keeps the stream key); its conn gives
  the tap flow. The recovery counts under every kind that touched that one flow.
- A call's flows are the tap's flows carrying its operation key as `idempotency_key`
  (the lab's clients put it on every call) from the client of their conn, and, by their
  JSON-RPC IDs (stream keys `post:<id>`, counted per client and never reused), every
  exchange of that client on those stream keys (the POST, its retries, its resumptions),
  each by its conn. The call counts under every kind that touched any of them.
- A nemesis toxic touches no flow: the nemesis is in front of every connection. A
  recovery counts under `toxic:<type>` when its loss was detected (`lost_at`) while that
  toxic was in place, a call when its span (`started_at` to `finished_at`) overlaps the
  toxic's window (nemesis.jsonl `toxic_added` to `toxic_removed`; never removed: to the
  run's stop). By time only: whatever else happened then counts under the toxic too.

What it can miss, and what it over-counts:
- touched is not caused: a recovery or call counts under every kind that touched its
  flows, whether or not that fault is what ended it (a crossing the client rejected on a
  stream that something else then cut). Rows overlap: their sum can exceed the run's total;
- only a loss's own connection is looked at: a fault that merely prolongs a recovery
  already under way (a storm answering the resumption, a rewritten cursor on the retry)
  is not counted as having caused it;
- a toxic's effect is attributed by its window in time only: a loss detected after the
  window closed (a stream found silent `stream_idle_s` later) is not counted under it,
  and a loss with another cause inside the window is;
- rejections are explained from the tap only, so a toxic never explains one (`rejected`
  null for toxics), and an `after_fault` rejection goes to one fault of its connection:
  its first faulted forward in the tap, else its first drop (lab.checker.truth.rejections),
  not necessarily the one that made the gap;
- a failed call the tap never saw (lost before the proxy) has no flows: it is explained
  only by a toxic in place, else unexplained (`failed_calls_without_flows` counts those);
- without a proxy tap no fault of the proxy can be seen: the unexplained calls and
  recoveries are then not known (null), only toxics are attributed; without a client
  ledger (a client under test) only `fired` is known.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn, text_ids
from lab.checker.inputs.load import MissingInput, RunData
from lab.checker.model import JsonValue
from lab.checker.truth.conn_flows import conn_flows
from lab.checker.truth.faults import TOXIC_PREFIX, ToxicWindow, count_faults, toxic_windows
from lab.checker.truth.recoveries import PERCENTILE, nearest_rank, run_latencies
from lab.checker.truth.rejections import explained_rejections
from lab.checker.truth.streams import stream_truth
from lab.faults.kinds import REGISTRY
from lab.faults.kinds.sessions import FAMILY as SESSION_RACES

REJECTED_BY_FAULT = ("fault", "after_fault", "cursor_rewrite")
"""The explanations of lab.checker.truth.rejections that name a fault kind."""
NOT_OK = ("error", "unknown")
"""Call outcomes that did not end ok (`cancelled` is the client's own choice)."""
BY_FLOW, BY_TIME = "flow", "time"
"""How a kind's outcomes are attributed: by the flows it touched (the proxy's kinds), or
by its window in time (nemesis toxics)."""

PAIRS = ["row", "fault"]


@dataclass(frozen=True, slots=True)
class KindOutcome:
    """What one fault kind did (None: not known from this run's ledgers)."""

    fault: str
    attributed_by: str
    """`flow` or `time` (BY_FLOW, BY_TIME)."""
    fired: int
    rejected: int | None
    recoveries: int | None
    recovered: int | None
    censored: int | None
    """Of the recoveries, never recovered and given no chance (left out of p50/p99)."""
    resume_p50_s: float
    resume_p99_s: float
    """Seconds; inf = never recovered, NaN = no recovery to measure."""
    errors: int | None


@dataclass(frozen=True, slots=True)
class FailedCalls:
    """The run's calls that did not end ok, explained by an injected fault or not (None:
    not known)."""

    total: int | None
    explained: int | None
    """With a fault on one of their flows, or a toxic in place while they ran."""
    unexplained: int | None
    """With neither (not known without a tap: a fault of the proxy would be invisible)."""
    without_flows: int | None
    """Of the unexplained, calls the tap never saw a flow of."""
    unexplained_by_reason: Mapping[str, int]
    """`<outcome>: <reason>` of the unexplained calls, most first."""


UNKNOWN_CALLS = FailedCalls(None, None, None, None, {})


@dataclass(frozen=True, slots=True)
class FaultOutcomes:
    kinds: tuple[KindOutcome, ...]
    """Every kind that fired or had an outcome, by name; empty: no fault in this run."""
    calls: FailedCalls
    recoveries: int | None
    recoveries_unattributed: int | None
    """Recoveries no fault touched (no fault on their loss connection, no toxic in place);
    not known without a tap."""
    notes: tuple[str, ...]


def fault_outcomes(ctx: Context) -> FaultOutcomes:
    """The run's fault outcomes (computed once per judging)."""
    return ctx.cached("fault_outcomes", lambda: _measure(ctx))


def flow_faults(ctx: Context) -> pd.DataFrame:
    """Every (flow, fault) a fault kind touched (module docstring), once per judging;
    empty without a tap."""
    return ctx.cached("flow_faults", lambda: _flow_faults(ctx.data))


# ---------------------------------------------------------------------------- flows


def _pairs(flows: Iterable[object], faults: Iterable[object]) -> pd.DataFrame:
    frame = pd.DataFrame({"flow": list(flows), "fault": list(faults)}, dtype="object")
    return frame.dropna()


def _flow_faults(data: RunData) -> pd.DataFrame:
    if data.tap is None:
        return _pairs([], [])
    tap = data.tap
    listed = [
        (flow, f.get("fault"))
        for flow, faults in zip(tap["flow"]["flow"], tap["flow"]["faults"], strict=True)
        if isinstance(faults, list)
        for f in faults
        if isinstance(f, dict)
    ]
    parts = [
        _pairs((p[0] for p in listed), (p[1] for p in listed)),
        *(_faulted(tap[kind]) for kind in ("forwarded", "dropped", "fault")),
        _sessions_ended(tap),
    ]
    out = pd.concat(parts, ignore_index=True)
    out["fault"] = out["fault"].astype(str)
    return out.drop_duplicates(ignore_index=True)


def _faulted(records: pd.DataFrame) -> pd.DataFrame:
    """(flow, fault) of the tap records that carry a fault (most `forwarded` records carry none)."""
    hit = records[records["fault"].notna()]
    return _pairs(hit["flow"], hit["fault"])


def _sessions_ended(tap: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The flows a session race reached beyond the one it raced: the ended session's flows
    open at its time or begun after."""
    races = tap["fault"]
    races = races[races["fault"].map(_is_session_race)]
    if not len(races):
        return _pairs([], [])
    flows = tap["flow"].drop_duplicates("flow", keep="last")
    ends = tap["flow_end"].drop_duplicates("flow", keep="last").set_index("flow")["t"]
    last_t = pd.to_numeric(flows["flow"].map(ends), errors="coerce").astype("float64")
    last_t = last_t.fillna(pd.to_numeric(flows["t"], errors="coerce").astype("float64"))
    by_session = {
        str(s): (g["flow"].to_numpy(dtype=object), last_t[g.index].to_numpy(dtype="float64"))
        for s, g in flows[flows["session"].notna()].groupby("session", sort=False)
    }
    session_of = flows.set_index("flow")["session"]
    parts = []
    for kind, flow, t, detail in zip(races["fault"], races["flow"], races["t"], races["detail"], strict=True):
        said = detail if isinstance(detail, dict) else {}
        if REGISTRY[str(kind)].not_applicable(said) is not None:
            continue  # nothing ended: the target refused (a DELETE answered 405)
        session = said.get("session") or session_of.get(flow)
        found = by_session.get(str(session))
        if found is None:
            continue
        open_then = found[1] >= float(t)
        parts.append(_pairs(found[0][open_then], [kind] * int(open_then.sum())))
    return pd.concat(parts, ignore_index=True) if parts else _pairs([], [])


def _is_session_race(kind: object) -> bool:
    spec = REGISTRY.get(str(kind))
    return spec is not None and spec.family == SESSION_RACES


def _flow_of_conns(ctx: Context, conns: pd.DataFrame) -> pd.DataFrame:
    """`conns` (row, client_id, conn_id) with the tap flow of each conn (row, flow)."""
    known = conn_flows(ctx)[["client_id", "conn_id", "flow"]]
    left = conns.assign(
        client_id=conns["client_id"].astype(str),
        conn_id=pd.to_numeric(conns["conn_id"], errors="coerce").astype("Int64"),
    )
    return left.merge(known, on=["client_id", "conn_id"])[["row", "flow"]]


def _touched(rows_flows: pd.DataFrame, touched: pd.DataFrame) -> pd.DataFrame:
    """(row, fault) for every row whose flow a fault touched."""
    return rows_flows.merge(touched, on="flow")[PAIRS]


def _in_windows(
    start: np.ndarray, end: np.ndarray, windows: Iterable[ToxicWindow], rows: np.ndarray
) -> pd.DataFrame:
    """(row, fault) for every row whose [start, end] meets a toxic's window."""
    parts = [
        _pairs_of(rows[(start <= w.end) & (end >= w.start)], w.fault)
        for w in windows
        if not math.isnan(w.start)
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PAIRS)


def _pairs_of(rows: np.ndarray, fault: str) -> pd.DataFrame:
    return pd.DataFrame({"row": rows, "fault": [fault] * len(rows)})


def _exchanges(data: RunData) -> pd.DataFrame | None:
    if data.client is None or "http_exchanges" in data.client_tables_absent:
        return None
    ex = data.client["http_exchanges"]
    return pd.DataFrame(
        {
            "client_id": ex["client_id"].astype(str),
            "stream_key": ex["stream_key"].astype("object"),
            "conn_id": pd.to_numeric(ex["conn_id"], errors="coerce").astype("Int64"),
            "started_at": pd.to_numeric(ex["started_at"], errors="coerce").astype("float64"),
        }
    )


# ---------------------------------------------------------------------------- recoveries


def _recoveries(
    ctx: Context, touched: pd.DataFrame, windows: list[ToxicWindow]
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(the run's recoveries with latency and censored, by position `row`; their (row,
    fault) pairs), None without a recoveries table."""
    try:
        rec = run_latencies(ctx).reset_index(drop=True)
    except MissingInput:
        return None
    rows = np.arange(len(rec))
    lost = pd.to_numeric(rec["lost_at"], errors="coerce").to_numpy(dtype="float64")
    pairs = [_in_windows(lost, lost, windows, rows)]
    ex = _exchanges(ctx.data)
    if ctx.data.tap is not None and ex is not None and len(rec):
        pairs.append(_touched(_loss_flows(ctx, rec, ex), touched))
    return rec, pd.concat(pairs, ignore_index=True).drop_duplicates(ignore_index=True)


def _loss_flows(ctx: Context, rec: pd.DataFrame, ex: pd.DataFrame) -> pd.DataFrame:
    """(row, flow): each recovery's loss connection, the exchange of its client on its
    stream key that started last before the loss was detected."""
    left = pd.DataFrame(
        {
            "row": np.arange(len(rec)),
            "client_id": rec["client_id"].astype(str),
            "stream_key": rec["stream_key"].astype(str),
            "t": pd.to_numeric(rec["lost_at"], errors="coerce").astype("float64"),
        }
    ).dropna(subset=["t"])
    right = ex.dropna(subset=["started_at", "stream_key"]).rename(columns={"started_at": "t"})
    right = right.assign(stream_key=right["stream_key"].astype(str))
    found = pd.merge_asof(
        left.sort_values("t", kind="stable"),
        right.sort_values("t", kind="stable"),
        on="t",
        by=["client_id", "stream_key"],
        direction="backward",
        allow_exact_matches=False,  # a resumption sent at the very moment of the loss is not it
    )
    return _flow_of_conns(ctx, found.dropna(subset=["conn_id"]))


# ---------------------------------------------------------------------------- calls


def _failed_calls(
    ctx: Context, touched: pd.DataFrame, windows: list[ToxicWindow]
) -> tuple[pd.DataFrame, pd.DataFrame, set[int]] | None:
    """(the calls that did not end ok, by position `row`; their (row, fault) pairs; the
    rows whose flows the tap saw), None without an operations table."""
    data = ctx.data
    if data.client is None or "operations" in data.client_tables_absent:
        return None
    ops = data.client["operations"]
    failed = ops[ops["outcome"].isin(NOT_OK)].reset_index(drop=True)
    rows = np.arange(len(failed))
    start = pd.to_numeric(failed["started_at"], errors="coerce").to_numpy(dtype="float64")
    end = pd.to_numeric(failed["finished_at"], errors="coerce").to_numpy(dtype="float64")
    end = np.where(np.isnan(end), math.inf, end)  # no end written: it ran to the end
    pairs = [_in_windows(start, end, windows, rows)]
    seen: set[int] = set()
    if data.tap is not None and len(failed):
        flows = _call_flows(ctx, failed)
        seen = set(flows["row"].tolist())
        pairs.append(_touched(flows, touched))
    return failed, pd.concat(pairs, ignore_index=True).drop_duplicates(ignore_index=True), seen


def _call_flows(ctx: Context, failed: pd.DataFrame) -> pd.DataFrame:
    """(row, flow): every flow of each call (module docstring)."""
    tap = ctx.data.tap_records("flow").drop_duplicates("flow", keep="last")
    client, _ = split_conn(tap["conn"])
    keyed = pd.DataFrame(
        {
            "client_id": client,
            "operation_key": tap["idempotency_key"].astype("object"),
            "flow": tap["flow"],
            "jsonrpc_id": text_ids(tap["jsonrpc_id"]),
        }
    ).dropna(subset=["client_id", "operation_key"])
    calls = pd.DataFrame(
        {
            "row": np.arange(len(failed)),
            "client_id": failed["client_id"].astype(str),
            "operation_key": failed["operation_key"].astype("object"),
        }
    )
    posts = calls.merge(keyed, on=["client_id", "operation_key"])
    parts = [posts[["row", "flow"]]]
    ex = _exchanges(ctx.data)
    if ex is not None:
        streams = posts.dropna(subset=["jsonrpc_id"])
        streams = streams.assign(stream_key="post:" + streams["jsonrpc_id"].astype(str))
        mine = (
            streams[["row", "client_id", "stream_key"]]
            .drop_duplicates()
            .merge(ex, on=["client_id", "stream_key"])
        )
        parts.append(_flow_of_conns(ctx, mine[["row", "client_id", "conn_id"]]))
    return pd.concat(parts, ignore_index=True).drop_duplicates(ignore_index=True)


# ---------------------------------------------------------------------------- rejections


def _rejected(ctx: Context) -> Counter[str] | None:
    """Rejections per fault kind that explains them; None when not known (no client
    rejections table, or no tap to explain them from)."""
    data = ctx.data
    if data.tap is None or data.client is None or "events_rejected" in data.client_tables_absent:
        return None
    rej = explained_rejections(ctx, stream_truth(ctx))
    hit = rej[rej["explanation"].isin(REJECTED_BY_FAULT) & rej["fault"].notna()]
    return Counter(str(f) for f in hit["fault"])


# ---------------------------------------------------------------------------- per kind


def _latency_points(latency: pd.Series) -> tuple[float, float]:
    values = latency.to_numpy(dtype="float64")
    return nearest_rank(values, 0.5), nearest_rank(values, PERCENTILE)


def _kind(
    fault: str,
    fired: int,
    rejected: Counter[str] | None,
    recoveries: tuple[pd.DataFrame, pd.DataFrame] | None,
    calls: tuple[pd.DataFrame, pd.DataFrame, set[int]] | None,
) -> KindOutcome:
    toxic = fault.startswith(TOXIC_PREFIX)
    p50 = p99 = math.nan
    count = recovered = censored = None
    if recoveries is not None:
        rec, pairs = recoveries
        mine = rec.loc[sorted(set(pairs.loc[pairs["fault"] == fault, "row"].tolist()))]
        count, censored = len(mine), int(mine["censored"].sum())
        recovered = int(np.isfinite(mine["latency"].to_numpy(dtype="float64")).sum())
        p50, p99 = _latency_points(mine.loc[~mine["censored"].astype(bool), "latency"])
    errors = None if calls is None else int(calls[1].loc[calls[1]["fault"] == fault, "row"].nunique())
    return KindOutcome(
        fault=fault,
        attributed_by=BY_TIME if toxic else BY_FLOW,
        fired=fired,
        rejected=None if toxic or rejected is None else rejected.get(fault, 0),
        recoveries=count,
        recovered=recovered,
        censored=censored,
        resume_p50_s=p50,
        resume_p99_s=p99,
        errors=errors,
    )


def _measure(ctx: Context) -> FaultOutcomes:
    data = ctx.data
    fired = {c.fault: c.total for c in count_faults(data)[0] if c.total}
    windows = toxic_windows(ctx)
    touched = flow_faults(ctx)
    rejected = _rejected(ctx)
    recoveries = _recoveries(ctx, touched, windows)
    calls = _failed_calls(ctx, touched, windows)
    seen = set(fired) | set(rejected or ())
    seen |= set(recoveries[1]["fault"]) if recoveries is not None else set()
    seen |= set(calls[1]["fault"]) if calls is not None else set()
    unattributed = None
    if recoveries is not None and data.tap is not None:
        unattributed = len(recoveries[0]) - recoveries[1]["row"].nunique()
    return FaultOutcomes(
        kinds=tuple(_kind(k, fired.get(k, 0), rejected, recoveries, calls) for k in sorted(seen)),
        calls=UNKNOWN_CALLS if calls is None else _calls_over_run(*calls, tap=data.tap is not None),
        recoveries=None if recoveries is None else len(recoveries[0]),
        recoveries_unattributed=unattributed,
        notes=tuple(_notes(data)),
    )


def _calls_over_run(failed: pd.DataFrame, pairs: pd.DataFrame, seen: set[int], *, tap: bool) -> FailedCalls:
    """The run's failed calls: how many, explained by a fault, unexplained, and why the
    unexplained failed (client `reason`)."""
    explained = set(pairs["row"].tolist())
    alone = failed.loc[[r for r in range(len(failed)) if r not in explained]]
    reasons = Counter(
        f"{o}: {r}" if isinstance(r, str) and r else str(o)
        for o, r in zip(alone["outcome"], alone["reason"], strict=True)
    )
    if not tap:
        return FailedCalls(len(failed), len(explained), None, None, {})
    return FailedCalls(
        total=len(failed),
        explained=len(explained),
        unexplained=len(alone),
        without_flows=sum(r not in seen for r in alone.index),
        unexplained_by_reason=dict(reasons.most_common()),
    )


def _notes(data: RunData) -> list[str]:
    notes = []
    if data.tap is None:
        notes.append(
            "no proxy tap: the proxy's faults cannot be seen, so only toxics are attributed and "
            "the unexplained calls and recoveries are not known"
        )
    if data.client is None:
        notes.append("no client ledger: only the faults fired are known")
    return notes


# ---------------------------------------------------------------------------- report.json


def _seconds(value: float) -> float | None:
    return value if math.isfinite(value) else None


def kind_json(k: KindOutcome) -> dict[str, JsonValue]:
    return {
        "fault": k.fault,
        "attributed_by": k.attributed_by,
        "fired": k.fired,
        "rejected": k.rejected,
        "recoveries": k.recoveries,
        "recovered": k.recovered,
        "censored": k.censored,
        "resume_p50_s": _seconds(k.resume_p50_s),
        "resume_p50_unbounded": math.isinf(k.resume_p50_s),
        "resume_p99_s": _seconds(k.resume_p99_s),
        "resume_p99_unbounded": math.isinf(k.resume_p99_s),
        "errors": k.errors,
    }


def text(o: FaultOutcomes) -> str:
    """The section's one line: no fault at all, or the run's failed calls, explained and not."""
    c = o.calls
    failed = "" if c.total is None else f"{c.total} call(s) did not end ok"
    if not o.kinds:
        return "No fault fired in this run: nothing to attribute" + (f"; {failed}." if failed else ".")
    if c.total is None:
        return "The calls' outcomes are not known (no client ledger)."
    if c.total == 0:
        return "Every call ended ok."
    if c.unexplained is None:
        return f"{failed}: {c.explained} while a toxic was in place; the others not known (no proxy tap)."
    why = [f"{c.without_flows} never reached the proxy"] if c.without_flows else []
    why += (
        [", ".join(f"{r} {n}" for r, n in c.unexplained_by_reason.items())] if c.unexplained_by_reason else []
    )
    return (
        f"{failed}: {c.explained} with an injected fault on their flows, {c.unexplained} with none "
        f"(unexplained{': ' + '; '.join(why) if why else ''})."
    )


def section_of(data: RunData) -> dict[str, JsonValue]:
    """`section` of loaded ledgers, without a judging's Context (the report's figures are
    drawn beside the judging, in a process of their own: lab.report.aside)."""
    from lab.checker.context import parse_budgets

    return section(Context(data, parse_budgets(data.run), 0))


def section(ctx: Context) -> dict[str, JsonValue]:
    """report.json `fault_outcomes` (docs/report.md)."""
    o = fault_outcomes(ctx)
    c = o.calls
    return {
        "status": "ok" if o.kinds else "no_faults",
        "text": text(o),
        "kinds": [kind_json(k) for k in o.kinds],
        "failed_calls": c.total,
        "failed_calls_explained": c.explained,
        "failed_calls_unexplained": c.unexplained,
        "failed_calls_without_flows": c.without_flows,
        "unexplained_by_reason": dict(c.unexplained_by_reason),
        "recoveries": o.recoveries,
        "recoveries_unattributed": o.recoveries_unattributed,
        "notes": list(o.notes),
    }
