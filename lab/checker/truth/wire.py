"""What the server did wrong on the wire, whatever the clients did with it: gate 1's
server checks, from the record of what the server sent (`lab.checker.truth.streams`).

Each is a **server** violation, counted even when every client rejected the event (the
client side is judged separately, on what it accepted):

- `sent_off_home`: the server sent an event on a stream that is not its home (an `e1`
  ID naming another stream; for opaque IDs, a replay or repeat of an event first sent on
  another stream — of this session, or of another session: `foreign`). Live sends are
  never suspect merely for repeating an ID: IDs need only be unique within a session.
- `replayed_before_cursor`: a resumption (GET with Last-Event-ID, as the server received
  it) replayed an event of the resumed stream that was first sent at or before the
  cursor's event: a replay must start after the cursor.
- `response_on_standalone_get`: a JSON-RPC response (or error) sent on a stream opened by
  a standalone GET (not a resumption of a POST stream).
- `response_to_another_request`: a response on a POST stream whose id is not the POST's.
- `event_after_response`: an event of a POST stream first sent after the response that
  ends that stream, or sent after that response on the same connection (e.g. progress
  replayed after the response).
- `replayed_out_of_order`: on one connection, an event of the stream sent after an event
  the server first sent later than it (a replay, or a live stream, out of the order of
  first sending; a response before its progress is caught here or just above).
- `broadcast`: one message sent live on two streams of one session (the spec: a message
  MUST NOT be broadcast across streams): the same message (digest) sent, not as a replay,
  on another logical stream of the session within `BROADCAST_WINDOW_S` of its previous
  live send. Each copy after the first counts, under whatever event ID it came. Equal
  content is the only sign on the wire: two messages that merely look alike (the same log
  line from two calls in the same second) read as one; progress notifications carry their
  request's token, so two calls never make equal ones.
- `event_id_reused`: an opaque event ID the server sent live on one stream of a session
  and later sent live (not as a replay) on another stream of that session, for another
  event (a server that counts IDs per stream): IDs MUST be unique across all streams of a
  session, or a cursor cannot say which stream it resumes. Each reuse after the first
  counts (`e1` IDs name their stream, so they cannot collide).
- `rejected_unexplained`: a message the server sent on a connection where a lab client
  rejected it, when no fault of the lab explains the rejection (lab.checker.truth.
  rejections: not a faulted forward of it, not a rewritten cursor, not a gap a fault made,
  not the client's own state): a correct client had to refuse what the server sent, for
  a reason none of the checks above names (a progress token of another call, a cursor
  going backwards, content that changed under one ID, ...).

Message kinds (response, notification, …) come from, in order: the tap's `sent` records
when they carry `kind`/`jsonrpc_id`, the server ledger's `events_sent`, and the clients'
inbox receipts (same digest, same message). An event no source names is not judged by the
checks that need its kind. A send is checked by the first of these checks it breaks (in
the order above), so one send counts once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.checker.context import Context, group_codes, text_ids, text_key
from lab.checker.explain import at, present, row_of, short, tap_ref
from lab.checker.model import Attribution, Witness
from lab.checker.truth.rejections import explained_rejections
from lab.checker.truth.streams import StreamTruth, stream_truth

CHECKS = (
    "sent_off_home",
    "replayed_before_cursor",
    "response_on_standalone_get",
    "response_to_another_request",
    "event_after_response",
    "replayed_out_of_order",
    "broadcast",
    "event_id_reused",
    "rejected_unexplained",
)
BROADCAST_WINDOW_S = 1.0
"""A message's second live send on another stream of the session counts as the same
message broadcast when it follows the first within this many seconds (a server that
broadcasts writes both copies at once; equal messages far apart are two messages)."""
RESPONSE_KINDS = ("response", "error")


def server_sends(ctx: Context) -> pd.DataFrame:
    """The server's offending sends: the rows of `stream_truth(ctx).sent` that break a
    check, with a `check` column (and `cursor_order` for replays before the cursor)."""
    return ctx.cached("wire_server_sends", lambda: _server_sends(ctx))


def message_kinds(ctx: Context) -> pd.DataFrame:
    """digest -> kind, jsonrpc_id (text), one row per digest, for the responses and errors
    (the only kinds the checks need: anything not listed is not a response)."""
    return ctx.cached("message_kinds", lambda: _message_kinds(ctx))


def _message_kinds(ctx: Context) -> pd.DataFrame:
    data = ctx.data
    parts = []
    if data.tap is not None and "kind" in data.tap["sent"].columns:
        sent = data.tap["sent"]
        parts.append(
            pd.DataFrame(
                {
                    "digest": sent["digest"],
                    "kind": sent["kind"],
                    "jsonrpc_id": sent["jsonrpc_id"] if "jsonrpc_id" in sent.columns else None,
                }
            )
        )
    if data.server is not None:
        ev = data.server["events_sent"]
        parts.append(ev[["digest", "kind", "jsonrpc_id"]])
    if data.client is not None:
        inbox = data.client["inbox"]
        parts.append(
            inbox[["message_digest", "kind", "jsonrpc_id"]].rename(columns={"message_digest": "digest"})
        )
    if not parts:
        return pd.DataFrame(columns=["digest", "kind", "jsonrpc_id"])
    out = pd.concat([p[p["kind"].isin(RESPONSE_KINDS)] for p in parts], ignore_index=True)
    out = out[out["digest"].notna()].drop_duplicates("digest")
    out["jsonrpc_id"] = text_ids(out["jsonrpc_id"])
    return out.reset_index(drop=True)


def _server_sends(ctx: Context) -> pd.DataFrame:
    truth = stream_truth(ctx)
    sent = truth.sent
    message = sent["has_data"].to_numpy(dtype=bool) & ~sent["priming"].to_numpy(dtype=bool)
    with_id = sent["event_id"].notna().to_numpy()
    on_wire = sent["flow"].notna().to_numpy() & (sent["order"].to_numpy() >= 0)
    check = pd.Series(None, index=sent.index, dtype="object")
    cursor_order = pd.Series(np.nan, index=sent.index, dtype="float64")
    copy_of = pd.Series(np.nan, index=sent.index, dtype="float64")
    rejected = pd.Series(None, index=sent.index, dtype="object")  # reason: detail

    def flag(mask: np.ndarray, name: str) -> None:
        mask = mask & check.isna().to_numpy()
        check[mask] = name

    off_home = message & with_id & (sent["home"] != sent["on_logical"]).to_numpy()
    flag(off_home, "sent_off_home")
    if truth.from_tap:
        before, at_cursor = _before_cursor(truth, message & with_id & on_wire)
        flag(before, "replayed_before_cursor")
        cursor_order[before] = at_cursor[before]
        kinds = message_kinds(ctx)
        kind = (
            sent["digest"].map(kinds.set_index("digest")["kind"])
            if len(kinds)
            else pd.Series(None, index=sent.index)
        )
        rid = (
            sent["digest"].map(kinds.set_index("digest")["jsonrpc_id"])
            if len(kinds)
            else pd.Series(None, index=sent.index)
        )
        is_response = kind.isin(RESPONSE_KINDS).to_numpy() & message & on_wire
        opener, post_id = _openers(truth)
        stream_opener = sent["on_logical"].map(opener)
        flag(is_response & (stream_opener == "GET").to_numpy(), "response_on_standalone_get")
        own_id = sent["on_logical"].map(post_id)
        wrong = is_response & (stream_opener == "POST").to_numpy() & own_id.notna().to_numpy()
        wrong &= rid.notna().to_numpy() & (rid.astype(str) != own_id.astype(str)).to_numpy()
        flag(wrong, "response_to_another_request")
        flag(
            _after_response(sent, is_response & ~wrong, message & on_wire, stream_opener),
            "event_after_response",
        )
        flag(_out_of_order(sent, message & with_id & on_wire), "replayed_out_of_order")
        copies, previous = _broadcasts(truth, message & on_wire)
        flag(copies, "broadcast")
        copy_of[copies] = previous[copies]
        reused, earlier = _reused_ids(truth, with_id & on_wire)
        flag(reused, "event_id_reused")
        mine = (check == "event_id_reused").to_numpy()
        copy_of[mine] = earlier[mine]
        hit, said = _rejected_unexplained(ctx, truth, message & on_wire)
        flag(hit, "rejected_unexplained")
        mine = (check == "rejected_unexplained").to_numpy()
        rejected[mine] = said[mine]
    found = check.notna()
    bad = sent[found].assign(
        check=check[found], cursor_order=cursor_order[found], copy_of=copy_of[found], rejected=rejected[found]
    )
    return bad.sort_values("order", kind="stable")


def _rejected_unexplained(
    ctx: Context, truth: StreamTruth, candidates: np.ndarray
) -> tuple[np.ndarray, pd.Series]:
    """Sends that a lab client rejected on that very connection when no fault of the lab
    explains it (lab.checker.truth.rejections), with the client's "reason: detail"."""
    rej = explained_rejections(ctx, truth)
    unexplained = rej[rej["explanation"] == "unexplained"]
    said = pd.Series(None, index=truth.sent.index, dtype="object")
    if not len(unexplained):
        return np.zeros(len(truth.sent), dtype=bool), said
    first = unexplained.assign(key=text_key(unexplained["flow"], unexplained["digest"]).to_numpy())
    first = first.drop_duplicates("key").set_index("key")
    text = first["reason"].astype(str) + ": " + first["detail"].fillna("").astype(str)
    keys = text_key(truth.sent["flow"], truth.sent["digest"])
    hit = keys.isin(set(first.index)).to_numpy() & candidates
    said[hit] = keys[hit].map(text)
    return hit, said


