"""Server checks of how streams start, stay alive and end, from the tap alone (gates 5 and 6).

Each is a **server** violation: what the tap's `sent` and `flow_end` records show the
server did, before any proxy fault, whatever the clients made of it.

- `no_priming` (gate 5): a POST answered with an SSE stream whose events carry IDs, in a
  session speaking 2025-11-25, whose first event is not the priming event (an ID with
  empty data). Without it a client cut before the first message has no cursor and must
  re-run the call instead of resuming (2025-11-25 § Sending Messages to the Server,
  item 6). The revision is the flow's `MCP-Protocol-Version` as the server received it,
  else the one the session's other requests carried.
- `silent_resumption` (gate 5): a resumption (GET with `Last-Event-ID`, as the server
  received it) whose cursor the server never sent in that session, answered 2xx, on
  which the server sent no message for `resume_p99_s` or more (or never, while the
  connection lasted that long): a cursor the server cannot honour must be refused, so
  that the client can re-run its call; a stream that stays silent leaves it waiting.
  A known cursor is never judged here (the tap cannot say what the server had to
  replay); a slow recovery of any kind is still gate 5's latency.
- `close_without_retry` (gate 6): the server ended a connection of a stream (flow_end
  `complete` or `server_gone`) and the stream went on — the server later first-sent more
  messages of that logical stream, on a resumption — without having sent an SSE `retry`
  field on that connection: a server-initiated close must advise the reconnect delay
  (2025-11-25 § Sending Messages to the Server, item 6, and § Listening for Messages from
  the Server); without it every client reconnects at once, at its own pace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.checker.context import Context, text_ids
from lab.checker.explain import at, row_of, short, tap_ref
from lab.checker.inputs.jsonl import LINE
from lab.checker.model import Attribution, Witness
from lab.checker.truth.streams import stream_truth
from lab.wire.revisions import REVISIONS

NO_PRIMING = "no_priming"
SILENT_RESUMPTION = "silent_resumption"
CLOSE_WITHOUT_RETRY = "close_without_retry"
SERVER_ENDED = ("complete", "server_gone")
"""flow_end reasons of a connection the server ended (not the client, a fault or the proxy)."""


def _flows(ctx: Context) -> pd.DataFrame:
    """The tap's flow records, one per flow (the last), with `status` numeric."""
    assert ctx.data.tap is not None
    flows = ctx.data.tap["flow"].drop_duplicates("flow", keep="last").reset_index(drop=True)
    flows = flows.assign(status=pd.to_numeric(flows["status"], errors="coerce"))
    return flows


def _served(flows: pd.DataFrame) -> pd.Series:
    return (flows["answered_by"] == "server") & (flows["status"] >= 200) & (flows["status"] < 300)


