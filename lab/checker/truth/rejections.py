"""Why each event a lab client rejected was rejected: a rejection is evidence, never just
a number.

Every `events_rejected` row of the client ledgers gets one explanation, from the wire:

- `fault`: a fault of the lab's proxy forwarded that very message on that connection (the
  tap's `forwarded` record with a fault: moved, re-labelled, replayed, injected);
- `cursor_rewrite`: the proxy rewrote the `Last-Event-ID` of the request that opened the
  connection, so the server answered another cursor than the client's;
- `after_fault`: a cursor gap or regression on a connection where a fault of the lab took
  or replaced an event before (a `forwarded` fault, a `dropped` event): the missing event
  is the fault's;
- `consequence`: a refusal about the client's own state, not the event (`duplicate`: a
  legal replay, not accepted twice; `connection_abandoned`: read after the client gave the
  connection up for an earlier reason; an older session's or generation's connection);
- `unverifiable`: the tap has no flow for the connection (nothing to hold it against);
- `unexplained`: none of these. When the tap shows the server sent that message on that
  connection, the rejection is the server's finding (gate 1, `rejected_unexplained`).
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context, text_key
from lab.checker.truth.faults import faulted_forwards, rewritten_cursor
from lab.checker.truth.streams import StreamTruth

EXPLANATIONS = ("fault", "cursor_rewrite", "after_fault", "consequence", "unverifiable", "unexplained")

CONSEQUENCES = frozenset(
    {
        "duplicate",
        "connection_abandoned",
        "stale_session",
        "other_generation",
        "protocol_version_mismatch",
        "subject_mismatch",
        "no_stream",
        "not_initialize_result",
    }
)
"""Reasons that judge the client's state (its session, its connection), not the event."""

SEQUENCE = frozenset({"cursor_gap", "cursor_regression"})
"""Reasons a fault that took or replaced an earlier event of the connection explains."""


def explained_rejections(ctx: Context, truth: StreamTruth) -> pd.DataFrame:
    """The client ledgers' rejections with `flow` (the delivering connection's, or None),
    `explanation` (one of EXPLANATIONS) and `fault` (the fault kind, where one explains it).
    Empty when no client ledger has the table."""
    return ctx.cached("explained_rejections", lambda: _explain(ctx, truth))


def _explain(ctx: Context, truth: StreamTruth) -> pd.DataFrame:
    data = ctx.data
    if data.client is None or "events_rejected" in data.client_tables_absent:
        return pd.DataFrame(columns=["flow", "explanation", "fault"])
    rej = data.client["events_rejected"].copy()
    conn = rej["client_id"].astype(str) + ":" + rej["conn_id"].astype("Int64").astype(str)
    flow_of = truth.flows.dropna(subset=["conn"]).drop_duplicates("conn").set_index("conn")["flow"]
    rej["flow"] = conn.map(flow_of).astype("object")
    rej["explanation"] = "unexplained"
    rej["fault"] = None
    if not truth.from_tap:
        rej["explanation"] = "unverifiable"
        return rej
    faulted = faulted_forwards(ctx)
    fault_of = pd.Series(
        faulted["fault"].to_numpy(), index=text_key(faulted["flow"], faulted["digest"]).to_numpy()
    )
    fault_of = fault_of[~fault_of.index.duplicated(keep="first")]
    by_message = text_key(rej["flow"], rej["digest"]).map(fault_of)
    flows = data.tap_records("flow")
    rewritten_flows = set(flows.loc[rewritten_cursor(flows), "flow"])
    dropped = data.tap_records("dropped")
    took = pd.concat([faulted[["flow", "fault"]], dropped[["flow", "fault"]]], ignore_index=True)
    took_on = took.drop_duplicates("flow").set_index("flow")["fault"]
    reason = rej["reason"].astype(str)

    def mark(mask: pd.Series, name: str, fault: pd.Series | None = None) -> None:
        mask = mask & (rej["explanation"] == "unexplained")
        rej.loc[mask, "explanation"] = name
        if fault is not None:
            rej.loc[mask, "fault"] = fault[mask]

    mark(by_message.notna(), "fault", by_message)
    mark(
        rej["flow"].isin(rewritten_flows),
        "cursor_rewrite",
        pd.Series("rewrite_last_event_id", index=rej.index),
    )
    mark(reason.isin(CONSEQUENCES), "consequence")
    mark(rej["flow"].isna(), "unverifiable")
    after = rej["flow"].map(took_on)
    mark(reason.isin(SEQUENCE) & after.notna(), "after_fault", after)
    return rej


def counts(rej: pd.DataFrame) -> dict[str, int]:
    """Rejections per explanation (every explanation named, zeros too)."""
    got = rej["explanation"].value_counts() if len(rej) else pd.Series(dtype="int64")
    return {name: int(got.get(name, 0)) for name in EXPLANATIONS}
