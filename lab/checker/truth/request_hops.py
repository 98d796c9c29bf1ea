"""Where each request of a run ended: answered, or lost at which hop of the chain — the
rules behind the report's "Unanswered requests by hop" (`lab.checker.health.unanswered`).

A request of a lab client crosses the chain Locust worker → nemesis → mitmdump (the
tap) → target, and its answer comes back the same way. When a collapse leaves thousands
of requests without an answer, the client's ledger alone blames no one: "read_timeout".
This module follows every request through the ledgers and says where it was when the
client stopped waiting — so a collapse is never blamed on the target by silence.

Matching keys (what the ledgers really carry). Every request of a lab client carries
`x-lab-conn: <client-id>:<conn-id>`, and the conn ID is counted per request by its
client, so the pair names one request:
- client ledger `http_exchanges` (`client_id`, `conn_id`): one row per request, with
  `status` (NULL: no response head reached the client), `error`, `started_at` (sent),
  `ended_at` (when the client stopped waiting);
- proxy tap `flow` records (`conn`): one per request the proxy saw, with `status` (null:
  no response came from upstream before the flow ended) and `answered_by` (`server`, or
  `proxy` for an answer the proxy made itself), `t_request` (when it reached the proxy),
  `faults`; `flow_end` (by `flow`) says how it ended (`cut_by_fault`, `client_gone`, ...);
- server ledger `requests` (`conn`, reference server only): the server writes the row as
  it answers, with the status it answered.

Where each request ended (`hop`), in the order of the chain:

    answered         the client got a response head (client `status` not null)
    client_to_proxy  the proxy never saw it: lost in the client's own connect or pool,
                     the nemesis, or mitmdump's accept (all the lab's)
    proxy_to_server  the proxy saw it, no answer came from upstream, and the server's
                     ledger has no answer either: the target never answered, or mitmdump
                     never got it there (its upstream connection); without a server
                     ledger, every unanswered flow is here
    server_to_proxy  the server's ledger has its answer, the proxy never saw it
                     (mitmdump's upstream read: the lab's)
    proxy_to_client  the proxy passed an answer (the server's or its own), the client
                     never got its head (mitmdump's write, the nemesis, the worker's loop:
                     the lab's)

A request the client ended itself (`left`, `client_stopped`, `cancelled`) less than
`resume_p99_s` after sending it gave the chain no chance: *closed early*, counted apart,
never unanswered. A loss an injected fault explains is *by fault*: a flow whose `faults`
list is not empty or that was `cut_by_fault`, or a request in flight while a nemesis toxic
that can lose requests was in place (nemesis.jsonl: any kind but `slicer`, `slow_close`
and a `latency` under 1 s, which only delay them). The rest are the run's *unanswered* requests, counted over
the run and per 10 s bin (by the time they were sent), with a few witnesses per hop.

Many: more than `MANY_SHARE` of the requests sent, or more than `MANY_PER_BIN` in one bin.
`lab.checker.health.lab_limits.unanswered_limit` then asks whether a lab part was saturated
while they went unanswered, and names it in the verdict.

Without a client ledger (a client under test keeps an application log, not this table)
the client side is not known: the requests are the tap's flows, and only the hops from
the proxy on are counted. Without a tap, no hop is known: the client's unanswered
requests are counted, where they were lost is `unknown`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.inputs.load import ROWID, SOURCE
from lab.checker.truth.faults import toxic_windows

BIN_S = 10.0
MANY_SHARE = 0.01
"""Unanswered requests are many above this share of the requests sent..."""
MANY_PER_BIN = 10
"""...or above this many in one 10 s bin."""

ANSWERED = "answered"
CLIENT_TO_PROXY = "client_to_proxy"
PROXY_TO_SERVER = "proxy_to_server"
SERVER_TO_PROXY = "server_to_proxy"
PROXY_TO_CLIENT = "proxy_to_client"
UNKNOWN = "unknown"
"""Without a tap: not answered, and where it was lost is not known."""
HOPS: dict[str, str] = {
    CLIENT_TO_PROXY: "client → proxy: never reached the proxy (client connect, nemesis, mitmdump's accept)",
    PROXY_TO_SERVER: "proxy → server: no answer from the server's side (the target, or mitmdump's connection to it)",
    SERVER_TO_PROXY: "server → proxy: the server answered, the proxy never saw it (mitmdump's upstream read)",
    PROXY_TO_CLIENT: "proxy → client: answered, the client never got it (mitmdump's write, nemesis, worker)",
}
CLIENT_SIDE = (CLIENT_TO_PROXY, PROXY_TO_CLIENT)
"""Hops only the client ledger can show."""
CLOSED_BY_CLIENT = frozenset({"left", "client_stopped", "cancelled"})
"""The client's own reasons to stop waiting (docs/ledgers.md `http_exchanges.error`)."""
CONNECTION_ERRORS = frozenset(
    {
        "connection_refused",
        "connection_reset",
        "connect_timeout",
        "connect_failed",
        "pool_timeout",
        "peer_closed_before_response",
        "write_failed",
        "write_timeout",
    }
)
"""Transport causes (lab/drivers/causes.py) that say a connection failed or broke before
any answer: before the proxy, outside a toxic, only the lab's first hops make them."""