def _before_cursor(truth: StreamTruth, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sends on resumption flows of an event first sent at or before the cursor's event on
    the same stream; and the cursor's home_order per send."""
    sent, flows = truth.sent, truth.flows
    resumptions = flows[flows["resumption"]]
    if not len(resumptions):
        return np.zeros(len(sent), dtype=bool), np.full(len(sent), np.nan)
    # The cursor event: its first send in the resumption's session (few cursors: filter first).
    cursors = set(resumptions["last_event_id_out"].dropna())
    firsts = sent[sent["event_id"].isin(cursors) & (sent["order"] == sent["home_order"])]
    firsts = firsts.drop_duplicates(["session", "event_id"])[["session", "event_id", "home", "home_order"]]
    found = resumptions[["flow", "session", "last_event_id_out"]].merge(
        firsts, left_on=["session", "last_event_id_out"], right_on=["session", "event_id"], how="left"
    )
    by_flow_home = pd.Series(found["home"].to_numpy(dtype=object), index=found["flow"].to_numpy())
    by_flow_rank = pd.Series(found["home_order"].to_numpy(dtype="float64"), index=found["flow"].to_numpy())
    home = sent["flow"].map(by_flow_home)
    rank = sent["flow"].map(by_flow_rank).to_numpy(dtype="float64")
    before = candidates & home.notna().to_numpy() & (sent["home"] == home).to_numpy()
    before &= sent["home_order"].to_numpy(dtype="float64") <= rank
    return before, rank


def _openers(truth: StreamTruth) -> tuple[pd.Series, pd.Series]:
    """logical stream -> the method that opened it (POST or GET), and -> the POST's id."""
    opening = truth.flows[~truth.flows["resumption"] & truth.flows["logical"].notna()]
    opening = opening.drop_duplicates("logical")
    opener = pd.Series(opening["method"].to_numpy(dtype=object), index=opening["logical"].to_numpy())
    posts = opening[opening["method"] == "POST"]
    post_id = pd.Series(posts["jsonrpc_id"].to_numpy(dtype=object), index=posts["logical"].to_numpy())
    return opener, post_id.dropna()


def _after_response(
    sent: pd.DataFrame, response: np.ndarray, candidates: np.ndarray, opener: pd.Series
) -> np.ndarray:
    """Events of a POST stream first sent after its response, or sent after the response
    on the same connection."""
    out = np.zeros(len(sent), dtype=bool)
    if not response.any():
        return out
    post = (opener == "POST").to_numpy()
    responses = sent[response & post]
    # First send of the response on its stream (home_order), per stream.
    ends = responses.groupby("home")["home_order"].min()
    end = sent["home"].map(ends).to_numpy(dtype="float64")
    first_sent_later = candidates & post & (sent["home"] == sent["on_logical"]).to_numpy()
    first_sent_later &= sent["home_order"].to_numpy(dtype="float64") > end
    # On the same connection: index after the response's index there.
    response_at = responses.groupby("flow")["index"].min()
    response_index = sent["flow"].map(response_at).to_numpy(dtype="float64")
    same_conn_later = candidates & post & (sent["index"].to_numpy(dtype="float64") > response_index)
    out = np.asarray((first_sent_later | same_conn_later) & ~response, dtype=bool)
    return out


def _out_of_order(sent: pd.DataFrame, candidates: np.ndarray) -> np.ndarray:
    """Per connection, in index order, sends of the stream's own events whose first-send
    order is below that of an event already sent on this connection."""
    own = candidates & (sent["home"] == sent["on_logical"]).to_numpy()
    rows = sent[own][["flow", "index", "home_order"]].sort_values(["flow", "index"], kind="stable")
    if not len(rows):
        return np.zeros(len(sent), dtype=bool)
    before = rows.groupby("flow", sort=False)["home_order"].cummax().groupby(rows["flow"], sort=False).shift()
    late = rows["home_order"] < before
    out = np.zeros(len(sent), dtype=bool)
    out[rows.index[late.fillna(False).to_numpy(dtype=bool)].to_numpy()] = True
    return out


def _live(truth: StreamTruth, candidates: np.ndarray) -> np.ndarray:
    """The `candidates` sent live (not on a resumption flow), in a session."""
    sent = truth.sent
    resumption = pd.Series(
        truth.flows["resumption"].to_numpy(dtype=bool), index=truth.flows["flow"].to_numpy()
    )
    # A flow the flows table lacks maps to NaN: not a resumption (`eq` is False for NaN).
    live = candidates & ~sent["flow"].map(resumption).eq(True).to_numpy(dtype=bool)
    return live & sent["session"].notna().to_numpy()


def _broadcasts(truth: StreamTruth, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(copies, previous): live sends of a message that the server had sent live on
    another logical stream of the session within `BROADCAST_WINDOW_S` before; and, per
    send, the `order` of that previous send (NaN elsewhere)."""
    sent = truth.sent
    copies = np.zeros(len(sent), dtype=bool)
    previous = np.full(len(sent), np.nan)
    live = _live(truth, candidates) & sent["digest"].notna().to_numpy()
    at = np.flatnonzero(live)  # positions in `sent`, whose index is 0..n-1
    if not len(at):
        return copies, previous
    rows = sent.iloc[at]
    group = group_codes(rows["session"], rows["digest"])
    t = rows["t"].to_numpy(dtype="float64")
    order = rows["order"].to_numpy(dtype="int64")
    # By (session, digest), then as sent: each send next to the one before it in its group.
    ranked = np.lexsort((order, t, group))
    at, group, t, order = at[ranked], group[ranked], t[ranked], order[ranked]
    logical = rows["on_logical"].to_numpy(dtype=object)[ranked]
    copy = np.zeros(len(at), dtype=bool)
    before = slice(None, -1)
    copy[1:] = (
        (group[1:] == group[before])
        & ~pd.isna(logical[before])
        & (logical[before] != logical[1:])
        & ((t[1:] - t[before]) <= BROADCAST_WINDOW_S)
    )
    copies[at[copy]] = True
    previous[at[copy]] = order[np.flatnonzero(copy) - 1]
    return copies, previous


def _reused_ids(truth: StreamTruth, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reused, earlier): live sends of an opaque ID that the server had sent live before on
    another logical stream of the session (priming events included: a per-stream counter
    starts every stream at the same ID); and, per send, the `order` of the first live send
    of that ID in the session (NaN elsewhere)."""
    sent = truth.sent
    reused = np.zeros(len(sent), dtype=bool)
    earlier = np.full(len(sent), np.nan)
    live = _live(truth, candidates)
    at = np.flatnonzero(live)  # positions in `sent`, whose index is 0..n-1
    if not len(at):
        return reused, earlier
    rows = sent.iloc[at]
    order = rows["order"].to_numpy(dtype="int64")
    ranked = np.argsort(order, kind="stable")
    at, order = at[ranked], order[ranked]
    logical = rows["on_logical"].to_numpy(dtype=object)[ranked]
    # The first send of each (session, event ID) in `order`: live rows have both.
    _, first, inverse = np.unique(
        group_codes(rows["session"].iloc[ranked], rows["event_id"].iloc[ranked]),
        return_index=True,
        return_inverse=True,
    )
    first_of_row = first[inverse.reshape(-1)]
    again = (logical != logical[first_of_row]) | pd.isna(logical)  # (pandas' `!=`: null differs)
    reused[at[again]] = True
    earlier[at[again]] = order[first_of_row[again]]
    return reused, earlier


# ---------------------------------------------------------------------------- witnesses

_WHY = {
    "sent_off_home": "its home is stream {home}{foreign}, where the server first sent it",
    "replayed_before_cursor": "it was first sent at or before the resumption's cursor {cursor} on that stream: "
    "a replay must start after the cursor",
    "response_on_standalone_get": "a response may not travel on a standalone GET stream",
    "response_to_another_request": "it answers request {rid}, not the POST of request {own}",
    "event_after_response": "it came after that stream's response, which ends a POST stream",
    "replayed_out_of_order": "the server had first sent it before an event already sent on this connection",
    "broadcast": "the same message went out live on another stream of the session: a message may travel on one "
    "stream only",
    "event_id_reused": "the server had already sent that ID live on another stream of the session: event IDs must "
    "be unique across a session's streams, or a cursor cannot name the stream it resumes",
    "rejected_unexplained": "the lab's client rejected it on that connection ({rejected}), and no fault of the lab "
    "touched that message or the cursor that opened the connection: the server sent what a correct client must refuse",
}


def server_witness(row: pd.Series, ctx: Context) -> Witness:
    truth = stream_truth(ctx)
    kinds = message_kinds(ctx)
    known = kinds[kinds["digest"] == row["digest"]]
    kind = str(known["kind"].iloc[0]) if len(known) else "event"
    rid = known["jsonrpc_id"].iloc[0] if len(known) else None
    where = describe_flow(truth, row["flow"])
    check = str(row["check"])
    flows = truth.flows
    match = flows[flows["flow"] == row["flow"]]
    cursor = match["last_event_id_out"].iloc[0] if len(match) else None
    post = flows[(flows["logical"] == row["on_logical"]) & ~flows["resumption"] & (flows["method"] == "POST")]
    own = post["jsonrpc_id"].iloc[0] if len(post) else "?"
    why = _WHY[check].format(
        home=row["home"],
        foreign=" of another session" if bool(row.get("foreign")) else "",
        cursor=short(cursor, 40),
        rid=rid,
        own=own,
        rejected=row.get("rejected") or "?",
    )
    first_at = ""
    refs = tap_ref(row, prefix="")
    if check in ("broadcast", "event_id_reused") and present(row.get("copy_of")):
        other = truth.sent[truth.sent["order"] == int(row["copy_of"])]
        if len(other):
            o = other.iloc[0]
            first_at = f"; also sent on {describe_flow(truth, o['flow'])} {at(o['t'], ctx.origin)}"
            refs = tap_ref(o) + refs
    elif present(row.get("first_flow")) and row["first_flow"] != row["flow"]:
        first = truth.sent[truth.sent["order"] == row["home_order"]]
        if len(first):
            f = first.iloc[0]
            first_at = f"; first sent on {describe_flow(truth, f['flow'])} {at(f['t'], ctx.origin)}"
            refs = tap_ref(f) + refs
    text = (
        f"the server sent {kind} {row['event_id']} (message {short(row['digest'])}) on {where} "
        f"{at(row['t'], ctx.origin)}: {why}{first_at}"
    )
    fields = row_of(row, ["session", "flow", "event_id", "digest", "home", "on_logical", "index", "t"])
    fields["foreign_session"] = bool(row.get("foreign"))
    return Witness(check, text, Attribution.SERVER, fields, tuple(refs))


def describe_flow(truth: StreamTruth, flow: object) -> str:
    match = truth.flows[truth.flows["flow"] == flow]
    if not len(match):
        return f"flow {flow}"
    f = match.iloc[0]
    if f["method"] == "POST" and present(f["jsonrpc_id"]):
        what = f"the POST of request {f['jsonrpc_id']}"
    elif f["resumption"]:
        what = f"a resumption GET (Last-Event-ID {short(f['last_event_id_out'], 40)})"
    else:
        what = f"a {f['method']} stream"
    who = f" on connection {f['conn']}" if present(f["conn"]) else ""
    return f"flow {flow} ({what}{who}, stream {f['logical']})"
