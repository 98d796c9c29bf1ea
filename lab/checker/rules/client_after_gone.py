"""Client check 8 — no reconnect after the client was told the session is gone.

From the wire alone: once a request that carried session S was answered 404 (the
session is gone), a GET carrying S that the client sent afterwards — a resumption or a
re-opened stream of the dead session — is a violation (`reconnect_after_gone`): the
client reconnects what it was told no longer exists, and the traffic is wasted (and
multiplies in an outage). Gate 3 judges the request right after the 404; this judges
every reconnect after it. Attribution: client. Evidence: at least one session 404.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import HANDSHAKE_ONLY, Rule
from lab.checker.rules.rehandshake_sut import session_404s
from lab.checker.truth import client_wire

TRUTH_FROM = "the wire (the proxy's record): 404s to a session and the GETs that carried it afterwards"


def findings(ctx: Context) -> pd.DataFrame:
    flows = client_wire.flows(ctx)
    told = session_404s(flows).sort_values("t", kind="stable").drop_duplicates(["client_id", "session"])
    first_404 = {(r["client_id"], r["session"]): r for r in client_wire.records(told)}
    rows: list[dict[str, Any]] = []
    gets = flows[(flows["method"] == "GET") & flows["session"].notna()]
    for g in client_wire.records(gets):
        gone = first_404.get((g["client_id"], g["session"]))
        if gone is not None and g["t_req"] > gone["t"]:
            rows.append(
                {
                    "client_id": g["client_id"],
                    "session": g["session"],
                    "flow": g["flow"],
                    "t_req": g["t_req"],
                    "status": g["status"],
                    "resume": bool(isinstance(g["cursor"], str)),
                    "told_flow": gone["flow"],
                    "told_at": gone["t"],
                    "tap_line": g["tap_line"],
                    "told_line": gone["tap_line"],
                }
            )
    columns = [
        "client_id",
        "session",
        "flow",
        "t_req",
        "status",
        "resume",
        "told_flow",
        "told_at",
        "tap_line",
        "told_line",
    ]
    return pd.DataFrame(rows, columns=columns)


def check(ctx: Context) -> GateResult:
    bad = findings(ctx)
    told = len(session_404s(client_wire.flows(ctx)))
    need = max(1, ctx.budgets.min_404)
    evidence = [
        Evidence(
            "404s to requests with a session",
            need,
            told,
            told >= need,
            "from the proxy's record",
            from_faults=True,
        )
    ]
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} reconnect(s) of a session after a 404 said it was gone, by {bad['client_id'].nunique()} client(s)",
        budget={"violations_max": 0},
        measured={
            "session_404s": told,
            "reconnects_after_gone": len(bad),
            "clients": int(bad["client_id"].nunique()),
        },
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(
            _witness(r, ctx) for _, r in bad.drop_duplicates("client_id").head(ctx.witness_limit).iterrows()
        ),
        attribution_counts={"client": len(bad)},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    kind = "a resumption GET (with Last-Event-ID)" if r["resume"] else "a GET re-opening its stream"
    text = (
        f"client {r['client_id']} was told session {r['session']} is gone (404) {at(r['told_at'], ctx.origin)}, "
        f"then sent {kind} carrying that session {at(r['t_req'], ctx.origin)} (answered {r['status']})"
    )
    fields = row_of(r, ["client_id", "session", "flow", "t_req", "status", "told_flow", "told_at"])
    refs = client_wire.ref(r, "told_line") + client_wire.ref(r)
    return Witness("reconnect_after_gone", text, Attribution.CLIENT, fields, tuple(refs))


RULE = Rule(
    id="client_reconnect_after_gone",
    number=10,
    title="No reconnect after the session is gone",
    blames=(Attribution.CLIENT,),
    evidence="404s to a session on the wire",
    check=None,
    check_under_test=check,
    eras=HANDSHAKE_ONLY,
    era_note="it has no sessions to be gone",
)
