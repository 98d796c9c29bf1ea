"""Client check 10 — no request re-sent without the application asking.

The lab's load sends each call once, under its own idempotency key (its call ID). From
the wire: a `tools/call` POST carrying a key an earlier POST of the same client carried
is a request the implementation re-sent on its own (`resent_request`) — in a new session
(the request moved into another session as if nothing happened) or in the same one (a
disconnect answered by a new POST instead of a resumption). The server's deduplication
may hide the damage; the wire shows the attempt. Attribution: client. Evidence: at
least one stream of a call lost on the wire.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.truth import client_wire
from lab.checker.truth.client_delivery import recoveries

TRUTH_FROM = "the wire (the proxy's record): idempotency keys of each client's tools/call requests"


def findings(ctx: Context) -> pd.DataFrame:
    flows = client_wire.flows(ctx)
    att = client_wire.attempts(ctx)
    resent = att[att["kind"] == "resend"]
    by_flow = flows.set_index("flow")
    out = resent.assign(
        call=resent["flow"].map(by_flow["key"]),
        session=resent["flow"].map(by_flow["session"]),
        first_session=resent["previous"].map(by_flow["session"]),
    )
    out["new_session"] = out["session"].astype(object) != out["first_session"].astype(object)
    return out


def check(ctx: Context) -> GateResult:
    bad = findings(ctx)
    losses = len(recoveries(ctx))
    evidence = [Evidence("streams of a call lost", 1, losses, losses >= 1, "disconnects on the wire")]
    moved = int(bad["new_session"].sum()) if len(bad) else 0
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} request(s) re-sent by the implementation ({moved} into a new session); {losses} disconnects",
        budget={"violations_max": 0},
        measured={"resent": len(bad), "into_a_new_session": moved, "disconnects": losses},
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"client": len(bad)},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    where = (
        f"into a new session ({r['session']}, first sent in {r['first_session']})"
        if r["new_session"]
        else "in the same session"
    )
    text = (
        f"client {r['client_id']} sent call {r['call']} again {at(r['t_req'], ctx.origin)}, {where}, "
        f"{float(r['waited_s']):.3f} s after its first request ended; the application sent it once"
    )
    fields = row_of(r, ["client_id", "call", "flow", "previous", "session", "first_session", "t_req"])
    refs = client_wire.ref(r, "previous_line") + client_wire.ref(r)
    return Witness("resent_request", text, Attribution.CLIENT, fields, tuple(refs))


RULE = Rule(
    id="client_resend",
    number=12,
    title="No request re-sent without the application asking",
    blames=(Attribution.CLIENT,),
    evidence="tools/call requests on the wire",
    check=None,
    check_under_test=check,
)
