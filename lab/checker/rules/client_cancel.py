"""Client check 9 — a disconnect is not a cancellation.

`notifications/cancelled` is how a client cancels; the application log says which
cancels the application asked for (an `outcome` with status `cancelled`: the lab's
`cancel`, or `leave` with the call outstanding). From the wire, every
`notifications/cancelled` a client sent is matched to one such outcome of that client
within CANCEL_WINDOW_S; one that matches none is a cancel nobody asked for
(`unasked_cancel`): the implementation turned something else — a dropped stream, its
own timeout — into a cancellation. Attribution: client, with the call that was
outstanding then and how it ended. Evidence: at least one stream of a call lost on the
wire (the situation in which a naive client cancels).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, present, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import HANDSHAKE_ONLY, Rule
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs, app_ref
from lab.checker.truth.client_delivery import recoveries

TRUTH_FROM = "the wire (the proxy's record) for the cancels sent; the application log for the cancels asked"
CANCEL_WINDOW_S = 5.0


def findings(ctx: Context) -> pd.DataFrame:
    flows = client_wire.flows(ctx)
    sent = flows[flows["rpc_method"] == "notifications/cancelled"].sort_values("t_req", kind="stable")
    outcomes = app_logs(ctx).of("outcome")
    asked = outcomes[outcomes["status"] == "cancelled"].sort_values("t", kind="stable")
    pool: dict[object, list[float]] = {
        c: g["t"].astype(float).tolist() for c, g in asked.groupby("client", sort=False)
    }
    ended_by_client = {c: g for c, g in outcomes.groupby("client", sort=False)}
    rows: list[dict[str, Any]] = []
    for c in client_wire.records(sent):
        times = pool.get(c["client_id"], [])
        near = [t for t in times if abs(t - c["t_req"]) <= CANCEL_WINDOW_S]
        if near:
            times.remove(near[0])
            continue
        # The call it cancelled: the one whose outcome came nearest to it (an implementation
        # cancels as it gives a call up: its own timeout), as far as the wire and log say.
        mine = ended_by_client.get(c["client_id"])
        out = None
        if mine is not None and len(mine):
            distance = (mine["t"].astype(float) - float(c["t_req"])).abs().to_numpy()
            out = mine.iloc[int(distance.argmin())]
        rows.append(
            {
                "client_id": c["client_id"],
                "flow": c["flow"],
                "t_req": c["t_req"],
                "session": c["session"],
                "call": None if out is None else out["call"],
                "call_status": None if out is None else out["status"],
                "call_error": None if out is None else out["error"],
                "call_elapsed_s": None if out is None else out["elapsed_s"],
                "_src": None if out is None else out["_src"],
                "_line": None if out is None else out["_line"],
                "tap_line": c["tap_line"],
            }
        )
    columns = [
        "client_id",
        "flow",
        "t_req",
        "session",
        "call",
        "call_status",
        "call_error",
        "call_elapsed_s",
        "_src",
        "_line",
        "tap_line",
    ]
    return pd.DataFrame(rows, columns=columns)


def check(ctx: Context) -> GateResult:
    bad = findings(ctx)
    flows = client_wire.flows(ctx)
    cancels = int((flows["rpc_method"] == "notifications/cancelled").sum())
    losses = len(recoveries(ctx))
    evidence = [Evidence("streams of a call lost", 1, losses, losses >= 1, "disconnects on the wire")]
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} of {cancels} notifications/cancelled sent without the application asking; {losses} disconnects",
        budget={"violations_max": 0},
        measured={"cancels_sent": cancels, "unasked_cancels": len(bad), "disconnects": losses},
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"client": len(bad)},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    call = (
        f"; its call {r['call']} ended `{r['call_status']}` after {float(r['call_elapsed_s']):.1f} s ({r['call_error']})"
        if present(r["call_status"])
        else (f"; its call {r['call']} had no outcome" if present(r["call"]) else "")
    )
    text = (
        f"client {r['client_id']} sent notifications/cancelled {at(r['t_req'], ctx.origin)} though its application "
        f"asked for no cancel within {CANCEL_WINDOW_S:g} s{call}"
    )
    fields = row_of(r, ["client_id", "flow", "t_req", "session", "call", "call_status", "call_error"])
    refs = client_wire.ref(r) + app_ref(app_logs(ctx), r)
    return Witness("unasked_cancel", text, Attribution.CLIENT, fields, tuple(refs))


RULE = Rule(
    id="client_disconnect_cancel",
    number=11,
    title="A disconnect is not a cancellation",
    blames=(Attribution.CLIENT,),
    evidence="calls whose stream was lost on the wire",
    check=None,
    check_under_test=check,
    eras=HANDSHAKE_ONLY,
    era_note="there, a closed response stream is the cancellation of its request",
)