@dataclass(frozen=True, slots=True)
class Findings:
    """Every request with where it ended, and what the run's figures are made of."""

    rows: pd.DataFrame
    """One row per request: client_id, conn_id, purpose, method, started_at, ended_at,
    error, at_proxy, tap_status, answered_by, server_status, hop, by_fault, closed_early,
    unanswered (counted: not answered, not by fault, not closed early), bin, refs."""
    client_known: bool
    """False without a client ledger: the requests are the tap's flows."""
    tap_known: bool
    """False without a tap: the hops are not known (every unanswered request is `unknown`)."""
    origin: float | None
    proxy_only: int
    """Tap flows whose conn no client ledger row has (another caller, or a lost batch)."""
    open_at_proxy_stop: int
    """Flows the proxy still held when it stopped, with no `flow` record (their conn is
    not known: the tap writes only their `flow_end`)."""
    sources: tuple[str, ...]


def findings(ctx: Context) -> Findings:
    return ctx.cached("unanswered_findings", lambda: _findings(ctx))


def _findings(ctx: Context) -> Findings:
    data = ctx.data
    tap = data.tap
    flows = _tap_flows(tap) if tap is not None else None
    server = _server_answers(data.server)
    client_known = data.client is not None and "http_exchanges" not in data.client_tables_absent
    sources = [name for name, there in (("client", client_known), ("tap", tap is not None)) if there]
    if server is not None:
        sources.append("server")
    if client_known:
        assert data.client is not None
        rows = _client_requests(data.client["http_exchanges"])
        if flows is not None:
            rows = rows.merge(flows, on=["client_id", "conn_id"], how="left")
            proxy_only = int((~_key(flows).isin(set(_key(rows)))).sum())
        else:
            proxy_only = 0
    elif flows is not None:
        rows = flows.assign(
            purpose=None,
            method=flows["flow_method"],
            started_at=flows["t_request"].fillna(flows["flow_t"]),
            ended_at=flows["end_t"].fillna(flows["flow_t"]),
            error=flows["end_reason"],
            client_status=np.nan,
        )
        proxy_only = 0
    else:
        rows = _client_requests(pd.DataFrame(columns=["client_id", "conn_id"]))
        proxy_only = 0
    for name in _TAP_COLUMNS:
        if name not in rows.columns:
            rows[name] = np.nan if name not in ("flow", "answered_by", "end_reason") else None
    rows["at_proxy"] = rows["flow"].notna()
    conn = _key(rows)
    rows["server_status"] = (
        conn.map(server).astype("float64") if server is not None else pd.Series(np.nan, index=rows.index)
    )
    rows["hop"] = _hops(rows, client_known) if tap is not None else _no_hops(rows)
    rows["by_fault"] = _by_fault(rows, _toxic_windows(ctx))
    waited = rows["ended_at"] - rows["started_at"]
    # Without the client's own word, the tap's: the client went away (`client_gone`).
    closers = CLOSED_BY_CLIENT if client_known else frozenset({"client_gone"})
    rows["closed_early"] = (
        (rows["hop"] != ANSWERED)
        & rows["error"].isin(closers)
        & (waited < ctx.budgets.resume_p99_s).fillna(False)
    )
    rows["unanswered"] = (rows["hop"] != ANSWERED) & ~rows["by_fault"] & ~rows["closed_early"]
    origin = ctx.origin
    if origin is None and len(rows) and rows["started_at"].notna().any():
        origin = float(rows["started_at"].min())
    rows["bin"] = (
        np.floor((rows["started_at"] - origin) / BIN_S).astype("Int64")
        if origin is not None
        else pd.Series(pd.NA, index=rows.index, dtype="Int64")
    )
    return Findings(
        rows=rows.sort_values("started_at", kind="stable").reset_index(drop=True),
        client_known=client_known,
        tap_known=tap is not None,
        origin=origin,
        proxy_only=proxy_only,
        open_at_proxy_stop=_open_at_proxy_stop(tap),
        sources=tuple(sources),
    )


