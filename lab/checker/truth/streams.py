"""Which logical stream every server event belongs to, and which logical stream each of a
client's stream keys names: the joins behind gates 1 and 2.

A **logical stream** is one server stream, whatever connections carried it: a POST's
stream and every GET that resumed it are one logical stream. Its name (`logical`) is
`<session>|<server stream id>` when the server's event IDs say the stream (`e1` IDs, or
the server ledger), else `flow:<flow id>` of the connection that opened it.

From the proxy tap (preferred; it is the truth before any fault):
- a POST or standalone-GET flow is its own logical stream: the server ledger's
  `streams` row of its connection (`conn`) if there is one, else the stream ID of the
  flow's first `sent` event, else the flow itself;
- a resumption flow (a GET whose `last_event_id_out` is set) carries the logical stream
  on which the server first sent that event ID (as the server received the header,
  after any proxy rewrite);
- an event's **home** is the stream its `e1` ID names; for opaque IDs, the logical
  stream on which the server first sent that (event ID, digest) in this session (IDs
  need only be unique in a session, so live sends in two sessions of one ID, even with
  equal content, are each at home) — unless that first send in this session is itself a
  replay (on a resumption flow) of an event another session was sent earlier, and the
  server's IDs are globally unique (no ID live in two sessions, as a server with one
  event store for every session must mint them): then its home is that other session's
  stream, looked up across all sessions (a foreign replay); for an event without ID, the
  logical stream of its flow.
From the server ledger: `streams` gives the logical stream of each opening connection,
`events_sent` the events (home from the `e1` ID, else its `stream_id`). With both, the
events are the tap's plus those only the server ledger has (`tap+server`).

Client stream keys (docs/ledgers.md): `post:<rid>` is the stream of the client's POST
whose JSON-RPC id is rid (tap flow: its `conn` names the client, `jsonrpc_id` is rid);
`get:<n>` is the standalone GET the client's `http_exchanges` record (purpose
standalone) on connection n. Keys map to logical streams per (client, session).

Frames built here (all strings are object columns; times epoch seconds):
    flows       flow, conn, client_id, conn_id, method, session, jsonrpc_id,
                last_event_id_out, resumption, logical, has_events, _line (tap line)
    sent        session, flow, conn, client_id, event_id, digest, home, on_logical,
                priming, has_data, t, index, send_key, _line (tap line), and:
                order       position in the order the server sent everything (tap: by t,
                            then index; -1 for an event only the server ledger has)
                home_order  `order` of the send that made the event's home (its first)
                resend      the event was sent before (a replay, or a repeat in its session)
                foreign     its home is another session's stream (opaque IDs)
                first_flow  the flow of the send that made its home
    stream_map  client_id, session, stream_key, logical, flow
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checker.context import KEY_SEP, Context, group_codes, in_keys, split_conn, text_ids, text_key
from lab.checker.inputs.jsonl import LINE
from lab.checker.inputs.load import MissingInput
from lab.wire.event_ids import parse_event_id

SEP = KEY_SEP


@dataclass(frozen=True, slots=True)
class StreamTruth:
    source: str
    """Where the record of what the server sent comes from: `tap`, `tap+server` (the
    tap, plus the events only the server ledger has) or `server`."""
    flows: pd.DataFrame
    sent: pd.DataFrame
    stream_map: pd.DataFrame
    shared_ids: int = 0
    """Opaque event IDs the server sent live in two or more sessions (per-session IDs):
    then no replay is judged foreign by its ID across sessions."""

    @property
    def from_tap(self) -> bool:
        """Flows are the tap's (so faults, deliveries and flow IDs are known)."""
        return self.source.startswith("tap")


def stream_truth(ctx: Context) -> StreamTruth:
    return ctx.cached("stream_truth", lambda: _build(ctx))


def client_sessions(ctx: Context) -> pd.DataFrame:
    """client_id, session_generation, session: the session of each client generation
    (client `sessions` rows with what = established; else what its exchanges carried)."""
    return ctx.cached("client_sessions", lambda: _client_sessions(ctx))


