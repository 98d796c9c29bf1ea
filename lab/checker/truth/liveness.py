"""Liveness: what never finished, whatever the clients claim, and when the run stalled.

- **Calls without an outcome.** Every tool call the wire shows (tap `flow` records of
  `tools/call`, whose `idempotency_key` is the client's operation key: the lab's clients
  put it on every call) whose client never wrote the operation's outcome (no `operations`
  row for that client and key) had not finished when the run stopped. It is *never
  recovered*: gate 5 counts it as infinitely slow, with a witness, unless the client
  already listed it as an open recovery (a `recoveries` row with that operation key and
  `recovered_at` NULL), or it started less than `resume_p99_s` before the run stopped
  (the run gave it no chance to finish within the budget: censored, counted). The
  clients holding such calls are *stuck at the end*. Without a tap this is not known
  (None): a client's own ledger cannot show what it never finished.
- **Throughput collapse.** In 5 s bins from the run's start, throughput = requests the
  server answered (tap flows with a status) + SSE events with a message the server sent;
  without a tap, the clients' finished exchanges and accepted events. A bin collapsed
  when clients were active (a request open) and its throughput was at most 5 % of the
  run's typical bin (the 90th percentile of its active bins: its busy level). Two or more collapsed bins in a row
  are reported, next to the gates, never as a gate.
- **Toxic windows that never closed**: a nemesis `toxic_outcome` record of a removal
  that `failed` or whose outcome is `unknown` (noted).
- **Unanswered requests**, when they are many (`lab.checker.truth.request_hops`): how many, and
  the hop that dropped most of them (noted; the section "Unanswered requests by hop" has
  the figures, and the verdict names a saturated lab part).
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.explain import at, present
from lab.checker.model import Collapse, Liveness
from lab.checker.truth import request_hops

BIN_S = 5.0
COLLAPSE_SHARE = 0.05
TYPICAL_QUANTILE = 0.9
"""The run's typical bin is its busy level (a high quantile, so a stall that lasts most of
the run does not become the norm)."""
MIN_COLLAPSED_BINS = 2
MIN_TYPICAL = 10
"""Below this many answers + events in a typical bin, a run is too quiet to call a stall."""


def summary(ctx: Context) -> Liveness:
    stuck = calls_without_outcome(ctx)
    counted = None if stuck is None else stuck[~stuck["censored"]]
    clients = () if counted is None else tuple(sorted(set(counted["client_id"].astype(str))))
    notes = list(_unclosed_toxics(ctx))
    if stuck is not None and int(stuck["censored"].sum()):
        notes.append(
            f"{int(stuck['censored'].sum())} call(s) still open had started less than "
            f"{ctx.budgets.resume_p99_s:g} s before the run stopped: not counted"
        )
    if stuck is None:
        notes.append("calls without an outcome not checked: no proxy record (tap) shows the calls made")
    with contextlib.suppress(Exception):  # the section reports its own error
        notes += _unanswered(ctx)
    return Liveness(
        calls_without_outcome=None if counted is None else len(counted),
        clients_stuck=clients,
        collapses=tuple(collapses(ctx)),
        notes=tuple(notes),
    )


def calls_without_outcome(ctx: Context) -> pd.DataFrame | None:
    """client_id, operation_key, tool, started_at, last_at, _line, censored, known_open:
    the calls that never got an outcome (None without a tap or a client ledger)."""
    return ctx.cached("calls_without_outcome", lambda: _calls_without_outcome(ctx))


def _calls_without_outcome(ctx: Context) -> pd.DataFrame | None:
    data = ctx.data
    if data.tap is None or data.client is None:
        return None
    flows = data.tap["flow"]
    calls = flows[(flows["jsonrpc_method"] == "tools/call") & flows["idempotency_key"].notna()]
    client_id, _ = split_conn(calls["conn"])
    calls = calls.assign(client_id=client_id)
    calls = calls[calls["client_id"].notna()]
    if not len(calls):
        return _empty()
    by_op = calls.groupby(["client_id", "idempotency_key"], sort=False).agg(
        started_at=("t", "min"),
        last_at=("t", "max"),
        tool=("tool", "first") if "tool" in calls.columns else ("jsonrpc_method", "first"),
        _line=("_line", "first") if "_line" in calls.columns else ("t", "size"),
    )
    by_op = by_op.reset_index().rename(columns={"idempotency_key": "operation_key"})
    finished = (
        _keys(data.client["operations"], "operation_key")
        if "operations" not in data.client_tables_absent
        else set()
    )
    open_rec: set[tuple[str, str]] = set()
    if "recoveries" not in data.client_tables_absent:
        rec = data.client["recoveries"]
        never = rec[pd.to_numeric(rec["recovered_at"], errors="coerce").isna() & rec["operation_key"].notna()]
        open_rec = _keys(never, "operation_key")
    pairs = list(zip(by_op["client_id"].astype(str), by_op["operation_key"].astype(str), strict=True))
    stuck = by_op[[p not in finished for p in pairs]].copy()
    stuck["known_open"] = [
        p in open_rec
        for p in zip(stuck["client_id"].astype(str), stuck["operation_key"].astype(str), strict=True)
    ]
    end = _end(ctx)
    budget = ctx.budgets.resume_p99_s
    stuck["censored"] = (stuck["started_at"].astype("float64") + budget > end) if end is not None else False
    return stuck.sort_values("started_at", kind="stable").reset_index(drop=True)


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "client_id": pd.Series(dtype=object),
            "operation_key": pd.Series(dtype=object),
            "started_at": pd.Series(dtype="float64"),
            "last_at": pd.Series(dtype="float64"),
            "tool": pd.Series(dtype=object),
            "_line": pd.Series(dtype=object),
            "known_open": pd.Series(dtype=bool),
            "censored": pd.Series(dtype=bool),
        }
    )


def _keys(frame: pd.DataFrame, column: str) -> set[tuple[str, str]]:
    rows = frame[frame[column].notna()]
    return set(zip(rows["client_id"].astype(str), rows[column].astype(str), strict=True))


def _end(ctx: Context) -> float | None:
    """When the run stopped: run.json `stopped_at`, else the last time in the tap."""
    if ctx.stopped_at is not None:
        return ctx.stopped_at
    tap = ctx.data.tap
    if tap is not None and len(tap["flow"]):
        return float(tap["flow"]["t"].max())
    return None


def never_finished_latencies(ctx: Context) -> pd.DataFrame:
    """The calls without an outcome that gate 5 adds as never recovered (not censored,
    not already an open recovery of the client's)."""
    stuck = calls_without_outcome(ctx)
    if stuck is None:
        return _empty()
    return stuck[~stuck["censored"] & ~stuck["known_open"]]


def describe_stuck(row: pd.Series, ctx: Context) -> str:
    end = _end(ctx)
    return (
        f"client {row['client_id']}'s call {row['operation_key']} ({row['tool']}) started "
        f"{at(row['started_at'], ctx.origin)} and never got an outcome: the run stopped "
        f"{at(end, ctx.origin) if end is not None else 'later'} with the client still waiting"
    )


# ---------------------------------------------------------------------------- collapse


def active_clients(data: pd.DataFrame) -> pd.Series:
    """Clients with at least one request open (a stream or a call) during each second, from
    `http_exchanges` rows (client_id, started_at, ended_at); index: epoch second.

    Each client's exchanges are merged into disjoint busy intervals; a client counts once
    in every 1 s bin one of its intervals touches, however many connections it has open.
    """
    x = data[["client_id", "started_at", "ended_at"]].dropna()
    if not len(x):
        return pd.Series(dtype="int64")
    x = x.sort_values(["client_id", "started_at"], kind="stable")
    reach = x.groupby("client_id", sort=False)["ended_at"].cummax()
    previous = reach.groupby(x["client_id"], sort=False).shift()
    starts_new = previous.isna() | (x["started_at"] > previous)
    interval = starts_new.cumsum()
    busy = x.groupby(interval).agg(
        client_id=("client_id", "first"), start=("started_at", "min"), end=("ended_at", "max")
    )
    first = np.floor(busy["start"].to_numpy(dtype="float64")).astype("int64")
    last = np.maximum(np.floor(busy["end"].to_numpy(dtype="float64")).astype("int64"), first)
    lengths = last - first + 1
    # Every (client, second) an interval touches: first, first+1, ..., last per interval.
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    seconds = np.repeat(first, lengths) + offsets
    clients = np.repeat(busy["client_id"].to_numpy(dtype=object), lengths)
    touched = pd.DataFrame({"client_id": clients, "second": seconds}).drop_duplicates()
    counts = touched.groupby("second").size()
    full = np.arange(int(counts.index.min()), int(counts.index.max()) + 1, dtype="int64")
    return counts.reindex(full, fill_value=0).astype("int64")


def _throughput_times(ctx: Context) -> np.ndarray | None:
    data = ctx.data
    if data.tap is not None:
        flows = data.tap["flow"]
        answered = flows.loc[pd.to_numeric(flows["status"], errors="coerce").notna(), "t"]
        sent = data.tap["sent"]
        events = sent.loc[
            sent["has_data"].fillna(False).astype(bool) & ~sent["priming"].fillna(False).astype(bool), "t"
        ]
        return np.concatenate([answered.to_numpy(dtype="float64"), events.to_numpy(dtype="float64")])
    if data.client is not None:
        x = data.client["http_exchanges"]
        inbox = data.client["inbox"]
        done = x.loc[pd.to_numeric(x["status"], errors="coerce").notna(), "ended_at"]
        return np.concatenate(
            [done.to_numpy(dtype="float64"), inbox["accepted_at"].to_numpy(dtype="float64")]
        )
    return None


def collapses(ctx: Context) -> list[Collapse]:
    data = ctx.data
    times = _throughput_times(ctx)
    if times is None or data.client is None or "http_exchanges" in data.client_tables_absent:
        return []
    active = active_clients(data.client["http_exchanges"])
    start = ctx.origin if ctx.origin is not None else (float(np.nanmin(times)) if len(times) else None)
    end = _end(ctx)
    if start is None or end is None or end - start < BIN_S * (MIN_COLLAPSED_BINS + 1):
        return []
    n_bins = int((end - start) // BIN_S)  # whole bins only: the run's last part is its shutdown
    edges = start + BIN_S * np.arange(n_bins + 1)
    counts = np.histogram(times[np.isfinite(times)], bins=edges)[0]
    busy = np.zeros(n_bins, dtype="int64")
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        inside = active[(active.index >= int(np.floor(lo))) & (active.index < int(np.ceil(hi)))]
        busy[i] = int(inside.max()) if len(inside) else 0
    live = busy > 0
    if not live.any():
        return []
    typical = float(np.quantile(counts[live], TYPICAL_QUANTILE))
    if typical < MIN_TYPICAL:
        return []
    low = live & (counts <= COLLAPSE_SHARE * typical)
    out: list[Collapse] = []
    i = 0
    while i < n_bins:
        if not low[i]:
            i += 1
            continue
        j = i
        while j + 1 < n_bins and low[j + 1]:
            j += 1
        if j - i + 1 >= MIN_COLLAPSED_BINS:
            out.append(
                Collapse(
                    start=float(edges[i]),
                    end=float(edges[j + 1]),
                    throughput=int(counts[i : j + 1].sum()),
                    active_clients=int(busy[i : j + 1].max()),
                    typical_per_bin=typical,
                    bin_s=BIN_S,
                )
            )
        i = j + 1
    return out


def _unanswered(ctx: Context) -> list[str]:
    f = request_hops.findings(ctx)
    lost = request_hops.counted(f)
    sent = len(f.rows)
    if not request_hops.many(lost, sent):
        return []
    hop = str(lost["hop"].value_counts().idxmax())
    where = (
        f"most at {hop.replace('_to_', ' → ')} ({request_hops.HOPS[hop].split(': ', 1)[-1]})"
        if hop in request_hops.HOPS
        else "where, not known (no proxy record)"
    )
    return [f"{len(lost):,} of {sent:,} requests went unanswered, {where}: see *Unanswered requests by hop*"]


def _unclosed_toxics(ctx: Context) -> list[str]:
    nem = ctx.data.nemesis
    if nem is None or not len(nem) or "action" not in nem.columns:
        return []
    bad = nem[
        (nem["type"] == "toxic_outcome")
        & (nem["action"] == "remove")
        & nem["outcome"].isin(["failed", "unknown"])
    ]
    return [
        f"toxic {r.toxic} ({r.kind}) on proxy {r.proxy}: its removal {r.outcome} {at(r.t, ctx.origin)}, "
        "so its window never closed (the rest of the run may have run under it)"
        for r in bad.itertuples()
        if present(r.toxic)
    ]
