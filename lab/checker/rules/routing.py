"""Gate 14 — no session lost by routing (replicas behind a balancer).

The most reported production failure of MCP deployments: a balancer sends a session's
next request to a replica that never saw it, and the client is told "session not found"
(404) in the middle of its work. The server kept the rules; the deployment did not.

From the wire (the proxy balances, and its tap's `flow` records say which replica
answered each request, `replica`): a session belongs to the replica that answered the
`initialize` which assigned it; a request carrying it answered 404 by **another** replica,
with nothing that ends a session before it (a DELETE carrying it, the proxy's
`kill_session` or `expiry_race` on it), is a session lost by routing (`lost_by_routing`).
Attribution: topology (a deployment finding: the balancer's affinity with a store per
replica), never the server's rules nor the client. Evidence: requests carrying a session
whose replica is known. Applies to runs whose target has replicas (run.json
`scenario.target.replicas` > 1).

A URL target may sit behind a balancer of its own, which the lab cannot see into: there,
a request carrying a session answered 404 although the same session was served (2xx) on
a request sent *after* that answer, with nothing that ends a session before the 404
(`answered_404_while_alive`), is the same finding from the wire alone: the session was
alive (it was served again), so the 404 came from somewhere that did not have it. Also
attributed to the topology (a balancer's routing is by far the likeliest; the witness
says the target itself may have lost track of it). Evidence: requests carrying a
session the target answered.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.inputs.jsonl import LINE
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import HANDSHAKE_ONLY, Rule
from lab.checker.truth import client_wire

TRUTH_FROM = (
    "the wire (the proxy's record): which replica answered each request, and the sessions each assigned"
)
ENDS_A_SESSION = ("kill_session", "expiry_race")


def replicas(ctx: Context) -> int:
    sc = (ctx.data.run or {}).get("scenario")
    target = sc.get("target") if isinstance(sc, Mapping) else None
    n = target.get("replicas") if isinstance(target, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


def foreign(ctx: Context) -> bool:
    target = (ctx.data.run or {}).get("target")
    return isinstance(target, Mapping) and target.get("kind") == "url"


def applies(ctx: Context) -> bool:
    return replicas(ctx) > 1 or foreign(ctx)


def _flows(ctx: Context) -> pd.DataFrame:
    """The tap's flow records, one per flow, in answer order, with `tap_line`."""
    flows = ctx.data.tap_records("flow").drop_duplicates("flow").sort_values("t", kind="stable")
    return flows.assign(tap_line=flows[LINE] if LINE in flows.columns else None)


