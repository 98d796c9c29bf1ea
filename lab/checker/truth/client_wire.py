"""A client under test on the wire: every request it made, as the proxy tap saw it, in
the order it made them, and what it did after losing a stream or a session.

Clients are named by the `x-lab-conn` header the lab gives them at start
(`<client-id>:<n>`, the shipped adapters number each request; docs/clients.md), so each
tap `flow` record belongs to one client. Times: `t_req` is when the request reached the
proxy (the tap's `t_request`; its `t`, the answer's time, for a tap that lacks it), `t`
when the answer's head passed back to the client, `end_t` when the flow ended.

Frames (cached per run, all built from files only):

    flows     one row per flow of a client: flow, client_id, conn_id, t_req, t, end_t,
              end_reason, method, stream, session, session_out, rpc_method, rpc_id,
              version (MCP-Protocol-Version as the client sent it), key (idempotency key), cursor (Last-Event-ID as the client sent it), status,
              answered_by, faults (fault kinds, comma-joined), advised_s (the Retry-After
              of a 429/503 answer, seconds, where the run says what it was), retry_s (the
              last SSE `retry` the client was sent on the flow, seconds), ids (the event
              IDs forwarded to the client on it, in order), answered (a call's answer
              passed on it and nothing it carried was dropped), stream_flow, tap_line (its line)
    attempts  one row per reconnect attempt: flow, client_id, kind (resume, reopen,
              reinitialize, resend), t_req, previous (the flow whose loss it answers),
              previous_line, lost_at, advised_s, advice (where the advice came
              from), waited_s, tap_line

The **intended stream** of a flow is the stream the client means by it: a POST's or a
standalone GET's own flow; for a resumption, the intended stream of the flow on which
the client was sent the event whose ID it resumes from (whatever stream the server then
replays). It is named by the flow that opened it (`stream_flow`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn, text_ids
from lab.checker.explain import present
from lab.checker.inputs.jsonl import LINE

RETRY_STATUSES = (429, 503)


def flows(ctx: Context) -> pd.DataFrame:
    return ctx.cached("client_wire_flows", lambda: _flows(ctx))


def truth_context(ctx: Context) -> Context:
    """The context to find where events belong in (lab.checker.truth.streams): the run's own,
    unless an adapter sent one `x-lab-conn` value on several requests (it could not number
    them, docs/clients.md); the server ledger's streams, joined to the tap by that value,
    would then all name a client's first stream, so the truth comes from the tap alone."""

    def make() -> Context:
        conns = ctx.data.tap_records("flow").drop_duplicates("flow")["conn"].dropna()
        if ctx.data.server is None or not conns.duplicated().any():
            return ctx
        return Context(replace(ctx.data, server=None), ctx.budgets, ctx.witness_limit)

    return ctx.cached("client_wire_truth_context", make)


def attempts(ctx: Context) -> pd.DataFrame:
    return ctx.cached("client_wire_attempts", lambda: _attempts(flows(ctx)))


def _storm_advice(run: dict[str, Any] | None) -> dict[str, float | None]:
    """rule ID -> the Retry-After (s) its 429/503 answers carried (None: no header)."""
    scenario = (run or {}).get("scenario")
    out: dict[str, float | None] = {}
    for rule in (scenario or {}).get("faults", []) if isinstance(scenario, dict) else []:
        if not isinstance(rule, dict) or rule.get("kind") != "storm":
            continue
        params = rule.get("params") or {}
        after = params.get("retry_after")
        sends = params.get("send_retry_after", True)
        out[str(rule.get("id"))] = (
            float(math.ceil(after)) if sends and isinstance(after, int | float) else None
        )
    return out


def _server_advice(run: dict[str, Any] | None) -> float | None:
    """The reference server's Retry-After (s) on its own 429/503 (None for another target)."""
    scenario = (run or {}).get("scenario")
    target = scenario.get("target") if isinstance(scenario, dict) else None
    if not isinstance(target, dict) or target.get("kind") != "reference":
        return None
    after = target.get("retry_after")
    return float(after) if isinstance(after, int | float) and after > 0 else None


