"""Check 13 — the server sends only what was declared at initialize (budget: 0).

Both sides "MUST only use capabilities that were successfully negotiated" (§ Lifecycle,
Operation). From the tap alone: its `capabilities` records hold, per session, what the
server declared in its `InitializeResult` and what the client declared in its
`initialize` request (lab.wire.capabilities: paths such as `logging`,
`resources.subscribe`); its `sent` records name the method of every message the server
sent that needs a capability (`method`, only on those: lab.wire.capabilities.GATED).

`undeclared_capability`: a message the server sent in a session (live or replayed; one
per (session, event ID, digest)) whose method needs a capability that session's
declaration lacks — a server notification of a capability the server did not declare
(`notifications/resources/updated` from a server that declared only `tools`), or a
request of a capability the client did not declare (`sampling/createMessage` to a client
without `sampling`). Attribution: server. A client that trusts the declaration may drop
such a message, or fail on it; an official SDK client is where this was first noticed.

Severity: a violation fails the run like a gate's (the rule is a MUST, and the wire
shows it without any help from the target). Sessions whose initialize the tap did not
see are not judged (`sessions_without_declaration`).

Applies to runs whose tap records declarations (taps written before it had none); the
evidence is the declarations seen, and the server messages judged against them.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of, short, tap_ref
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Witness, decide
from lab.checker.rules.base import Rule
from lab.wire.capabilities import needs

CHECK = "undeclared_capability"


def applies(ctx: Context) -> bool:
    tap = ctx.data.tap
    return tap is not None and len(tap.get("capabilities", ())) > 0


def findings(ctx: Context) -> tuple[pd.DataFrame, int, int, int]:
    """(the offending sends, server messages judged, sessions with a declaration, gated
    sends in sessions without one)."""
    return ctx.cached("undeclared_capability", lambda: _findings(ctx))


def _findings(ctx: Context) -> tuple[pd.DataFrame, int, int, int]:
    tap = ctx.data.tap
    assert tap is not None
    declared = tap["capabilities"].dropna(subset=["session"]).drop_duplicates("session", keep="last")
    by_session = {
        str(r["session"]): r
        for r in declared[["session", "flow", "t", "server", "client"]].to_dict("records")
    }
    sent = tap["sent"]
    messages = sent[sent["has_data"].eq(True) & ~sent["priming"].eq(True) & sent["session"].isin(by_session)]
    judged = len(messages)
    if "method" not in sent.columns:
        return pd.DataFrame(), judged, len(by_session), 0
    gated = sent[sent["method"].notna()].drop_duplicates(["session", "event_id", "digest"])
    rows = []
    unknown = 0
    for r in gated.to_dict("records"):
        need = needs(str(r["method"]))
        if need is None:
            continue
        decl = by_session.get(str(r["session"]))
        if decl is None:
            unknown += 1
            continue
        side, path = need
        have = decl[side] if isinstance(decl[side], list) else []
        if path not in have:
            rows.append(
                r
                | {
                    "side": side,
                    "needs": path,
                    "declared": ", ".join(have) or "nothing",
                    "declared_in": decl["flow"],
                    "declared_at": decl["t"],
                }
            )
    bad = pd.DataFrame(rows)
    if len(bad):
        bad = bad.sort_values("t", kind="stable").reset_index(drop=True)
    return bad, judged, len(by_session), unknown


def check(ctx: Context) -> GateResult:
    bad, judged, sessions, unknown = findings(ctx)
    evidence = [
        Evidence("sessions whose declarations the proxy saw", 1, sessions, sessions >= 1),
        Evidence("server messages judged", 1, judged, judged >= 1),
    ]
    by_method: dict[str, JsonValue] = (
        {str(k): int(v) for k, v in bad["method"].value_counts().items()} if len(bad) else {}
    )
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} of {judged} server messages need a capability their session did not declare (budget 0)",
        budget={"undeclared_capability_max": 0},
        measured={
            "messages_judged": judged,
            "sessions_declared": sessions,
            "undeclared_capability": len(bad),
            "by_method": by_method,
            "sessions_without_declaration": unknown,
        },
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"server": len(bad)},
        truth_from="the wire (the proxy's record): the sessions' declarations at initialize and the server's messages",
    )


def _witness(row: pd.Series, ctx: Context) -> Witness:
    whose = "the server" if row["side"] == "server" else "the client"
    text = (
        f"the server sent {row['method']} (event {short(row['event_id'], 40)}, flow {row['flow']}) "
        f"{at(row['t'], ctx.origin)} in session {row['session']}; it needs `{row['needs']}`, which {whose} "
        f"did not declare at initialize (flow {row['declared_in']}: {row['declared']})"
    )
    fields = row_of(row, ["session", "flow", "event_id", "method", "needs", "side", "declared", "t"])
    return Witness(CHECK, text, Attribution.SERVER, fields, tuple(tap_ref(row)))


RULE = Rule(
    id="declared_capabilities",
    number=13,
    title="Server messages within the declared capabilities",
    blames=(Attribution.SERVER,),
    evidence="the sessions' declarations at initialize (as the proxy recorded them), and the server's messages",
    check=check,
    check_under_test=check,
    applies=applies,
)
