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

In the modern era (2026-07-28) there is no session: a client declares its capabilities
with every request (`_meta`), and the server its own in `server/discover`'s result. The
tap records the `server/discover` exchange like an initialize's (no session), and a
message the server sent on a modern request's stream is judged against the declaration
of the client that asked it (named by the flow's `x-lab-conn`: its latest
`server/discover` before the message). Its messages without such a declaration are not
judged (`sessions_without_declaration` counts them too).

Applies to runs whose tap records declarations (taps written before it had none); the
evidence is the declarations seen, and the server messages judged against them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context, split_conn
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
    records = tap["capabilities"]
    declared = records.dropna(subset=["session"]).drop_duplicates("session", keep="last")
    by_session = {
        str(r["session"]): r
        for r in declared[["session", "flow", "t", "server", "client"]].to_dict("records")
    }
    by_client, client_of_flow = _modern_declarations(tap, records)
    sent = tap["sent"]
    useful = sent["has_data"].eq(True) & ~sent["priming"].eq(True)
    modern = (
        (sent["session"].isna() & sent["flow"].map(client_of_flow).isin(by_client)) if by_client else False
    )
    judged = int((useful & (sent["session"].isin(by_session) | modern)).sum())
    if "method" not in sent.columns:
        return pd.DataFrame(), judged, len(by_session) + len(by_client), 0
    gated = sent[sent["method"].notna()]
    gated = pd.concat(
        [
            gated[gated["session"].notna()].drop_duplicates(["session", "event_id", "digest"]),
            gated[gated["session"].isna()],  # (the modern era: no IDs, each send is one message)
        ]
    )
    rows = []
    unknown = 0
    for r in gated.to_dict("records"):
        need = needs(str(r["method"]))
        if need is None:
            continue
        if isinstance(r["session"], str):
            decl = by_session.get(r["session"])
        else:
            decl = _latest(by_client.get(client_of_flow.get(r["flow"], "")), float(r["t"]))
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
    return bad, judged, len(by_session) + len(by_client), unknown


def _modern_declarations(
    tap: dict[str, pd.DataFrame], records: pd.DataFrame
) -> tuple[dict[str, list[dict[Any, Any]]], dict[object, str]]:
    """(client -> its `server/discover` declarations in time order, flow -> client): the
    modern era's, which hold for the client that asked (no session)."""
    flows = tap["flow"].drop_duplicates("flow", keep="last")
    client, _ = split_conn(flows["conn"])
    client_of_flow = {
        f: c for f, c in zip(flows["flow"].tolist(), client.tolist(), strict=True) if isinstance(c, str)
    }
    by_client: dict[str, list[dict[Any, Any]]] = {}
    sessionless = records[records["session"].isna()] if len(records) else records
    for r in sessionless.sort_values("t", kind="stable").to_dict("records"):
        c = client_of_flow.get(r["flow"])
        if c is not None:
            by_client.setdefault(c, []).append(r)
    return by_client, client_of_flow


def _latest(declarations: list[dict[Any, Any]] | None, t: float) -> dict[Any, Any] | None:
    """The declaration in force at `t`: the latest made by then (None before any: not judged)."""
    if not declarations:
        return None
    made = [d for d in declarations if float(d["t"]) <= t]
    return made[-1] if made else None


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
        summary=(
            f"{len(bad)} of {judged} server messages need a capability their session did not declare "
            "(in the modern era: their client's server/discover) (budget 0)"
        ),
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
    modern = not isinstance(row["session"], str)
    where = "on a modern-era (2026-07-28) request's stream" if modern else f"in session {row['session']}"
    when = "at server/discover" if modern else "at initialize"
    text = (
        f"the server sent {row['method']} (event {short(row['event_id'], 40)}, flow {row['flow']}) "
        f"{at(row['t'], ctx.origin)} {where}; it needs `{row['needs']}`, which {whose} "
        f"did not declare {when} (flow {row['declared_in']}: {row['declared']})"
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