def _flows(ctx: Context) -> pd.DataFrame:
    tap = ctx.data.tap_records("flow").drop_duplicates("flow", keep="last")
    client_id, conn_id = split_conn(tap["conn"])
    keep = client_id.notna().to_numpy()
    tap, client_id, conn_id = tap[keep], client_id[keep], conn_id[keep]
    t = tap["t"].astype("float64")
    t_req = pd.to_numeric(tap["t_request"], errors="coerce") if "t_request" in tap.columns else t
    ends = ctx.data.tap_records("flow_end").drop_duplicates("flow", keep="first").set_index("flow")
    storms, server_after = _storm_advice(ctx.data.run), _server_advice(ctx.data.run)
    status = pd.to_numeric(tap["status"], errors="coerce")
    faults = tap["faults"].map(lambda fs: fs if isinstance(fs, list) else [])
    advised = []
    for fs, st, by in zip(faults.tolist(), status.tolist(), tap["answered_by"].tolist(), strict=True):
        value = None
        if st in RETRY_STATUSES:
            rules = [str(f.get("rule")) for f in fs if isinstance(f, dict) and f.get("fault") == "storm"]
            value = storms.get(rules[0]) if rules else (server_after if by == "server" else None)
        advised.append(value)
    out = pd.DataFrame(
        {
            "flow": tap["flow"].astype("object").to_numpy(),
            "client_id": client_id.to_numpy(dtype=object),
            "conn_id": conn_id.to_numpy(),
            "t_req": t_req.fillna(t).to_numpy(dtype="float64"),
            "t": t.to_numpy(),
            "method": tap["method"].astype("object").to_numpy(),
            "stream": tap["stream"].astype("object").to_numpy() if "stream" in tap.columns else None,
            "session": tap["session"].astype("object").to_numpy(),
            "session_out": tap["session_out"].astype("object").to_numpy()
            if "session_out" in tap.columns
            else None,
            "rpc_method": tap["jsonrpc_method"].astype("object").to_numpy(),
            "rpc_id": text_ids(tap["jsonrpc_id"]).to_numpy(),
            "version": tap["protocol_version_in"].astype("object").to_numpy()
            if "protocol_version_in" in tap.columns
            else None,
            "key": tap["idempotency_key"].astype("object").to_numpy(),
            "tool": tap["tool"].astype("object").to_numpy() if "tool" in tap.columns else None,
            "cursor": tap["last_event_id_in"].astype("object").to_numpy(),
            "status": status.to_numpy(),
            "answered_by": tap["answered_by"].astype("object").to_numpy(),
            "faults": [
                ",".join(str(x.get("fault")) for x in fs if isinstance(x, dict)) for fs in faults.tolist()
            ],
            "advised_s": pd.Series(advised, dtype="float64").to_numpy(),
            "tap_line": tap[LINE].to_numpy() if LINE in tap.columns else None,
        }
    )
    out["end_t"] = out["flow"].map(ends["t"]).astype("float64") if len(ends) else np.nan
    out["end_reason"] = out["flow"].map(ends["reason"]).astype("object") if len(ends) else None
    _add_events(ctx, out)
    out = out.sort_values(["client_id", "t_req", "conn_id"], kind="stable").reset_index(drop=True)
    out["stream_flow"] = pd.Series(_intended_streams(out), index=out.index, dtype="object")
    return out


def _add_events(ctx: Context, out: pd.DataFrame) -> None:
    """`ids`: the event IDs forwarded to the client on each flow (in order); `retry_s`: the
    last SSE `retry` the server sent on it (seconds)."""
    fwd = ctx.data.tap_records("forwarded")
    fwd = fwd[fwd["event_id"].notna()].sort_values(["t", "index"], kind="stable")
    ids: dict[object, list[str]] = defaultdict(list)
    for flow, event_id in zip(fwd["flow"].tolist(), fwd["event_id"].tolist(), strict=True):
        ids[flow].append(str(event_id))
    out["ids"] = [ids.get(f, []) for f in out["flow"].tolist()]
    sent = ctx.data.tap_records("sent")
    # `answered`: a call's answer passed on the flow (a tap `result` record) and no event with
    # a message was dropped there: the flow served its call whole.
    dropped = ctx.data.tap_records("dropped")
    priming = set(
        zip(
            sent.loc[sent["priming"].fillna(False).astype(bool), "flow"],
            sent.loc[sent["priming"].fillna(False).astype(bool), "index"],
            strict=True,
        )
    )
    harmed = {
        f
        for f, i in zip(dropped["flow"].tolist(), dropped["index"].tolist(), strict=True)
        if (f, i) not in priming
    }
    results = set(ctx.data.tap_records("result")["flow"].tolist())
    out["answered"] = [f in results and f not in harmed for f in out["flow"].tolist()]
    if "retry" in sent.columns:
        advised = sent[pd.to_numeric(sent["retry"], errors="coerce").notna()].sort_values("t", kind="stable")
        last = (
            advised.drop_duplicates("flow", keep="last").set_index("flow")["retry"].astype("float64") / 1000
        )
        out["retry_s"] = out["flow"].map(last).astype("float64")
    else:
        out["retry_s"] = np.nan