def _client_sessions(ctx: Context) -> pd.DataFrame:
    parts = []
    data = ctx.data
    if data.client is not None and "sessions" not in data.client_tables_absent:
        s = data.client["sessions"]
        est = s[(s["what"] == "established") & s["session"].notna()]
        parts.append(est[["client_id", "session_generation", "session"]])
    if data.client is not None and "http_exchanges" not in data.client_tables_absent:
        x = data.client["http_exchanges"]
        carried = x[(pd.to_numeric(x["carried_session"], errors="coerce") == 1) & x["session"].notna()]
        parts.append(carried[["client_id", "session_generation", "session"]])
    if not parts:
        return pd.DataFrame(columns=["client_id", "session_generation", "session"])
    out = pd.concat(parts, ignore_index=True).drop_duplicates(["client_id", "session_generation"])
    out["session_generation"] = out["session_generation"].astype("int64")
    return out.reset_index(drop=True)


def _build(ctx: Context) -> StreamTruth:
    data = ctx.data
    if data.tap is not None and data.server is not None:
        return _with_server_events(_from_tap(ctx), _from_server(ctx))
    if data.tap is not None:
        return _from_tap(ctx)
    if data.server is not None:
        return _from_server(ctx)
    raise MissingInput(
        f"no record of what the server sent: {data.why_absent('tap')}; {data.why_absent('server')}"
    )


def _key(*columns: pd.Series) -> pd.Series:
    return text_key(*columns)


# ---------------------------------------------------------------------------- the tap


def _from_tap(ctx: Context) -> StreamTruth:
    data = ctx.data
    tap = data.tap
    assert tap is not None
    flows = _tap_flows(tap)
    sent = _tap_sent(tap)
    flows["has_events"] = flows["flow"].isin(sent["flow"])
    flow_session = pd.Series(flows["session"].to_numpy(dtype=object), index=flows["flow"].to_numpy())
    sent["session"] = sent["session"].where(sent["session"].notna(), sent["flow"].map(flow_session))
    base = _opening_logicals(ctx, flows, sent)

    sent_flow_pos = pd.Index(flows["flow"]).get_indexer(sent["flow"])
    on_resumption = _take(flows["resumption"].astype(object), sent_flow_pos, sent.index).eq(True).to_numpy()
    has_sid = sent["stream_id"].notna()
    has_id = sent["event_id"].notna()
    first_in_session, first_anywhere = _first_sends(sent, has_id)
    ids = has_id.to_numpy()
    safe_fs = np.where(ids, first_in_session.to_numpy(), 0)
    safe_fg = np.where(ids, first_anywhere.to_numpy(), 0)
    first_live = _first_live_sends(sent, ids & ~on_resumption)
    foreign, shared_ids = _foreign_replays(sent, on_resumption, safe_fs, safe_fg, first_live)
    origin = np.where(first_live >= 0, first_live, safe_fg)
    definer = np.where(foreign, origin, np.where(ids, safe_fs, sent["order"].to_numpy()))
    claimed = _claimed_logicals(ctx, flows, base)
    logical, home = _resolve_logicals(flows, sent, base, sent_flow_pos, definer, claimed)

    flows["logical"] = logical.astype("object")
    sent["on_logical"] = _take(flows["logical"], sent_flow_pos, sent.index)
    sent["home"] = home.where(home.notna(), sent["on_logical"])
    # The order in which each event was first sent on its home (what a replay must keep).
    sent["home_order"] = np.where(has_sid.to_numpy() & ids, safe_fs, definer)
    sent["resend"] = ids & (on_resumption | (safe_fs != sent["order"].to_numpy()))
    sent["foreign"] = foreign
    sent["first_flow"] = sent["flow"].to_numpy(dtype=object)[sent["home_order"].to_numpy()]
    sent["conn"] = _take(flows["conn"], sent_flow_pos, sent.index)
    sent["client_id"] = _take(flows["client_id"], sent_flow_pos, sent.index)
    sent["send_key"] = _send_keys(sent)
    sent = sent.drop(columns=["stream_id"])
    return StreamTruth("tap", flows, sent, _stream_map_tap(ctx, flows), shared_ids)