_TAP_COLUMNS = ("flow", "flow_t", "t_request", "tap_status", "answered_by", "faulted", "_line", "end_reason")


def _client_requests(ex: pd.DataFrame) -> pd.DataFrame:
    def col(name: str) -> pd.Series:
        return ex[name] if name in ex.columns else pd.Series(None, index=ex.index, dtype="object")

    out = pd.DataFrame(
        {
            "client_id": col("client_id").astype("object"),
            "conn_id": pd.to_numeric(col("conn_id"), errors="coerce").astype("Int64"),
            "purpose": col("purpose").astype("object"),
            "method": col("method").astype("object"),
            "started_at": pd.to_numeric(col("started_at"), errors="coerce").astype("float64"),
            "ended_at": pd.to_numeric(col("ended_at"), errors="coerce").astype("float64"),
            "error": col("error").astype("object"),
            "client_status": pd.to_numeric(col("status"), errors="coerce").astype("float64"),
        }
    )
    for name in (SOURCE, ROWID):
        if name in ex.columns:
            out[name] = ex[name].to_numpy()
    return out


def _tap_flows(tap: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per tap flow: client_id, conn_id (from `conn`), flow, flow_t, t_request,
    tap_status, answered_by, faulted, _line, end_reason, end_t, flow_method."""
    flows = tap["flow"].drop_duplicates("flow", keep="last")
    client, conn = split_conn(flows["conn"])
    ends = tap["flow_end"].drop_duplicates("flow", keep="last").set_index("flow")
    faults = flows["faults"] if "faults" in flows.columns else pd.Series(None, index=flows.index)
    out = pd.DataFrame(
        {
            "client_id": client,
            "conn_id": conn,
            "flow": flows["flow"].astype("object"),
            "flow_t": pd.to_numeric(flows["t"], errors="coerce").astype("float64"),
            "t_request": pd.to_numeric(flows["t_request"], errors="coerce").astype("float64")
            if "t_request" in flows.columns
            else np.nan,
            "tap_status": pd.to_numeric(flows["status"], errors="coerce").astype("float64"),
            "answered_by": flows["answered_by"].astype("object"),
            "faulted": [isinstance(f, list) and len(f) > 0 for f in faults.tolist()],
            "_line": flows["_line"].to_numpy() if "_line" in flows.columns else None,
            "end_reason": flows["flow"].map(ends["reason"]).astype("object"),
            "end_t": pd.to_numeric(flows["flow"].map(ends["t"]), errors="coerce").astype("float64"),
            "flow_method": flows["method"].astype("object"),
        }
    )
    return out[out["client_id"].notna() & out["conn_id"].notna()].drop_duplicates(["client_id", "conn_id"])


def _key(frame: pd.DataFrame) -> pd.Series:
    """`x-lab-conn` as written: "<client_id>:<conn_id>" (a plain comprehension: several
    times faster than adding pandas string columns)."""
    keys = [f"{c}:{n}" for c, n in zip(frame["client_id"].tolist(), frame["conn_id"].tolist(), strict=True)]
    return pd.Series(keys, index=frame.index, dtype="object")


def _server_answers(server: dict[str, pd.DataFrame] | None) -> dict[str, float] | None:
    """conn -> the status the reference server answered (its `requests` rows)."""
    if server is None or "requests" not in server:
        return None
    req = server["requests"]
    req = req[req["conn"].notna()]
    status = pd.to_numeric(req["status"], errors="coerce").astype("float64")
    return dict(zip(req["conn"].astype(str), status.tolist(), strict=True))


def _open_at_proxy_stop(tap: dict[str, pd.DataFrame] | None) -> int:
    if tap is None:
        return 0
    ends = tap["flow_end"]
    stopped = ends.loc[ends["reason"] == "proxy_stopped", "flow"]
    return int((~stopped.isin(set(tap["flow"]["flow"]))).sum())


def _no_hops(rows: pd.DataFrame) -> pd.Series:
    got = rows["client_status"].notna().to_numpy(dtype=bool)
    return pd.Series(np.where(got, ANSWERED, UNKNOWN), index=rows.index, dtype="object")


def _hops(rows: pd.DataFrame, client_known: bool) -> pd.Series:
    got = rows["client_status"].notna() if client_known else rows["tap_status"].notna()
    at_proxy = rows["at_proxy"]
    upstream_silent = at_proxy & rows["tap_status"].isna()
    server_said = rows["server_status"].notna()
    hop = np.select(
        [
            got.to_numpy(dtype=bool),
            (~at_proxy).to_numpy(dtype=bool),
            (upstream_silent & ~server_said).to_numpy(dtype=bool),
            (upstream_silent & server_said).to_numpy(dtype=bool),
        ],
        [ANSWERED, CLIENT_TO_PROXY, PROXY_TO_SERVER, SERVER_TO_PROXY],
        default=PROXY_TO_CLIENT,
    )
    return pd.Series(hop, index=rows.index, dtype="object")


def _toxic_windows(ctx: Context) -> list[tuple[float, float]]:
    """(start, end) of every nemesis toxic that can lose a request (`LOSSLESS` ones only
    delay it); an unclosed one ends at the run's stop."""
    return [(w.start, w.end) for w in toxic_windows(ctx) if _loses(w.kind, w.attributes)]


LOSSLESS = frozenset({"slicer", "slow_close"})
"""Toxics that only delay or reshape bytes; `latency` too, under `SLOW_TOXIC_MS`."""
SLOW_TOXIC_MS = 1000.0
"""A latency toxic of this much (latency + jitter) or more can outlast a client's wait."""


def _loses(kind: object, attributes: object) -> bool:
    if kind in LOSSLESS:
        return False
    if kind == "latency":
        a = attributes if isinstance(attributes, dict) else {}
        total = sum(float(v) for v in (a.get("latency"), a.get("jitter")) if isinstance(v, int | float))
        return total >= SLOW_TOXIC_MS
    return True


def _by_fault(rows: pd.DataFrame, windows: list[tuple[float, float]]) -> pd.Series:
    faulted = rows["faulted"].astype("boolean").fillna(False).astype(bool)
    cut = rows["end_reason"].eq("cut_by_fault").fillna(False).astype(bool)
    during = np.zeros(len(rows), dtype=bool)
    start = rows["started_at"].to_numpy(dtype="float64")
    end = rows["ended_at"].fillna(rows["started_at"]).to_numpy(dtype="float64")
    for lo, hi in windows:
        during |= (start < hi) & (end >= lo)
    return (rows["hop"] != ANSWERED) & (faulted | cut | pd.Series(during, index=rows.index))


# ---------------------------------------------------------------------------- how many


def many(rows: pd.DataFrame, sent: int) -> bool:
    """`rows` (a subset of the findings' rows) are many: above MANY_SHARE of the requests
    sent, or above MANY_PER_BIN in one bin."""
    if not len(rows):
        return False
    if len(rows) > MANY_SHARE * max(sent, 1):
        return True
    per_bin = rows["bin"].dropna().value_counts()
    return bool(len(per_bin) and int(per_bin.max()) > MANY_PER_BIN)


def window(rows: pd.DataFrame) -> tuple[float, float] | None:
    """The stretch of time `rows` cover: from the first sent to the last given up, over
    the bins holding more than MANY_PER_BIN of them (all of them when no bin does)."""
    if not len(rows):
        return None
    per_bin = rows["bin"].value_counts()
    hot = per_bin[per_bin > MANY_PER_BIN].index
    pick = rows[rows["bin"].isin(hot)] if len(hot) else rows
    start = float(pick["started_at"].min())
    end = float(pick["ended_at"].fillna(pick["started_at"]).max())
    return (start, max(end, start + 1.0))


def counted(f: Findings) -> pd.DataFrame:
    """The run's unanswered requests (not answered, not by fault, not closed early)."""
    return f.rows[f.rows["unanswered"]]


def connection_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """Of `rows`, the unanswered requests lost before the proxy with a connection error."""
    return rows[rows["unanswered"] & (rows["hop"] == CLIENT_TO_PROXY) & rows["error"].isin(CONNECTION_ERRORS)]
