"""What a resumption owes, and whether it was paid: a server check of gate 5, from the tap.

A resumption (a GET with `Last-Event-ID`, as the server received it, answered 2xx by the
server) whose cursor the server did send in that session names a point in one logical
stream (`lab.checker.truth.streams`: the cursor's home). It **owes** every message the
server had first sent on that stream after the cursor before the resumption reached the
proxy (`t_request`, the proxy's clock, as every `t` of the tap): the server had them
when it read the request. On POST streams and standalone GET streams alike: "known
cursor" is no excuse for replaying nothing (SPEC: a resumption owes what was sent after
its cursor).

`unreplayed_resumption` is a **server** violation, in either shape:
- **nothing replayed**: the resumed stream carried none of what it owed, and the server
  closed it (flow_end `complete` or `server_gone`: closed at once, or after a fresh
  priming event), or it stayed open `resume_p99_s` or longer (to its end, or to the end
  of the run) without them. A resumption the client or a fault cut sooner is not judged:
  the server may not have had its turn.
- **owed events skipped**: the resumed stream carried a later message of the stream but
  not every owed message before it.
A server that pages (sends the first owed messages, then closes with `retry`, and the
next resumption carries the rest) pays in instalments, which is legal: only a resumption
that pays nothing, or skips, is judged. A cursor the server never sent in the session is
`silent_resumption`'s (`lab.checker.truth.wire_streams`), not this check's.

Linear in the tap: the first sends of each logical stream are sorted once (by `order`,
which is also the order of `t`), and each resumption's debt is two binary searches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.checker.context import Context, text_key
from lab.checker.explain import at, row_of, short, tap_ref
from lab.checker.model import Attribution, Witness
from lab.checker.truth.streams import stream_truth
from lab.checker.truth.wire_streams import SERVER_ENDED, column_or_null, served_resumptions

UNREPLAYED_RESUMPTION = "unreplayed_resumption"


def unreplayed_resumptions(ctx: Context) -> tuple[pd.DataFrame, int]:
    """(the offending resumption flows, how many resumptions on a known cursor owed
    something)."""
    return ctx.cached("wire_unreplayed_resumptions", lambda: _unreplayed(ctx))


def _unreplayed(ctx: Context) -> tuple[pd.DataFrame, int]:
    if ctx.data.tap is None:
        return pd.DataFrame(), 0
    truth = stream_truth(ctx)
    sent = truth.sent[truth.sent["order"] >= 0]  # what the tap saw (not a server-ledger-only row)
    resumed = _known_cursor_resumptions(ctx, truth.flows, sent)
    if not len(resumed):
        return pd.DataFrame(), 0
    messages = sent["has_data"].to_numpy(dtype=bool) & ~sent["priming"].to_numpy(dtype=bool)
    first = sent[messages & (sent["order"] == sent["home_order"]).to_numpy()]
    order = sent["order"].to_numpy(dtype="int64")
    times = np.full(int(order.max()) + 1 if len(order) else 0, np.nan)
    times[order] = sent["t"].to_numpy(dtype="float64")  # each send's time, by its `order`
    times = np.fmax.accumulate(np.nan_to_num(times, nan=-np.inf))  # no gap breaks its order
    resumed = resumed.assign(owed=_debts(resumed, first, times, None))
    resumed = resumed[resumed["owed"] > 0].reset_index(drop=True)
    if not len(resumed):
        return pd.DataFrame(), 0
    paid = _payments(resumed, sent[messages], times)
    out = resumed.merge(paid, on="flow", how="left")
    out["paid"] = out["paid"].fillna(0).astype("int64")
    out["owed_upto_last"] = _debts(out, first, times, out["last"].to_numpy(dtype="float64"))
    ends = ctx.data.tap["flow_end"].drop_duplicates("flow", keep="first").set_index("flow")
    out["ended_at"] = out["flow"].map(ends["t"]).astype("float64")
    out["end_reason"] = out["flow"].map(ends["reason"]).astype("object")
    until = out["ended_at"]
    if ctx.stopped_at is not None:
        until = until.fillna(ctx.stopped_at)
    out["open_s"] = until - out["answered_at"]
    server_closed = out["end_reason"].isin(SERVER_ENDED)
    had_time = out["open_s"] >= ctx.budgets.resume_p99_s
    nothing = (out["paid"] == 0) & (server_closed | had_time)
    skipped = out["last"].notna() & (out["paid"] < out["owed_upto_last"])
    out["shape"] = np.where(nothing, "nothing", np.where(skipped, "skipped", ""))
    bad = out[nothing | skipped].sort_values("answered_at", kind="stable").reset_index(drop=True)
    first_owed = _first_owed(bad, first)  # for the witnesses only: the offenders alone
    bad = bad.assign(
        first_owed_id=pd.Series(first_owed[0], index=bad.index, dtype="object"),
        first_owed_at=pd.Series(first_owed[1], index=bad.index, dtype="float64"),
    )
    return bad, len(out)


def _known_cursor_resumptions(ctx: Context, tflows: pd.DataFrame, sent: pd.DataFrame) -> pd.DataFrame:
    """Served resumption flows whose cursor the server sent in their session: flow, conn,
    session, logical, cursor, cursor_order (where the cursor stands in its stream),
    asked_at (the request at the proxy), answered_at, status, _line."""
    flows = served_resumptions(ctx)
    if not len(flows):
        return pd.DataFrame()
    answered = flows["t"].astype("float64")
    asked = pd.to_numeric(column_or_null(flows, "t_request"), errors="coerce").astype("float64")
    flows = flows.assign(answered_at=answered, asked_at=asked.fillna(answered))
    logical = pd.Series(tflows["logical"].to_numpy(dtype=object), index=tflows["flow"].to_numpy())
    flows = flows.assign(logical=flows["flow"].map(logical[~logical.index.duplicated()]))
    with_id = sent[sent["event_id"].notna()]
    cursor_at = pd.Series(
        with_id["home_order"].to_numpy(dtype="int64"),
        index=text_key(with_id["session"], with_id["event_id"]).to_numpy(dtype=object),
    )
    cursor_at = cursor_at[~cursor_at.index.duplicated(keep="first")]
    order = text_key(flows["session"], flows["last_event_id_out"]).map(cursor_at)
    flows = flows.assign(cursor=flows["last_event_id_out"].astype("object"), cursor_order=order)
    flows = flows[flows["cursor_order"].notna() & flows["logical"].notna()]
    return flows.assign(cursor_order=flows["cursor_order"].astype("int64")).reset_index(drop=True)


def _debts(
    resumed: pd.DataFrame, first: pd.DataFrame, times: np.ndarray, upto: np.ndarray | None
) -> np.ndarray:
    """Per resumption: the messages first sent on its stream after its cursor and before it
    was asked for (its debt); with `upto`, only those at or before that `order` (NaN: none).

    Vectorized: the first sends as one sorted key (stream code, order), each resumption's
    debt two binary searches in it; "before it was asked for" is an `order` bound, since
    `order` follows the proxy's clock (`times`: each send's `t`, by order)."""
    codes, uniques = pd.factorize(first["home"], sort=False)
    span = len(times) + 1
    keys = np.sort(codes.astype("int64") * span + first["order"].to_numpy(dtype="int64"))
    mine = pd.Index(uniques).get_indexer(resumed["logical"])
    known = mine >= 0
    base = np.where(known, mine, 0).astype("int64") * span
    after = resumed["cursor_order"].to_numpy(dtype="int64")
    cut = np.searchsorted(times, resumed["asked_at"].to_numpy(dtype="float64"), side="left")
    lo = np.searchsorted(keys, base + after, side="right")
    hi = np.searchsorted(keys, base + cut, side="left")
    if upto is not None:
        has = ~np.isnan(upto)
        bound = np.searchsorted(keys, base + np.where(has, upto, -1).astype("int64"), side="right")
        hi = np.minimum(hi, np.where(has, bound, lo))
    return np.where(known, np.maximum(0, hi - lo), 0).astype("int64")


def _payments(resumed: pd.DataFrame, messages: pd.DataFrame, times: np.ndarray) -> pd.DataFrame:
    """Per resumption flow that carried a message of its stream after its cursor: `paid`
    (the distinct owed messages it carried) and `last` (the `order` of the latest first
    send among what it carried, owed or not)."""
    on = messages.merge(resumed[["flow", "logical", "cursor_order", "asked_at"]], on="flow", how="inner")
    on = on[(on["home"] == on["logical"]) & (on["home_order"] > on["cursor_order"])]
    on = on.drop_duplicates(["flow", "home_order"])
    first_t = times[on["home_order"].to_numpy(dtype="int64")]
    on = on.assign(was_owed=first_t < on["asked_at"].to_numpy(dtype="float64"))
    per = on.groupby("flow").agg(paid=("was_owed", "sum"), last=("home_order", "max")).reset_index()
    return per.astype({"last": "float64"})


def _first_owed(out: pd.DataFrame, first: pd.DataFrame) -> tuple[list[object], list[float]]:
    """Per row: the ID and first-send time of the first message it owed."""
    ids: list[object] = []
    ats: list[float] = []
    # Only the offenders' streams are grouped (usually none: a groupby of every stream of
    # a 100k-event run costs what the whole check does).
    mine = first[first["home"].isin(set(out["logical"].tolist()))]
    by_home = {h: g for h, g in mine.groupby("home", sort=False)}
    for logical, after, asked in zip(out["logical"], out["cursor_order"], out["asked_at"], strict=True):
        g = by_home.get(logical)
        row = None if g is None else g[(g["order"] > after) & (g["t"] < asked)].head(1)
        if row is None or not len(row):
            ids.append(None)
            ats.append(float("nan"))
        else:
            ids.append(row["event_id"].iloc[0])
            ats.append(float(row["t"].iloc[0]))
    return ids, ats


def unreplayed_witness(row: pd.Series, ctx: Context) -> Witness:
    owed = int(row["owed"])
    head = (
        f"a resumption GET (connection {row['conn']}, flow {row['flow']}) asked for Last-Event-ID "
        f"{short(row['cursor'], 40)} of stream {row['logical']} {at(row['asked_at'], ctx.origin)}; the server "
        f"had sent {owed} message(s) on that stream after it by then (the first, {short(row['first_owed_id'], 40)}, "
        f"{at(row['first_owed_at'], ctx.origin)})"
    )
    if row["shape"] == "skipped":
        missing = int(row["owed_upto_last"]) - int(row["paid"])
        tail = (
            f", and the resumed stream carried a later message of the stream while {missing} message(s) it "
            "had to replay first (owed) never came: a resumption must replay everything after its cursor "
            "(the Last-Event-ID), in order"
        )
    else:
        reason = str(row["end_reason"]) if isinstance(row["end_reason"], str) else "still open"
        how = (
            f"closed it ({reason}) after {float(row['open_s']):.3f} s"
            if reason in SERVER_ENDED
            else f"left it open {float(row['open_s']):.3f} s ({reason})"
        )
        tail = (
            f"; it answered {int(row['status'])} and {how} with none of them: a resumption the server accepts "
            "must replay what was sent after the cursor (the Last-Event-ID); one it cannot honour must be refused"
        )
    fields = row_of(
        row,
        ["flow", "conn", "session", "logical", "cursor", "owed", "paid", "shape", "asked_at", "open_s"],
    )
    return Witness(UNREPLAYED_RESUMPTION, head + tail, Attribution.SERVER, fields, tuple(tap_ref(row)))