def _intended_streams(f: pd.DataFrame) -> list[object]:
    """The flow that opened each flow's intended stream (see the module docstring); a
    resumption whose cursor the client was never sent names itself."""
    where: dict[tuple[object, str], object] = {}
    """(client, event ID) -> the intended stream of the flow that carried it to the client."""
    out: list[object] = []
    for client, flow, cursor, method, ids in zip(
        f["client_id"].tolist(),
        f["flow"].tolist(),
        f["cursor"].tolist(),
        f["method"].tolist(),
        f["ids"].tolist(),
        strict=True,
    ):
        stream = flow
        if method == "GET" and present(cursor):
            stream = where.get((client, str(cursor)), flow)
        out.append(stream)
        for event_id in ids:
            where.setdefault((client, event_id), stream)
    return out


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of a frame as dicts (column -> value), for the loops that walk them in order."""
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def lost_at(row: dict[str, Any]) -> float:
    """When a flow stopped serving the client: its answer's time for an error status (the
    request was refused), else the end of its stream (or of its answer, if no end was seen)."""
    status = row["status"]
    if present(status) and status >= 400:
        return float(row["t"])
    return float(row["end_t"]) if present(row["end_t"]) else float(row["t"])


def _attempts(f: pd.DataFrame) -> pd.DataFrame:
    """Reconnect attempts, each with the flow whose loss it answers and the advice it had."""
    rows: list[dict[str, Any]] = []
    for _client, mine in f.groupby("client_id", sort=False):
        rows += _client_attempts(mine)
    columns = [
        "flow",
        "client_id",
        "kind",
        "t_req",
        "previous",
        "previous_line",
        "lost_at",
        "advised_s",
        "advice",
        "waited_s",
        "tap_line",
    ]
    return pd.DataFrame(rows, columns=columns)


def _client_attempts(mine: pd.DataFrame) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    last_on_stream: dict[object, dict[str, Any]] = {}
    """intended stream -> the last flow of it (a resumption answers the loss of the last one)."""
    last_get: dict[object, dict[str, Any]] = {}
    """session -> the last GET without a cursor (the standalone stream)."""
    keys: dict[object, dict[str, Any]] = {}
    had_session = False
    gone: dict[str, Any] | None = None
    """The last flow answered 404 (session gone) or 429/503 before an initialize."""
    for row in records(mine):
        kind: str | None = None
        previous: dict[str, Any] | None = None
        if row["method"] == "GET" and present(row["cursor"]):
            kind, previous = "resume", last_on_stream.get(row["stream_flow"])
        elif row["method"] == "GET":
            previous = last_get.get(row["session"])
            kind = "reopen" if previous is not None else None
            last_get[row["session"]] = row
        elif row["rpc_method"] == "initialize" and not present(row["session"]):
            kind = "reinitialize" if had_session else None
            previous = gone
        elif row["rpc_method"] == "tools/call" and present(row["key"]):
            previous = keys.get(row["key"])
            kind = "resend" if previous is not None else None
            keys.setdefault(row["key"], row)
        if kind is not None:
            advised, advice = None, None
            if previous is not None and present(previous["advised_s"]):
                advised, advice = (
                    previous["advised_s"],
                    f"Retry-After of its {int(previous['status'])} answer",
                )
            elif previous is not None and present(previous["retry_s"]):
                advised, advice = previous["retry_s"], "the SSE retry of the stream"
            lost = lost_at(previous) if previous is not None else math.nan
            out.append(
                {
                    "flow": row["flow"],
                    "client_id": row["client_id"],
                    "kind": kind,
                    "t_req": row["t_req"],
                    "previous": None if previous is None else previous["flow"],
                    "previous_line": None if previous is None else previous["tap_line"],
                    "lost_at": lost,
                    "advised_s": advised if present(advised) else math.nan,
                    "advice": advice,
                    "waited_s": row["t_req"] - lost,
                    "tap_line": row["tap_line"],
                }
            )
        last_on_stream[row["stream_flow"]] = row
        if present(row["session"]) or present(row["session_out"]):
            had_session = True
        if (row["status"] == 404 and present(row["session"])) or (
            row["rpc_method"] == "initialize" and row["status"] in RETRY_STATUSES
        ):
            gone = row
    return out


def ref(row: Mapping[str, Any] | pd.Series, column: str = "tap_line") -> list[str]:
    """`proxy/tap.jsonl:<line>` of a flow row (or of the line in `column`)."""
    line = row.get(column)
    return [f"proxy/tap.jsonl:{int(line)}"] if line is not None and present(line) else []


def describe(row: Mapping[str, Any] | pd.Series) -> str:
    """A flow in words: `GET with Last-Event-ID e1.…, session s_…, conn c:7`."""
    get = row.get
    method, rpc = get("method"), get("rpc_method")
    what = f"{method} {rpc}" if present(rpc) else str(method)
    if present(get("key")):
        what += f" (call {get('key')})"
    if method == "GET":
        what += f" with Last-Event-ID {get('cursor')}" if present(get("cursor")) else " without Last-Event-ID"
    session = get("session")
    what += f", session {session}" if present(session) else ", no session ID"
    conn = get("conn_id")
    if isinstance(conn, int | float) and present(conn):
        what += f", connection {get('client_id')}:{int(conn)}"
    return what