def _alive(ctx: Context, flows: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` answered before anything ended their session (`_ends`)."""
    ended = rows["session"].astype(str).map(_ends(ctx, flows)).astype(float).fillna(float("inf"))
    return rows[rows["t"].astype(float) < ended]


def served_again(ctx: Context) -> tuple[pd.DataFrame, int]:
    """A URL target's 404s to a session it served again on a request sent after them."""
    columns = ["flow", "session", "t", "method", "tap_line", "again_t"]
    flows = _flows(ctx)
    if not len(flows):
        return pd.DataFrame(columns=columns), 0
    sent = flows["t_request"] if "t_request" in flows.columns else flows["t"]
    flows = flows.assign(t_req=pd.to_numeric(sent, errors="coerce").fillna(flows["t"]))
    carried = flows[flows["session"].notna() & flows["status"].notna() & (flows["answered_by"] == "server")]
    ok = carried[(carried["status"] >= 200) & (carried["status"] < 300)]
    ok_times: dict[str, list[float]] = {}
    for session, t_req in zip(ok["session"].astype(str), ok["t_req"].astype(float), strict=True):
        ok_times.setdefault(session, []).append(t_req)
    gone = _alive(ctx, flows, carried[carried["status"] == 404])
    again = [
        min((x for x in ok_times.get(str(s), ()) if x > float(t)), default=float("nan"))
        for s, t in zip(gone["session"], gone["t"], strict=True)
    ]
    bad = gone.assign(session=gone["session"].astype(str), t=gone["t"].astype(float), again_t=again)
    return bad[bad["again_t"].notna()][columns], len(carried)


def findings(ctx: Context) -> tuple[pd.DataFrame, int]:
    """(each 404 answered by a replica the session never belonged to, the requests judged)."""
    columns = ["flow", "session", "owner", "replica", "t", "method", "tap_line"]
    flows = _flows(ctx)
    if not len(flows) or "replica" not in flows.columns or "session_out" not in flows.columns:
        return pd.DataFrame(columns=columns), 0
    known = flows[flows["replica"].notna()]
    created = known[known["session_out"].notna()].drop_duplicates("session_out")
    owner = dict(zip(created["session_out"].astype(str), created["replica"].astype(int), strict=True))
    carried = known[known["session"].notna() & known["session"].astype(str).isin(owner.keys())]
    carried = carried.assign(
        session=carried["session"].astype(str),
        owner=carried["session"].astype(str).map(owner),
        replica=carried["replica"].astype(int),
        t=carried["t"].astype(float),
    )
    elsewhere = carried[(carried["status"] == 404) & (carried["replica"] != carried["owner"])]
    return _alive(ctx, flows, elsewhere)[columns], len(carried)


def _ends(ctx: Context, flows: pd.DataFrame) -> dict[str, float]:
    """session -> when something first ended it on the wire: a DELETE carrying it that the
    server answered, or a proxy fault that ends sessions."""
    out: dict[str, float] = {}
    deletes = flows[(flows["method"] == "DELETE") & flows["session"].notna() & flows["status"].notna()]
    for s, t in zip(deletes["session"].astype(str), deletes["t"].astype(float), strict=True):
        out[s] = min(out.get(s, t), t)
    faults = ctx.data.tap_records("fault")
    if len(faults) and "detail" in faults.columns:
        for kind, t, detail in zip(faults["fault"], faults["t"], faults["detail"], strict=True):
            who = detail.get("session") if isinstance(detail, dict) else None
            if kind in ENDS_A_SESSION and isinstance(who, str):
                out[who] = min(out.get(who, float(t)), float(t))
    return out


def check(ctx: Context) -> GateResult:
    n: int | None = replicas(ctx)
    if n is not None and n <= 1 and foreign(ctx):  # no replica record: the target's own answers
        bad, judged = served_again(ctx)
        n, witness, evidence_name = None, _foreign_witness, "requests carrying a session the target answered"
        what = "answered 404 although the session was served again afterwards: sessions lost by routing, most likely"
        truth = "the wire (the proxy's record): the target's answers to each session's requests, in order"
    else:
        bad, judged = findings(ctx)
        witness, evidence_name = _witness, "requests carrying a session, their replica known"
        what = f"answered 404 by a replica the session never belonged to, over {n} replicas: sessions lost by routing"
        truth = TRUTH_FROM
    evidence = [Evidence(evidence_name, 1, judged, judged >= 1, "from the proxy's record")]
    sessions = int(bad["session"].nunique()) if len(bad) else 0
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} request(s) of {sessions} session(s) {what} (budget 0)",
        budget={"violations_max": 0},
        measured={
            "lost_by_routing": len(bad),
            "sessions": sessions,
            "requests_judged": judged,
            "replicas": n,
        },
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(
            witness(r, ctx) for _, r in bad.drop_duplicates("session").head(ctx.witness_limit).iterrows()
        ),
        attribution_counts={str(Attribution.TOPOLOGY): len(bad)},
        truth_from=truth,
    )


def _foreign_witness(r: pd.Series, ctx: Context) -> Witness:
    text = (
        f"session {r['session']} was answered 404 {at(float(r['t']), ctx.origin)} ({r['method']}), then served "
        f"again on a request sent {at(float(r['again_t']), ctx.origin)}, and nothing had ended it: it was alive, "
        "so the 404 came from somewhere that did not have it — a balancer in front of the target routing it to "
        "another replica, most likely (or the target lost track of it)"
    )
    fields = row_of(r, ["flow", "session", "t", "again_t"])
    return Witness("answered_404_while_alive", text, Attribution.TOPOLOGY, fields, tuple(client_wire.ref(r)))


def _witness(r: pd.Series, ctx: Context) -> Witness:
    text = (
        f"session {r['session']}, created by replica {int(r['owner'])}, was answered 404 by replica "
        f"{int(r['replica'])} {at(float(r['t']), ctx.origin)} ({r['method']}): that replica never had it, and nothing "
        "had ended it. Lost by routing, not by the server's rules: the deployment (a balancer without session "
        "affinity in front of replicas that each keep their own sessions) is the defect"
    )
    fields = row_of(r, ["flow", "session", "owner", "replica", "t"])
    return Witness("lost_by_routing", text, Attribution.TOPOLOGY, fields, tuple(client_wire.ref(r)))


RULE = Rule(
    id="session_routing",
    number=14,
    title="No session lost by routing",
    blames=(Attribution.TOPOLOGY,),
    evidence="requests carrying a session, with the replica that answered each (a URL target: the target's answers)",
    check=check,
    check_under_test=check,
    applies=applies,
    eras=HANDSHAKE_ONLY,
    era_note="it has no sessions to route",
)
