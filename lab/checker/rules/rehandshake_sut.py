"""Gate 3 for a client under test, from the wire — a request that carried a session ID,
got 404, and did not lead to a new handshake (budget: missing_rehandshake_max, 0).

From the proxy tap alone (lab.checker.truth.client_wire): for every flow of a client that
carried a session ID and was answered 404 (DELETEs excluded: a 404 to a leaving
client's DELETE only says the session is already gone), the client's *next* request is
its first flow that reached the proxy after the 404 reached the client (requests already
under way then are not "next"). The 404 is handled when that next request is an
`initialize` without a session ID, or carries another (newer) session. A violation when
the next request carried the dead session ID again (the client kept using it), was an
`initialize` carrying a session ID, or was any other request without a session. A 404
after which the client made no request is counted (`no_next_request`), not a violation.

Evidence: session 404s >= max(1, min_404); the events evidence. Attribution: client,
with the 404 flow and the next flow as witnesses (tap lines).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, present, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.truth import client_wire

TRUTH_FROM = "the wire (the proxy's record): each client's requests in the order they reached the proxy"


def session_404s(flows: pd.DataFrame) -> pd.DataFrame:
    """Flows that carried a session ID and got 404 (DELETEs excluded)."""
    return flows[(flows["status"] == 404) & flows["session"].notna() & (flows["method"] != "DELETE")]


def judged(flows: pd.DataFrame) -> pd.DataFrame:
    """Each session 404 with its client's next request (`next_*` columns) and `outcome`."""
    lost = session_404s(flows)
    rows: list[dict[str, Any]] = []
    by_client = {c: g for c, g in flows.groupby("client_id", sort=False)}
    for r in client_wire.records(lost):
        mine = by_client[r["client_id"]]
        after = mine[mine["t_req"] > r["t"]]
        nxt = after.iloc[0] if len(after) else None
        rows.append({**r, **_next(nxt), "outcome": _outcome(r, nxt)})
    out = pd.DataFrame(rows)
    if not len(out):
        out = pd.DataFrame(columns=[*flows.columns, "outcome"])
    return out


def _next(nxt: pd.Series | None) -> dict[str, Any]:
    names = ("flow", "t_req", "method", "rpc_method", "key", "session", "conn_id", "cursor", "tap_line")
    return {f"next_{n}": (None if nxt is None else nxt[n]) for n in names}


def _outcome(r: dict[str, Any], nxt: pd.Series | None) -> str:
    if nxt is None:
        return "no_next_request"
    carried = present(nxt["session"])
    if nxt["rpc_method"] == "initialize":
        return "violation: an initialize that carried a session ID" if carried else "initialize"
    if not carried:
        return "violation: a request without a session ID and no initialize"
    if nxt["session"] == r["session"]:
        return "violation: it kept using the dead session ID"
    return "newer_session"


def check(ctx: Context) -> GateResult:
    flows = client_wire.flows(ctx)
    j = judged(flows)
    bad = j[j["outcome"].astype(str).str.startswith("violation")] if len(j) else j
    count = len(bad)
    budget = ctx.budgets.missing_rehandshake_max
    need = max(1, ctx.budgets.min_404)
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "404s to requests with a session",
            need,
            len(j),
            len(j) >= need,
            "from the proxy's record",
            from_faults=True,
        ),
    ]
    outcomes = j["outcome"].value_counts().to_dict() if len(j) else {}
    kept = int(bad["client_id"].nunique()) if count else 0
    return GateResult(
        verdict=decide(count > budget, evidence),
        summary=(
            f"{count} of {len(j)} session 404s not followed by a new initialize (budget {budget}); "
            f"{kept} client(s) kept a dead session ID"
        ),
        budget={"missing_rehandshake_max": budget, "min_404": need},
        measured={
            "session_404s": len(j),
            "rehandshaken": int(outcomes.get("initialize", 0)),
            "already_newer_session": int(outcomes.get("newer_session", 0)),
            "no_next_request": int(outcomes.get("no_next_request", 0)),
            "violations": count,
            "clients_in_violation": kept,
        },
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(_witness(r, ctx) for _, r in _spread(bad).head(ctx.witness_limit).iterrows()),
        attribution_counts={"client": count},
        truth_from=TRUTH_FROM,
    )


def _spread(bad: pd.DataFrame) -> pd.DataFrame:
    """Witnesses from as many clients as possible: each client's first violation first."""
    if not len(bad):
        return bad
    first = bad.drop_duplicates("client_id")
    return pd.concat([first, bad.drop(first.index)])


def _witness(r: pd.Series, ctx: Context) -> Witness:
    gap = float(r["next_t_req"]) - float(r["t"])
    nxt = {k.removeprefix("next_"): r[k] for k in r.index if k.startswith("next_")}
    nxt["client_id"] = r["client_id"]
    text = (
        f"client {r['client_id']} got 404 for its {client_wire.describe(r)} {at(r['t'], ctx.origin)}; "
        f"its next request, {gap:.3f} s later, was {client_wire.describe(nxt)} — "
        f"{str(r['outcome']).removeprefix('violation: ')}, with no initialize without a session ID before it"
    )
    fields = row_of(r, ["client_id", "flow", "method", "rpc_method", "session", "t", "status"])
    fields |= row_of(r, ["next_flow", "next_method", "next_rpc_method", "next_session", "next_t_req"])
    refs = client_wire.ref(r) + client_wire.ref(r, "next_tap_line")
    return Witness("no_rehandshake", text, Attribution.CLIENT, fields, tuple(refs))
