"""Gate 3's server checks, from the wire: a terminated session must get 404, and a
request without a session ID must not be served.

`terminated_session_not_404`: once the server has answered a `DELETE` of a session with
2xx — the proxy's own `kill_session` DELETE (tap `fault` record, `detail.delete_status`,
`t` when its answer came) or a client's DELETE (tap `flow` record, method DELETE,
answered by the server) — the session is terminated, and every request carrying it
that *started after that answer* must get **404** (every revision, § Session Management
item 3). A server that answers such a request otherwise fails gate 3, attributed to the
server: 400 (`unknown-session-400`), 2xx (`deleted-session-alive`: the DELETE was
acknowledged but the session lives on), a 5xx...

When a request started is the client ledger's `http_exchanges.started_at` of its
connection (`x-lab-conn`); a request the client ledger does not place is not judged
(the tap's own time for a flow is when its answer passed, which cannot tell a request
sent after the DELETE from one already in flight). Statuses that refuse a request before
its session is looked at — Origin (403), authorization (401), Host (421), load (429,
503), the request's own shape (406, 408, 413, 415, 431) — say nothing about the session
and are not judged either; nor is a request whose session ID the proxy removed.

`served_without_session`: a POST (other than initialize) whose `MCP-Session-Id` the
proxy removed (fault `strip_session_id`, listed in the flow's `faults`), answered 2xx by
the server: a request that names no session must get 400 (every revision, § Session
Management item 2). Other refusals are counted, not judged.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.explain import at, present, row_of, tap_ref
from lab.checker.model import Attribution, Witness

CHECK = "terminated_session_not_404"
NOT_ABOUT_THE_SESSION = frozenset({401, 403, 406, 408, 413, 415, 421, 429, 431, 503})
"""Refusals a server may give before it looks at the session."""

COLUMNS = [
    "flow",
    "conn",
    "method",
    "session",
    "status",
    "started_at",
    "ended_at",
    "deleted_at",
    "deleted_by",
    "_line",
]


def terminations(ctx: Context) -> pd.DataFrame:
    """session, deleted_at (epoch s, the first 2xx answer to a DELETE of it), deleted_by
    (`kill_session` or `client`), decision (the fault's, if any), _line (its tap line)."""
    tap = ctx.data.tap
    empty = pd.DataFrame(columns=["session", "deleted_at", "deleted_by", "decision", "_line"])
    if tap is None:
        return empty
    parts = []
    faults = tap["fault"]
    if len(faults):
        kills = faults[faults["fault"] == "kill_session"]
        detail = kills["detail"].map(lambda d: d if isinstance(d, dict) else {})
        status = pd.to_numeric(detail.map(lambda d: d.get("delete_status")), errors="coerce")
        ok = kills[((status >= 200) & (status < 300)).to_numpy()]
        parts.append(
            pd.DataFrame(
                {
                    "session": detail[ok.index].map(lambda d: d.get("session")).astype("object"),
                    "deleted_at": ok["t"].astype("float64"),
                    "deleted_by": "kill_session",
                    "decision": ok["decision"].astype("object"),
                    "_line": ok["_line"] if "_line" in ok.columns else None,
                }
            )
        )
    flows = tap["flow"]
    status = pd.to_numeric(flows["status"], errors="coerce")
    deletes = flows[
        (flows["method"] == "DELETE")
        & (flows["answered_by"] == "server")
        & (status >= 200)
        & (status < 300)
        & flows["session"].notna()
    ]
    parts.append(
        pd.DataFrame(
            {
                "session": deletes["session"].astype("object"),
                "deleted_at": deletes["t"].astype("float64"),
                "deleted_by": "client",
                "decision": None,
                "_line": deletes["_line"] if "_line" in deletes.columns else None,
            }
        )
    )
    out = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else empty
    out = out[out["session"].notna()]
    return out.sort_values("deleted_at", kind="stable").drop_duplicates("session").reset_index(drop=True)


def after_termination(ctx: Context) -> pd.DataFrame:
    """Every tap flow the server answered whose request carried a terminated session and
    started after the termination was answered, with `started_at` (client ledger),
    `deleted_at`, `deleted_by`, and `ok` (it got 404, or a refusal not about the session)."""
    return ctx.cached("wire_after_termination", lambda: _after(ctx))


def _after(ctx: Context) -> pd.DataFrame:
    ended = terminations(ctx)
    tap = ctx.data.tap
    if tap is None or not len(ended) or ctx.data.client is None:
        return pd.DataFrame(columns=[*COLUMNS, "ok", "decision"])
    flows = tap["flow"]
    flows = flows[(flows["answered_by"] == "server") & flows["session"].notna() & flows["conn"].notna()]
    # A request whose session ID the proxy removed (strip_session_id) never named the
    # session to the server: `served_without_session` judges it, not this check.
    flows = flows[flows["faults"].map(_stripped_by).isna().to_numpy()]
    flows = flows.merge(
        ended.rename(columns={"_line": "_deleted_line"}), on="session", how="inner", validate="many_to_one"
    )
    if not len(flows):
        return pd.DataFrame(columns=[*COLUMNS, "ok", "decision"])
    client_id, conn_id = split_conn(flows["conn"])
    flows = flows.assign(client_id=client_id.to_numpy(), conn_id=conn_id.to_numpy())
    ex = ctx.require_client("http_exchanges")[["client_id", "conn_id", "started_at", "ended_at"]].copy()
    ex["conn_id"] = pd.to_numeric(ex["conn_id"], errors="coerce").astype("Int64")
    ex = ex.drop_duplicates(["client_id", "conn_id"])
    joined = flows.merge(ex, on=["client_id", "conn_id"], how="inner")
    started = pd.to_numeric(joined["started_at"], errors="coerce")
    later = joined[(started > joined["deleted_at"].astype("float64")).to_numpy()].copy()
    status = pd.to_numeric(later["status"], errors="coerce")
    later = later[status.notna().to_numpy()]
    codes = pd.to_numeric(later["status"], errors="coerce").astype("int64")
    later["ok"] = (codes == 404) | codes.isin(NOT_ABOUT_THE_SESSION)
    return later.sort_values("started_at", kind="stable").reset_index(drop=True)


def violations(ctx: Context) -> pd.DataFrame:
    judged = after_termination(ctx)
    if not len(judged):
        return judged
    return judged[~judged["ok"].astype(bool)]


def witness(row: pd.Series, ctx: Context) -> Witness:
    status = int(row["status"])
    what = "served it" if 200 <= status < 300 else f"answered {status}"
    by = (
        "the proxy's kill_session DELETE"
        if row["deleted_by"] == "kill_session"
        else "the client's own DELETE"
    )
    gap = float(row["started_at"]) - float(row["deleted_at"])
    text = (
        f"session {row['session']} was terminated: the server answered {by} with 2xx "
        f"{at(row['deleted_at'], ctx.origin)}; a {row['method']} carrying it (connection {row['conn']}, flow "
        f"{row['flow']}), started {gap:.3f} s after that, got {status} — the server {what} instead of 404 "
        "for a terminated session"
    )
    fields = row_of(
        row, ["session", "flow", "conn", "method", "status", "started_at", "deleted_at", "deleted_by"]
    )
    refs = tap_ref(row) + tap_ref(row, prefix="_deleted")
    decision = row.get("decision")
    if present(decision) and str(decision):
        refs.append(f"fault:{decision}")
    return Witness(CHECK, text, Attribution.SERVER, fields, tuple(refs))


# ------------------------------------------------------------- served_without_session

WITHOUT_SESSION = "served_without_session"
STRIP_SESSION_ID = "strip_session_id"


def without_session(ctx: Context) -> pd.DataFrame:
    """Every tap flow the server answered after the proxy removed its `MCP-Session-Id`
    (the fault `strip_session_id`: a POST other than initialize, after the handshake),
    with `served` (answered 2xx). A request without the session ID must get 400 (every
    revision, § Session Management item 2); refusals not about the session (Origin,
    token, load, shape) are not judged."""
    return ctx.cached("wire_without_session", lambda: _without(ctx))


def _without(ctx: Context) -> pd.DataFrame:
    tap = ctx.data.tap
    empty = pd.DataFrame(columns=["flow", "conn", "method", "session", "status", "t", "served", "decision"])
    if tap is None:
        return empty
    flows = tap["flow"]
    flows = flows[flows["answered_by"] == "server"]
    decision = flows["faults"].map(_stripped_by)
    flows = flows.assign(decision=decision)[decision.notna().to_numpy()]
    status = pd.to_numeric(flows["status"], errors="coerce")
    flows = flows[(status.notna() & ~status.isin(NOT_ABOUT_THE_SESSION)).to_numpy()]
    if not len(flows):
        return empty
    codes = pd.to_numeric(flows["status"], errors="coerce").astype("int64")
    flows = flows.assign(served=((codes >= 200) & (codes < 300)).to_numpy())
    return flows.sort_values("t", kind="stable").reset_index(drop=True)


def _stripped_by(faults: object) -> str | None:
    """The decision of the flow's `strip_session_id` fault, if one acted on it."""
    if isinstance(faults, list):
        for f in faults:
            if isinstance(f, dict) and f.get("fault") == STRIP_SESSION_ID:
                return str(f.get("decision") or "")
    return None


def served_without_session(ctx: Context) -> pd.DataFrame:
    judged = without_session(ctx)
    return judged[judged["served"].astype(bool)] if len(judged) else judged


def without_session_witness(row: pd.Series, ctx: Context) -> Witness:
    text = (
        f"the proxy removed MCP-Session-Id from a {row['method']} of session {row['session']} after its "
        f"handshake (connection {row['conn']}, flow {row['flow']}); the server answered {int(row['status'])} "
        f"{at(row['t'], ctx.origin)}: it served a request that named no session, where the rule is 400"
    )
    fields = row_of(row, ["flow", "conn", "method", "session", "status", "t"])
    refs = tap_ref(row)
    if present(row.get("decision")) and str(row["decision"]):
        refs.append(f"fault:{row['decision']}")
    return Witness(WITHOUT_SESSION, text, Attribution.SERVER, fields, tuple(refs))


__all__ = [
    "CHECK",
    "WITHOUT_SESSION",
    "after_termination",
    "served_without_session",
    "terminations",
    "violations",
    "without_session",
    "without_session_witness",
    "witness",
]