def _tap_flows(tap: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per tap flow (its last record), with its client, connection and session
    (an initialize's: the session it created), and whether it is a resumption."""
    flows = tap["flow"].drop_duplicates("flow", keep="last").reset_index(drop=True)
    flows = pd.DataFrame(
        {
            "flow": flows["flow"].astype("object"),
            "conn": flows["conn"].astype("object"),
            "method": flows["method"].astype("object"),
            "session": flows["session"].astype("object"),
            "jsonrpc_id": text_ids(flows["jsonrpc_id"]),
            "last_event_id_out": flows["last_event_id_out"].astype("object"),
            "last_event_id_in": (
                flows["last_event_id_in"].astype("object") if "last_event_id_in" in flows.columns else None
            ),
            LINE: flows[LINE] if LINE in flows.columns else None,
        }
    )
    if "session_out" in tap["flow"].columns:
        # An initialize carries no session; its stream belongs to the one it created.
        assigned = tap["flow"].drop_duplicates("flow", keep="last")["session_out"].astype("object")
        flows["session"] = flows["session"].where(flows["session"].notna(), assigned.to_numpy())
    flows["client_id"], flows["conn_id"] = split_conn(flows["conn"])
    flows["resumption"] = flows["last_event_id_out"].notna() & (flows["method"] == "GET")
    return flows


def _tap_sent(tap: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The tap's `sent` records in the order the server sent them (by t, then index),
    numbered by that order."""
    raw = tap["sent"].sort_values(["t", "index"], kind="stable")  # the order the server sent them in
    sent = pd.DataFrame(
        {
            "flow": raw["flow"].astype("object").to_numpy(),
            "t": raw["t"].astype("float64").to_numpy(),
            "index": raw["index"].to_numpy(),
            "event_id": raw["event_id"].astype("object").to_numpy(),
            "digest": raw["digest"].astype("object").to_numpy(),
            "stream_id": raw["stream_id"].astype("object").to_numpy(),
            "session": raw["session"].astype("object").to_numpy(),
            "priming": raw["priming"].fillna(False).astype(bool).to_numpy(),
            "has_data": raw["has_data"].fillna(False).astype(bool).to_numpy(),
            LINE: raw[LINE].to_numpy() if LINE in raw.columns else None,
        }
    )
    sent["order"] = np.arange(len(sent), dtype="int64")
    return sent


def _opening_logicals(ctx: Context, flows: pd.DataFrame, sent: pd.DataFrame) -> pd.Series:
    """The logical stream of each opening flow (null for resumption flows): the server
    ledger's `streams` row of its connection, else its first event's stream ID, else the
    flow itself."""
    # Opening flows: the server's own record of the stream, else its first event's ID.
    named = sent[sent["stream_id"].notna()].sort_values(["flow", "index"], kind="stable")
    first = named.drop_duplicates("flow")
    first_logical = pd.Series(
        _key(first["session"], first["stream_id"]).to_numpy(dtype=object),
        index=first["flow"].values,
        dtype="object",
    )
    base = flows["flow"].map(first_logical).astype("object")
    if ctx.data.server is not None:
        st = ctx.data.server["streams"]
        by_conn = pd.Series(
            _key(st["session"], st["stream_id"]).to_numpy(dtype=object),
            index=st["conn"].values,
            dtype="object",
        )
        by_conn = by_conn[~by_conn.index.duplicated(keep="first")]
        server_says = flows["conn"].map(by_conn).astype("object").where(flows["conn"].notna())
        base = server_says.where(server_says.notna(), base)
    base = base.where(base.notna(), ("flow:" + flows["flow"].astype(str)).astype("object"))
    return base.where(~flows["resumption"])


def _foreign_replays(
    sent: pd.DataFrame,
    on_resumption: np.ndarray,
    safe_fs: np.ndarray,
    safe_fg: np.ndarray,
    first_live: np.ndarray,
) -> tuple[np.ndarray, int]:
    """(foreign, shared_ids): which sends are foreign replays (opaque IDs: their home is
    another session's stream), and how many IDs the server sent live in two or more
    sessions. `safe_fs`/`safe_fg`: the order of each send's first send of its (ID, digest)
    in its session / in any session (0 for sends without ID); `first_live`: that of its
    first live send (not on a resumption) in any session, -1 if none."""
    has_sid = sent["stream_id"].notna()
    ids = sent["event_id"].notna().to_numpy()
    # An event's home for opaque IDs: the stream of its first send in this session; but a
    # first send in this session that is a replay (a resumption flow) of an event another
    # session was sent earlier belongs to that other session's stream (a foreign replay).
    # So does one that another session was sent live, even a little later on the wire: a
    # resumption can only replay what the server had stored, and one event store for
    # every session can hand the replay out before the live copy reaches the proxy (seen:
    # 43 ms earlier), which read the live send as the misplaced one.
    sessions = sent["session"].to_numpy(dtype=object)
    live_at = np.where(first_live >= 0, first_live, 0)
    replayed_first = ids & ~has_sid.to_numpy() & on_resumption[safe_fs]
    foreign = replayed_first & (
        ((sessions[safe_fg] != sessions) & (safe_fg < safe_fs))
        | ((first_live >= 0) & (sessions[live_at] != sessions))
    )
    live_sessions = _live_sessions_per_id(sent, ids & ~on_resumption)
    shared_ids = int(pd.Series(sent["event_id"].to_numpy(dtype=object)[live_sessions > 1]).nunique())
    # Per-session IDs (some ID live in two sessions): an identical (ID, content) in another
    # session says nothing about where an event belongs, so homes stay within the session.
    foreign &= (live_sessions <= 1) & (shared_ids == 0)
    return foreign, shared_ids


def _resolve_logicals(
    flows: pd.DataFrame,
    sent: pd.DataFrame,
    base: pd.Series,
    sent_flow_pos: np.ndarray,
    definer: np.ndarray,
    claimed: np.ndarray | None = None,
) -> tuple[pd.Series, pd.Series]:
    """(logical of each flow, home of each send): a resumption flow carries the logical
    stream its cursor was sent on, and an opaque-ID event's home is the logical stream of
    the flow of its `definer` send.

    One pass, with no limit on depth: a resumption's cursor names an event sent earlier,
    on a flow that is either an opening flow (its logical is `base`) or an earlier
    resumption, so every chain ends at an opening flow, an `e1` ID that names its stream,
    or a cursor the tap never saw sent. Each flow is resolved once (a chain is walked up
    to the first flow already resolved, then written back down), so the work is linear
    in the number of flows; a server that polls (a close after every event, `retry: 0`)
    makes chains as long as its streams, and a cap on rounds judged the deep links off
    their stream."""
    has_sid = sent["stream_id"].notna().to_numpy()
    has_id = sent["event_id"].notna().to_numpy()
    named_home = (
        _key(sent["session"], sent["stream_id"]).where(sent["stream_id"].notna()).to_numpy(dtype=object)
    )
    logical = _resumption_logicals(flows, sent, base, sent_flow_pos, definer, has_sid, named_home, claimed)
    on_logical = _take(logical, sent_flow_pos, sent.index).to_numpy(dtype=object)
    home = np.where(has_sid, named_home, np.where(has_id, on_logical[definer], on_logical))
    return logical, pd.Series(home, index=sent.index, dtype="object")


def _resumption_logicals(
    flows: pd.DataFrame,
    sent: pd.DataFrame,
    base: pd.Series,
    sent_flow_pos: np.ndarray,
    definer: np.ndarray,
    has_sid: np.ndarray,
    named_home: np.ndarray,
    claimed: np.ndarray | None = None,
) -> pd.Series:
    """The logical stream of every flow: `base` for opening flows; for a resumption, the
    stream the lab's own client resumed (`claimed`, where its evidence holds), else that of
    the first send of its cursor in its session (by the definer's flow, or the stream an
    `e1` ID names), else what the cursor itself says (`_cursor_fallbacks`)."""
    n = len(flows)
    resumption = flows["resumption"].to_numpy(dtype=bool)
    logical = base.to_numpy(dtype=object, copy=True)
    if not resumption.any():
        return pd.Series(logical, index=flows.index, dtype="object")
    with_id = np.flatnonzero(sent["event_id"].notna().to_numpy())
    first_send = pd.Series(
        with_id, index=_key(sent["session"], sent["event_id"]).to_numpy(dtype=object)[with_id]
    )
    first_send = first_send[~first_send.index.duplicated(keep="first")]
    cursor = (
        _key(flows["session"], flows["last_event_id_out"]).map(first_send).fillna(-1).to_numpy(dtype="int64")
    )
    fallback = _cursor_fallbacks(flows)
    # Each resumption gets either its value now, or the earlier resumption it follows.
    parent = np.full(n, -1, dtype="int64")
    done = ~resumption
    for i in np.flatnonzero(resumption).tolist():
        c = int(cursor[i])
        if claimed is not None and claimed[i] is not None:
            logical[i], done[i] = claimed[i], True
        elif c < 0:
            logical[i], done[i] = fallback[i], True
        elif has_sid[c]:
            logical[i], done[i] = named_home[c], True
        else:
            p = int(sent_flow_pos[definer[c]])
            if p < 0:
                logical[i], done[i] = fallback[i], True
            elif not resumption[p]:
                logical[i], done[i] = logical[p], True
            else:
                parent[i] = p
    walking = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(~done).tolist():
        path = []
        j = i
        while not done[j] and not walking[j]:
            walking[j] = True
            path.append(j)
            j = int(parent[j])
        # A cycle (a cursor first sent on the flow that resumes it: a tap out of order)
        # has no opening flow to inherit from: each flow on it falls back to its cursor.
        value = logical[j] if done[j] else None
        for k in reversed(path):
            logical[k] = value if value is not None else fallback[k]
            done[k] = True
    return pd.Series(logical, index=flows.index, dtype="object")


def _claimed_logicals(ctx: Context, flows: pd.DataFrame, base: pd.Series) -> np.ndarray:
    """For each resumption flow, the logical stream the lab's own client resumed, where its
    own evidence says so; None elsewhere.

    The client's ledger names the stream it resumed on that connection (`http_exchanges`,
    purpose `resume`, `stream_key`), and its inbox shows the cursor's lineage: the event
    of that ID it accepted on that very stream. When the proxy forwarded the cursor as the
    client sent it, that stream is the one the server was asked to resume, whatever the
    IDs are: a server that counts IDs per stream sends one ID on two streams, and "the
    stream where that ID was first sent" would repeat its mistake. (A rewritten cursor, a
    client without a ledger or a cursor the client never accepted on that stream leave
    the resolution to the cursor.)"""
    out = np.full(len(flows), None, dtype=object)
    data = ctx.data
    resumption = flows["resumption"].to_numpy(dtype=bool)
    if not resumption.any() or data.client is None:
        return out
    if {"http_exchanges", "inbox"} & set(data.client_tables_absent):
        return out
    x = data.client["http_exchanges"]
    resumes = x.loc[(x["purpose"] == "resume") & x["stream_key"].notna()]
    if not len(resumes):
        return out
    asked = pd.DataFrame(
        {
            "client_id": resumes["client_id"].astype("object"),
            "conn_id": resumes["conn_id"].astype("Int64"),
            "stream_key": resumes["stream_key"].astype("object"),
            "generation": resumes["session_generation"].astype("Int64"),
            "cursor": resumes["last_event_id"].astype("object"),
        }
    ).drop_duplicates(["client_id", "conn_id"])
    inbox = data.client["inbox"]
    accepted = set(
        _key(
            inbox["client_id"],
            inbox["session_generation"].astype("Int64"),
            inbox["stream_key"],
            inbox["event_id"],
        ).tolist()
    )
    asked = asked[
        _key(asked["client_id"], asked["generation"], asked["stream_key"], asked["cursor"]).isin(accepted)
    ]
    # The stream each client key names in each session: its opening flow's logical (the
    # stream map of the opening flows; `base` is null on resumption flows).
    opened = _stream_map_tap(ctx, flows.assign(logical=base)).dropna(subset=["logical"])
    named = pd.Series(
        opened["logical"].to_numpy(dtype=object),
        index=_key(opened["client_id"], opened["session"], opened["stream_key"]),
    )
    named = named[~named.index.duplicated(keep="first")]
    mine = flows.loc[resumption, ["client_id", "conn_id", "session", "last_event_id_in", "last_event_id_out"]]
    mine = mine.reset_index().merge(asked, on=["client_id", "conn_id"], how="inner")
    as_sent = mine["last_event_id_out"].astype("object") == mine["cursor"]
    as_sent &= mine["last_event_id_in"].isna() | (mine["last_event_id_in"].astype("object") == mine["cursor"])
    mine = mine[as_sent.to_numpy()]
    value = _key(mine["client_id"], mine["session"], mine["stream_key"]).map(named)
    keep = value.notna().to_numpy()
    out[mine["index"].to_numpy()[keep]] = value.to_numpy(dtype=object)[keep]
    return out


def _cursor_fallbacks(flows: pd.DataFrame) -> np.ndarray:
    """For each resumption flow whose cursor the tap never saw sent: the stream its `e1`
    ID names, else `unknown:<flow>`. Null for other flows."""
    out = np.full(len(flows), None, dtype=object)
    cursors = flows["last_event_id_out"].to_numpy(dtype=object)
    sessions = flows["session"].to_numpy(dtype=object)
    flow_ids = flows["flow"].to_numpy(dtype=object)
    for i in np.flatnonzero(flows["resumption"].to_numpy(dtype=bool)).tolist():
        parsed = parse_event_id(str(cursors[i]))
        session = sessions[i] if isinstance(sessions[i], str) else "-"
        out[i] = f"{session}{SEP}{parsed.stream_id}" if parsed is not None else f"unknown:{flow_ids[i]}"
    return out


def _first_sends(sent: pd.DataFrame, has_id: pd.Series) -> tuple[pd.Series, pd.Series]:
    """For each send with an ID, the `order` of the first send of that (event ID, digest):
    (in the same session, in any session). Rows without ID get -1. `sent` is in `order`."""
    ids = has_id.to_numpy()
    full_s = np.full(len(sent), -1, dtype="int64")
    full_g = np.full(len(sent), -1, dtype="int64")
    if ids.any():
        rows = sent[ids]
        order = rows["order"].to_numpy()
        full_s[ids] = order[_first_of(rows["session"], rows["event_id"], rows["digest"])]
        full_g[ids] = order[_first_of(rows["event_id"], rows["digest"])]
    return pd.Series(full_s, index=sent.index), pd.Series(full_g, index=sent.index)


def _first_live_sends(sent: pd.DataFrame, live: np.ndarray) -> np.ndarray:
    """For each row, the `order` of the first live send (`live`: with an ID, not on a
    resumption) of its (event ID, digest) in any session; -1 if there is none."""
    out = np.full(len(sent), -1, dtype="int64")
    if not live.any():
        return out
    key = group_codes(sent["event_id"], sent["digest"])
    none = np.iinfo(np.int64).max
    first = np.full(int(key.max()) + 1, none, dtype="int64")
    np.minimum.at(first, key[live], sent["order"].to_numpy(dtype="int64")[live])
    found = first[key]
    has = found != none
    out[has] = found[has]
    return out


def _live_sessions_per_id(sent: pd.DataFrame, live: np.ndarray) -> np.ndarray:
    """For each row, in how many sessions the server sent its event ID live (not on a
    resumption). An ID one session's live traffic alone uses is globally unique (as the
    IDs of a server with one event store for all sessions must be); per-session counters
    are live in many sessions, and a replay under such an ID is never read as foreign."""
    out = np.zeros(len(sent), dtype="int64")
    if not live.any():
        return out
    ids, id_values = pd.factorize(sent["event_id"].to_numpy(dtype=object), use_na_sentinel=True)
    sessions, session_values = pd.factorize(sent["session"].to_numpy(dtype=object), use_na_sentinel=True)
    width = len(session_values) + 1
    pairs = np.unique(ids[live].astype("int64") * width + (sessions[live] + 1))  # live rows have an ID
    per_id = np.bincount(pairs // width, minlength=len(id_values))
    has_id = ids >= 0
    out[has_id] = per_id[ids[has_id]]
    return out


def _first_of(*columns: pd.Series) -> np.ndarray:
    """For each row, the position of the first row with the same values in `columns`."""
    _, first, inverse = np.unique(group_codes(*columns), return_index=True, return_inverse=True)
    out: np.ndarray = first[inverse.reshape(-1)]
    return out


def _send_keys(sent: pd.DataFrame) -> pd.Series:
    """What identifies one send: the event ID; for an event without ID, flow and index."""
    keys = sent["event_id"].astype("object").copy()
    no_id = keys.isna()
    if no_id.any():
        keys[no_id] = _key(sent.loc[no_id, "flow"], sent.loc[no_id, "index"])
    return keys


def _take(values: pd.Series, positions: np.ndarray, index: pd.Index) -> pd.Series:
    """values.iloc[positions], None where the position is -1 (a flow the tap has no record of)."""
    arr = values.to_numpy(dtype=object)
    out = np.full(len(positions), None, dtype=object)
    found = positions >= 0
    out[found] = arr[positions[found]]
    return pd.Series(out, index=index, dtype="object")


def _stream_map_tap(ctx: Context, flows: pd.DataFrame) -> pd.DataFrame:
    posts = flows[(flows["method"] == "POST") & flows["jsonrpc_id"].notna() & flows["client_id"].notna()]
    post_map = pd.DataFrame(
        {
            "client_id": posts["client_id"],
            "session": posts["session"],
            "stream_key": "post:" + posts["jsonrpc_id"].astype(str),
            "logical": posts["logical"],
            "flow": posts["flow"],
        }
    )
    parts = [post_map]
    exchanges = _standalone_exchanges(ctx)
    if len(exchanges):
        joined = exchanges.merge(
            flows[["client_id", "conn_id", "session", "logical", "flow"]],
            on=["client_id", "conn_id"],
            how="inner",
        )
        parts.append(joined[["client_id", "session", "stream_key", "logical", "flow"]])
    out = pd.concat(parts, ignore_index=True)
    return out.drop_duplicates(["client_id", "session", "stream_key", "logical"]).reset_index(drop=True)


def _standalone_exchanges(ctx: Context) -> pd.DataFrame:
    data = ctx.data
    if data.client is None or "http_exchanges" in data.client_tables_absent:
        return pd.DataFrame(columns=["client_id", "conn_id", "stream_key", "session_generation"])
    x = data.client["http_exchanges"]
    out = x.loc[
        (x["purpose"] == "standalone") & x["stream_key"].notna(),
        ["client_id", "conn_id", "stream_key", "session_generation"],
    ].copy()
    out["conn_id"] = out["conn_id"].astype("Int64")
    return out


def _with_server_events(tap: StreamTruth, server: StreamTruth) -> StreamTruth:
    """The tap's truth plus the events only the server ledger records. Both are records
    of what the server sent; the tap can miss some (a proxy that stopped recording, a
    tap cut short), and an event the server ledger shows is no less sent. Names of
    logical streams agree: with the server ledger present, the tap's opening flows are
    named from its `streams` table."""
    seen = set(_key(tap.sent["session"], tap.sent["event_id"], tap.sent["digest"]).tolist())
    extra = server.sent[
        ~in_keys(_key(server.sent["session"], server.sent["event_id"], server.sent["digest"]), seen)
    ]
    if not len(extra):
        return StreamTruth("tap+server", tap.flows, tap.sent, tap.stream_map, tap.shared_ids)
    # No tap flow carried it (as far as the tap knows), and it has no place in the tap's order.
    extra = extra.assign(flow=None, first_flow=None, order=-1, home_order=-1)
    sent = pd.concat([tap.sent, extra[tap.sent.columns]], ignore_index=True)
    return StreamTruth("tap+server", tap.flows, sent, tap.stream_map, tap.shared_ids)


# ---------------------------------------------------------------------------- server only


def _e1_streams(event_ids: pd.Series) -> pd.Series:
    """The stream ID field of `e1` IDs (null for other IDs): an e1 ID has exactly seven
    dot-separated fields and the stream ID is the fourth. (A list comprehension: pandas'
    `.str.split` was several times slower.)"""
    missing = pd.isna(event_ids.to_numpy(dtype=object))
    streams = []
    for value, gone in zip(event_ids.tolist(), missing.tolist(), strict=True):
        fields = [] if gone else str(value).split(".")
        streams.append(fields[3] if len(fields) == 7 and fields[0] == "e1" else np.nan)
    return pd.Series(streams, index=event_ids.index, dtype="object")


def _from_server(ctx: Context) -> StreamTruth:
    data = ctx.data
    assert data.server is not None
    st = data.server["streams"]
    flows = pd.DataFrame(
        {
            "flow": st["conn"].astype("object"),
            "conn": st["conn"].astype("object"),
            "method": st["opened_by"].astype("object"),
            "session": st["session"].astype("object"),
            "jsonrpc_id": text_ids(st["request_id"]),
            "last_event_id_out": pd.Series(np.nan, index=st.index, dtype="object"),
            "logical": _key(st["session"], st["stream_id"]),
        }
    )
    flows["client_id"], flows["conn_id"] = split_conn(flows["conn"])
    flows["resumption"] = False
    ev = data.server["events_sent"]
    on_logical = _key(ev["session"], ev["stream_id"])
    named = _e1_streams(ev["event_id"])
    sent = pd.DataFrame(
        {
            "session": ev["session"].astype("object"),
            "flow": ev["conn"].astype("object"),
            "conn": ev["conn"].astype("object"),
            "event_id": ev["event_id"].astype("object"),
            "digest": ev["digest"].astype("object"),
            "on_logical": on_logical,
            "home": _key(ev["session"], named).where(named.notna(), on_logical),
            "priming": ev["kind"] == "priming",
            "has_data": ev["kind"] != "priming",
            "t": ev["sent_at"].astype("float64"),
            "index": ev["sequence"],
            "replay": pd.to_numeric(ev["replay"], errors="coerce").fillna(0).astype(bool),
        }
    )
    sent["client_id"], _ = split_conn(sent["conn"])
    sent["send_key"] = _send_keys(sent)
    # The server's own record says which sends were replays; the order is its send time's.
    sent = sent.sort_values(["t", "index"], kind="stable").reset_index(drop=True)
    sent["order"] = np.arange(len(sent), dtype="int64")
    sent["home_order"] = sent["order"]
    sent["resend"] = sent.pop("replay")
    sent["foreign"] = False
    sent["first_flow"] = sent["flow"]
    sent[LINE] = None
    flows["has_events"] = flows["conn"].isin(sent["conn"])
    return StreamTruth("server", flows, sent, _stream_map_tap(ctx, flows))
