"""What a client under test handed its application, joined to the wire: each `deliver`
record of the application log matched to the SSE event the proxy forwarded to that
client, and each call's losses and recovery.

**Matching.** A delivery of client C with digest D is the k-th delivery of (C, D) in
time order; it is matched to the k-th event with digest D the proxy forwarded on C's
flows (digests are of the canonical JSON the reference server sends, docs/clients.md).
A delivery no forwarded event matches came from something else than an SSE event: a
JSON answer, or an error the implementation made up (a failed request); it is not
judged here.

**Where a delivered message belongs.** The forwarded event names the `sent` record it
came from (the tap's `source`); that send's **home** (lab.checker.truth.streams) is the stream
the server first sent the message on. The client meant the stream it filed the flow
under: the **intended stream** (lab.checker.truth.client_wire). A delivery whose home is not
the intended stream's logical stream is a message of another stream or session that
reached the application (gate 1); one the proxy made up (no source) too. A response the
application got for a call while one of the call's streams carried SSE events, matching
no event forwarded to the client, is `altered`: the implementation handed over a message
the server never sent as such (an SDK that rewrites a foreign response's id to its own
request's does this).

**Losses and recoveries (gate 5).** A call's flows are its POSTs (the flows carrying its
idempotency key, which the lab's load makes equal to the call ID) and every resumption
whose intended stream is one of them. A loss is one of those flows, answered 200, that
ended before the call's outcome without serving it whole (its answer did not pass on it,
or an event with a message was dropped there) and without the response reaching the
application on it; the recovery is the first
later delivery to the application of a message the server sent on the call's flows (its
response, or a progress notification of it). A call with a loss and no such delivery
before its outcome (or the end of the run) never recovered.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import present
from lab.checker.inputs.jsonl import LINE
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs
from lab.checker.truth.streams import stream_truth

MATCH_SLACK_S = 1.0
"""A forwarded event may be recorded up to this long after the application got it (two
processes' writes of one moment; the same clock)."""


def deliveries(ctx: Context) -> pd.DataFrame:
    return ctx.cached("client_deliveries", lambda: _deliveries(ctx))


def recoveries(ctx: Context) -> pd.DataFrame:
    return ctx.cached("client_recoveries", lambda: _recoveries(ctx))


def _forwarded(ctx: Context, flows: pd.DataFrame) -> pd.DataFrame:
    fwd = ctx.data.tap_records("forwarded")
    fwd = fwd[fwd["flow"].isin(set(flows["flow"].tolist()))]
    by_flow = flows.set_index("flow")
    out = pd.DataFrame(
        {
            "flow": fwd["flow"].astype("object").to_numpy(),
            "fwd_t": fwd["t"].astype("float64").to_numpy(),
            "fwd_index": fwd["index"].to_numpy(),
            "event_id": fwd["event_id"].astype("object").to_numpy(),
            "digest": fwd["digest"].astype("object").to_numpy(),
            "fault": fwd["fault"].astype("object").to_numpy(),
            "decision": fwd["decision"].astype("object").to_numpy(),
            "src_flow": fwd["src_flow"].to_numpy(dtype=object),
            "src_index": fwd["src_index"].to_numpy(dtype=object),
            "fwd_line": fwd[LINE].to_numpy() if LINE in fwd.columns else None,
        }
    )
    out["client"] = out["flow"].map(by_flow["client_id"])
    out["stream_flow"] = out["flow"].map(by_flow["stream_flow"])
    return out.sort_values("fwd_t", kind="stable").reset_index(drop=True)


def _deliveries(ctx: Context) -> pd.DataFrame:
    logs = app_logs(ctx)
    flows = client_wire.flows(ctx)
    dl = logs.of("deliver").sort_values("t", kind="stable").copy()
    fwd = _forwarded(ctx, flows)
    dl["k"] = dl.groupby(["client", "digest"], sort=False).cumcount()
    fwd["k"] = fwd.groupby(["client", "digest"], sort=False).cumcount()
    out = dl.merge(fwd, on=["client", "digest", "k"], how="left")
    late = out["fwd_t"] > out["t"] + MATCH_SLACK_S
    out.loc[late, [c for c in fwd.columns if c not in ("client", "digest", "k")]] = None
    truth = stream_truth(client_wire.truth_context(ctx))
    sent = truth.sent
    home_of = dict(
        zip(
            zip(sent["flow"].tolist(), sent["index"].tolist(), strict=True),
            sent["home"].tolist(),
            strict=True,
        )
    )
    logical_of = dict(zip(truth.flows["flow"].tolist(), truth.flows["logical"].tolist(), strict=True))
    homes: list[object] = []
    intended: list[object] = []
    status: list[str] = []
    for flow, src_flow, src_index, stream_flow in zip(
        out["flow"].tolist(),
        out["src_flow"].tolist(),
        out["src_index"].tolist(),
        out["stream_flow"].tolist(),
        strict=True,
    ):
        if not present(flow):
            homes.append(None)
            intended.append(None)
            status.append("unmatched")
            continue
        home = home_of.get((src_flow, _int(src_index))) if present(src_flow) else None
        meant = logical_of.get(stream_flow)
        homes.append(home)
        intended.append(meant)
        if not present(src_flow):
            status.append("made_up")
        elif home is None or meant is None:
            status.append("unknown")
        else:
            status.append("ok" if home == meant else "foreign")
    out["home"] = pd.Series(homes, index=out.index, dtype="object")
    out["intended"] = pd.Series(intended, index=out.index, dtype="object")
    out["match"] = pd.Series(status, index=out.index, dtype="object")
    _altered_responses(out, flows, fwd)
    return out


def _altered_responses(out: pd.DataFrame, flows: pd.DataFrame, fwd: pd.DataFrame) -> None:
    """A response (or error) the application got for a call, matching no event the proxy
    forwarded, while a stream of that call was carrying SSE events to the client: the
    implementation handed over a message the server never sent as such on the call's
    streams (e.g. another stream's response under this call's id). Marked `altered`, with
    the call's flow and the last proxy-faulted event forwarded on it before (if any)."""
    suspects = out.index[
        (out["match"] == "unmatched") & out["kind"].isin(("response", "error")) & out["call"].notna()
    ]
    if not len(suspects):
        return
    chained = call_flows(flows)
    chained = chained[(chained["status"] == 200) & chained["flow"].isin(set(fwd["flow"].tolist()))]
    by_call = {call: group for call, group in chained.groupby("call", sort=False)}
    faulted = fwd[fwd["fault"].notna()]
    for i in suspects:
        row = out.loc[i]
        group = by_call.get(row["call"])
        if group is None:
            continue
        t = float(row["t"])
        open_then = group[(group["t_req"] <= t) & (group["end_t"].fillna(math.inf) + MATCH_SLACK_S >= t)]
        if not len(open_then):
            continue
        flow = open_then["flow"].iloc[-1]
        last = open_then.iloc[-1]
        if row["kind"] == "error" and _lost_before(last, t):
            # The implementation's own error for a stream that was lost under the call (the
            # SDK's "SSE stream ended without a response" in the modern era, where nothing
            # is resumed): its report of the loss, made by it, not a message it took from
            # another stream. Counted with the deliveries from no event, not judged.
            continue
        out.loc[i, ["match", "flow", "stream_flow"]] = ["altered", flow, open_then["stream_flow"].iloc[-1]]
        before = faulted[(faulted["flow"] == flow) & (faulted["fwd_t"] <= t)]
        if len(before):
            last = before.iloc[-1]
            for name in ("fault", "decision", "fwd_line", "fwd_t", "event_id", "src_flow", "src_index"):
                out.loc[i, name] = last[name]


def _lost_before(flow: pd.Series, t: float) -> bool:
    """Had the flow ended otherwise than complete (cut, reset, gone) by `t` (within the
    matching slack)?"""
    reason, end = flow.get("end_reason"), flow.get("end_t")
    return (
        isinstance(reason, str)
        and reason != "complete"
        and isinstance(end, int | float)
        and not math.isnan(end)
        and end <= t + MATCH_SLACK_S
    )


def _int(value: object) -> int | None:
    if not isinstance(value, int | float | str) or not present(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def call_flows(flows: pd.DataFrame) -> pd.DataFrame:
    """The flows of each call: `call` (its key) and the flow's row, for its POSTs and every
    resumption whose intended stream is one of them."""
    posts = flows[(flows["rpc_method"] == "tools/call") & flows["key"].notna()]
    key_of = dict(zip(posts["flow"].tolist(), posts["key"].tolist(), strict=True))
    chained = flows.assign(call=flows["stream_flow"].map(key_of))
    return chained[chained["call"].notna()]


def _recoveries(ctx: Context) -> pd.DataFrame:
    """One row per loss episode: client, call, lost_at, recovered_at (NaN: never), the
    flow lost, how the call ended (`outcome`, its time), and the refs' rows."""
    flows = client_wire.flows(ctx)
    logs = app_logs(ctx)
    dl = deliveries(ctx)
    chained = call_flows(flows)
    outcome_of = {r["call"]: r for r in client_wire.records(logs.of("outcome").drop_duplicates("call"))}
    times = _call_delivery_times(chained, dl)
    stopped = ctx.stopped_at
    never = stopped if stopped is not None else math.inf
    lost = _lost_flows(chained, dl, outcome_of, never)
    rows = _loss_episodes(lost, outcome_of, times, never)
    columns = [
        "client_id",
        "call",
        "flow",
        "end_reason",
        "lost_at",
        "recovered_at",
        "latency_s",
        "outcome",
        "outcome_at",
        "tap_line",
        "_src",
        "_app_line",
    ]
    return pd.DataFrame(rows, columns=columns)


def _call_delivery_times(chained: pd.DataFrame, dl: pd.DataFrame) -> dict[object, np.ndarray]:
    """call -> the times (in order) of the deliveries of messages the server sent on the
    call's flows."""
    by_flow_call = dict(zip(chained["flow"].tolist(), chained["call"].tolist(), strict=True))
    of_call = dl.assign(owner=dl["src_flow"].map(by_flow_call))
    of_call = of_call[of_call["owner"].notna()].sort_values("t", kind="stable")
    return {
        call: group["t"].to_numpy(dtype="float64") for call, group in of_call.groupby("owner", sort=False)
    }


def _lost_flows(
    chained: pd.DataFrame, dl: pd.DataFrame, outcome_of: dict[Any, dict[str, Any]], never: float
) -> pd.DataFrame:
    """The candidate losses of every call at once (vectorized): its flows that opened
    (200), did not carry its answer and ended before the call did, by call then end."""
    response_flow = (
        dl[dl["call"].notna() & dl["kind"].isin(("response", "error")) & dl["flow"].notna()]
        .drop_duplicates("call", keep="first")
        .set_index("call")
    )
    answered_on = chained["call"].map(response_flow["flow"]).astype("object")
    ended = chained["call"].map({c: float(r["t"]) for c, r in outcome_of.items()}).fillna(never)
    return chained[
        (chained["status"] == 200)
        & (chained["flow"] != answered_on)
        & ~chained["answered"].astype(bool)
        & chained["end_t"].notna()
        & (chained["end_t"] < ended)
    ].sort_values(["call", "end_t"], kind="stable")


def _loss_episodes(
    lost: pd.DataFrame,
    outcome_of: dict[Any, dict[str, Any]],
    times: dict[object, np.ndarray],
    never: float,
) -> list[dict[str, Any]]:
    """One pass over the candidate losses: a flow lost again before its call recovered is
    the same episode; an episode recovers at the call's first delivery after the loss,
    if that came before the call ended."""
    rows: list[dict[str, Any]] = []
    recovered_until: dict[object, float] = {}
    for call, client, flow, end_t, reason, line in zip(
        lost["call"].tolist(),
        lost["client_id"].tolist(),
        lost["flow"].tolist(),
        lost["end_t"].astype(float).tolist(),
        lost["end_reason"].tolist(),
        lost["tap_line"].tolist(),
        strict=True,
    ):
        if end_t <= recovered_until.get(call, -math.inf):
            continue  # lost again before it recovered: one episode
        done = outcome_of.get(call)
        until = float(done["t"]) if done is not None else never
        got = times.get(call, np.array([], dtype="float64"))
        later = got[got > end_t]
        recovered = float(later[0]) if len(later) and later[0] <= until else math.nan
        rows.append(
            {
                "client_id": client,
                "call": call,
                "flow": flow,
                "end_reason": reason,
                "lost_at": end_t,
                "recovered_at": recovered,
                "latency_s": recovered - end_t if not math.isnan(recovered) else math.inf,
                "outcome": None if done is None else done["status"],
                "outcome_at": None if done is None else float(done["t"]),
                "tap_line": line,
                "_src": None if done is None else done["_src"],
                "_app_line": None if done is None else done[LINE],
            }
        )
        recovered_until[call] = recovered if not math.isnan(recovered) else math.inf
    return rows