def column_or_null(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column of `frame`, or nulls where an older tap lacks it."""
    if name in frame.columns:
        return frame[name]
    return pd.Series(None, index=frame.index, dtype="object")


def served_resumptions(ctx: Context) -> pd.DataFrame:
    """The tap's resumption flows (GET with `Last-Event-ID` as the server received it, in a
    session) that the server itself answered 2xx; one row each, `status` numeric."""
    flows = _flows(ctx)
    return flows[
        _served(flows)
        & (flows["method"] == "GET")
        & flows["last_event_id_out"].notna()
        & flows["session"].notna()
    ]


# ------------------------------------------------------------------------------ no_priming


def no_priming(ctx: Context) -> tuple[pd.DataFrame, int]:
    """(the offending POST flows, how many POST streams were judged)."""
    return ctx.cached("wire_no_priming", lambda: _no_priming(ctx))


def _no_priming(ctx: Context) -> tuple[pd.DataFrame, int]:
    if ctx.data.tap is None:
        return pd.DataFrame(), 0
    flows = _flows(ctx)
    version = column_or_null(flows, "protocol_version_out").astype("object")
    given = version.notna()
    usual = version[given].groupby(flows.loc[given, "session"]).agg(lambda v: v.mode().iloc[0])
    version = version.where(version.notna(), flows["session"].map(usual))
    primes = {name for name, r in REVISIONS.items() if r.priming_event}
    posts = flows[_served(flows) & (flows["method"] == "POST") & version.isin(primes).to_numpy()]
    sent = ctx.data.tap["sent"]
    sent = sent[sent["flow"].isin(posts["flow"])].sort_values(["flow", "index"], kind="stable")
    with_ids = set(sent.loc[sent["event_id"].notna(), "flow"].tolist())
    first = sent.drop_duplicates("flow")
    first = first[first["flow"].isin(with_ids)]
    bad = first[~first["priming"].fillna(False).astype(bool)]
    posts = posts.assign(jsonrpc_id=text_ids(posts["jsonrpc_id"]))
    bad = bad.merge(
        posts[["flow", "conn", "jsonrpc_id", "jsonrpc_method", "session"]].rename(
            columns={"session": "flow_session"}
        ),
        on="flow",
        how="left",
    )
    return bad.sort_values("t", kind="stable").reset_index(drop=True), len(first)


def no_priming_witness(row: pd.Series, ctx: Context) -> Witness:
    text = (
        f"the server answered the POST of request {row['jsonrpc_id']} ({row['jsonrpc_method']}, connection "
        f"{row['conn']}, flow {row['flow']}, a 2025-11-25 session) with an SSE stream whose first event, "
        f"{row['event_id']} {at(row['t'], ctx.origin)}, is {'a message' if row['has_data'] else 'not a priming event'}: "
        "the stream did not start with the priming event (an event ID with empty data), so a client cut before "
        "the first message has no cursor to resume from"
    )
    fields = row_of(row, ["flow", "conn", "session", "jsonrpc_id", "event_id", "index", "t"])
    return Witness(NO_PRIMING, text, Attribution.SERVER, fields, tuple(tap_ref(row)))


# ----------------------------------------------------------------------- silent_resumption


def silent_resumptions(ctx: Context) -> tuple[pd.DataFrame, int]:
    """(the offending resumption flows, how many resumptions with a cursor unknown in their
    session the server answered 2xx)."""
    return ctx.cached("wire_silent_resumptions", lambda: _silent(ctx))


def _silent(ctx: Context) -> tuple[pd.DataFrame, int]:
    if ctx.data.tap is None:
        return pd.DataFrame(), 0
    truth = stream_truth(ctx)
    resumed = served_resumptions(ctx)
    sent = truth.sent
    issued = set(zip(sent["session"].tolist(), sent["event_id"].tolist(), strict=True))
    unknown = [
        (s, c) not in issued
        for s, c in zip(resumed["session"].tolist(), resumed["last_event_id_out"].tolist(), strict=True)
    ]
    judged = resumed[np.asarray(unknown, dtype=bool)] if len(resumed) else resumed
    if not len(judged):
        return pd.DataFrame(), 0
    messages = sent[sent["has_data"] & ~sent["priming"] & sent["flow"].isin(judged["flow"])]
    first_message = messages.groupby("flow")["t"].min()
    ends = ctx.data.tap["flow_end"]
    end_at = ends.drop_duplicates("flow", keep="first").set_index("flow")["t"]
    out = judged.assign(
        answered_at=judged["t"].astype("float64"),
        first_message_at=judged["flow"].map(first_message).astype("float64"),
        ended_at=judged["flow"].map(end_at).astype("float64"),
    )
    stopped = ctx.stopped_at
    until = out["first_message_at"].where(out["first_message_at"].notna(), out["ended_at"])
    if stopped is not None:
        until = until.fillna(stopped)
    out["silent_s"] = until - out["answered_at"]
    bad = out[out["silent_s"] >= ctx.budgets.resume_p99_s]
    return bad.sort_values("answered_at", kind="stable").reset_index(drop=True), len(judged)


def silent_witness(row: pd.Series, ctx: Context) -> Witness:
    silent = float(row["silent_s"])
    then = "and then a message" if pd.notna(row["first_message_at"]) else "and nothing at all while it lasted"
    text = (
        f"a resumption GET (connection {row['conn']}, flow {row['flow']}) asked for Last-Event-ID "
        f"{short(row['last_event_id_out'], 40)}, an ID the server never sent in session {row['session']}; "
        f"the server answered {int(row['status'])} {at(row['answered_at'], ctx.origin)} and sent no message for "
        f"{silent:.3f} s {then} (budget {ctx.budgets.resume_p99_s:g} s): a cursor the server cannot honour "
        "must be refused, not answered with a silent stream"
    )
    fields = row_of(
        row, ["flow", "conn", "session", "last_event_id_out", "status", "answered_at", "silent_s"]
    )
    return Witness(SILENT_RESUMPTION, text, Attribution.SERVER, fields, tuple(tap_ref(row)))


# --------------------------------------------------------------------- close_without_retry


def closes_without_retry(ctx: Context) -> tuple[pd.DataFrame, int]:
    """(the offending connections, how many connections the server ended while their
    stream went on)."""
    return ctx.cached("wire_closes_without_retry", lambda: _closes(ctx))


def _closes(ctx: Context) -> tuple[pd.DataFrame, int]:
    if ctx.data.tap is None:
        return pd.DataFrame(), 0
    truth = stream_truth(ctx)
    ends = ctx.data.tap["flow_end"].drop_duplicates("flow", keep="first")
    ends = ends[ends["reason"].isin(SERVER_ENDED)][["flow", "t", "reason"]].rename(columns={"t": "ended_at"})
    flows = truth.flows[["flow", "conn", "method", "session", "jsonrpc_id", "logical", "resumption", LINE]]
    # Only streams the server itself answered 2xx: a 429/503 a proxy storm answered in its
    # place (or any refusal) was never a stream the server could advise a delay on.
    served = _flows(ctx)
    flows = flows[flows["flow"].isin(served.loc[_served(served), "flow"])]
    closed = ends.merge(flows, on="flow", how="inner")
    if not len(closed):
        return pd.DataFrame(), 0
    sent = truth.sent
    first_sends = sent[
        sent["has_data"]
        & ~sent["priming"]
        & (sent["order"] == sent["home_order"])
        & sent["on_logical"].notna()
    ]
    last_new = first_sends.groupby("on_logical")["t"].max()
    went_on = closed["logical"].map(last_new).astype("float64") > closed["ended_at"].astype("float64")
    closed = closed[went_on.to_numpy()]
    closed = closed[~closed["flow"].isin(_superseded(ctx, closed, truth.flows))]
    raw = ctx.data.tap["sent"]
    retry = column_or_null(raw, "retry")
    advised = set(raw.loc[retry.notna().to_numpy(), "flow"].tolist())
    bad = closed[~closed["flow"].isin(advised)]
    return bad.sort_values("ended_at", kind="stable").reset_index(drop=True), len(closed)


SUPERSEDE_SLACK_S = 0.05
"""Clock rounding allowed between a resumption's arrival and the old connection's end."""


def _superseded(ctx: Context, closed: pd.DataFrame, flows: pd.DataFrame) -> set[str]:
    """The closed connections whose stream the client had already resumed on another one
    before the server ended them: one connection per stream, so the server ends the old
    one (the reference server's `superseded`). That close is the client's move, not a
    server-initiated close that owed a `retry`. Both times are the proxy's clock."""
    tap = ctx.data.tap_records("flow").drop_duplicates("flow", keep="last")
    t = pd.to_numeric(tap["t"], errors="coerce").astype("float64")
    start = (
        pd.to_numeric(tap["t_request"], errors="coerce").astype("float64").fillna(t)
        if "t_request" in tap
        else t
    )
    started = pd.Series(start.to_numpy(), index=tap["flow"].to_numpy())
    started = started[~started.index.duplicated(keep="last")]
    mine = closed[["flow", "logical", "ended_at"]].assign(my_start=closed["flow"].map(started))
    others = flows[["flow", "logical"]].rename(columns={"flow": "other"})
    others = others.assign(other_start=others["other"].map(started))
    pairs = mine.merge(others, on="logical", how="inner")
    hit = (
        (pairs["other"] != pairs["flow"])
        & (pairs["other_start"] > pairs["my_start"])
        & (pairs["other_start"] <= pairs["ended_at"].astype("float64") + SUPERSEDE_SLACK_S)
    )
    return set(pairs.loc[hit, "flow"].tolist())


def close_witness(row: pd.Series, ctx: Context) -> Witness:
    what = (
        f"the POST of request {row['jsonrpc_id']}"
        if row["method"] == "POST"
        else ("a resumption GET" if bool(row["resumption"]) else f"a {row['method']} stream")
    )
    text = (
        f"the server ended the connection of {what} (connection {row['conn']}, flow {row['flow']}, stream "
        f"{row['logical']}) {at(row['ended_at'], ctx.origin)} ({row['reason']}) while its stream went on (it "
        "sent more of that stream later, on a resumption), without an SSE `retry` field on that connection: "
        "a server-initiated close must advise the reconnect delay"
    )
    fields = row_of(row, ["flow", "conn", "session", "method", "jsonrpc_id", "logical", "ended_at", "reason"])
    return Witness(CLOSE_WITHOUT_RETRY, text, Attribution.SERVER, fields, tuple(tap_ref(row)))
