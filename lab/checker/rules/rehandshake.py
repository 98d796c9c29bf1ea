"""Gate 3 — a request that carried a session ID, got 404, and did not lead to a new
handshake (budget: 0).

From the client ledger's `http_exchanges` (every request, `started_at`/`ended_at`):
for each exchange with carried_session = 1 and status = 404 (DELETEs excluded: a 404
to the DELETE of a leaving client only says the session is already gone), the client's
*next* request is its first one with started_at > that 404's ended_at, or started at that
very instant on a later connection (a client opens its reaction to a 404 in the same step,
with the same clock reading). Requests that were already under way when the 404 arrived
are not "next" (a client has several connections open at once). The 404 is handled when
that next request is an `initialize` without a session ID, or belongs to a newer session
generation (another 404 already led to the new handshake). It is a violation when the next request carried the expired
session generation (or an older one), was an initialize that carried a session ID, or
was any other request without a session.

With a proxy tap, the tap cross-checks: a next request whose flow carried the very
session HMAC that got the 404 is a violation whatever the client's generation says,
and 404s the tap saw on a client's connection that the client ledger records with
another status are listed in the notes. A 404 after which the client made no request at
all is counted (`no_next_request`), not a violation.

Evidence: 404s to session-carrying requests >= max(1, min_404) (zero 404s is never a
pass, whatever the scenario); client ledgers readable; and when the scenario's
`kill_session` fault was refused by the target (every DELETE it sent answered 405), the
gate is inconclusive for that reason, said plainly. Attribution: client.

The server's side of the same rule, from the wire (`lab.checker.truth.wire_sessions`): a
request carrying a session whose DELETE the server answered 2xx, started after that
answer, must get 404; any other answer about the session (400, 2xx, 5xx) is a server
violation (`terminated_session_not_404`), counted even when no 404 ever happened. And a
POST whose session ID the proxy removed (`strip_session_id`) that the server answered 2xx
is a server violation (`served_without_session`): the rule is 400.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.explain import at, client_ref, present, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import HANDSHAKE_ONLY, Rule
from lab.checker.rules.rehandshake_sut import check as read_under_test
from lab.checker.truth import wire_sessions
from lab.checker.truth.not_applicable import kill_session_refused

NEXT_COLUMNS = [
    "conn_id",
    "purpose",
    "method",
    "carried_session",
    "session_generation",
    "started_at",
    "_src",
    "_rowid",
]


def check(ctx: Context) -> GateResult:
    ex = ctx.require_client("http_exchanges").copy()
    ex["conn_id"] = ex["conn_id"].astype("int64")
    ex["carried_session"] = _flag(ex["carried_session"])
    ex["session_generation"] = ex["session_generation"].astype("int64")
    status = pd.to_numeric(ex["status"], errors="coerce")
    is_404 = (status == 404) & ex["carried_session"] & (ex["purpose"] != "delete")
    # An exchange without times cannot be placed; it is neither a 404 judged nor a "next".
    lost = ex[is_404].dropna(subset=["ended_at"]).sort_values("ended_at", kind="stable")
    following = ex[["client_id", *(c for c in NEXT_COLUMNS if c in ex.columns)]].dropna(subset=["started_at"])
    joined = _with_next_request(lost, following)
    tap_session = _tap_sessions(ctx)
    outcome = (
        joined.apply(lambda r: _outcome(r, tap_session), axis=1) if len(joined) else pd.Series(dtype=object)
    )
    joined["outcome"] = outcome
    bad = joined[joined["outcome"].astype(str).str.startswith("violation")]
    judged_after_delete = wire_sessions.after_termination(ctx)
    server_bad = wire_sessions.violations(ctx)
    stripped = wire_sessions.without_session(ctx)
    served = wire_sessions.served_without_session(ctx)
    count = len(bad) + len(server_bad) + len(served)
    no_next = int((joined["outcome"] == "no_next_request").sum()) if len(joined) else 0
    budget = ctx.budgets.missing_rehandshake_max
    need = max(1, ctx.budgets.min_404)  # zero 404s is no evidence, whatever the scenario
    evidence = [
        ctx.events_evidence(),
        Evidence("404s to requests with a session", need, len(lost), len(lost) >= need, from_faults=True),
        *ctx.client_evidence(),
    ]
    refused, accepted = kill_session_refused(ctx.data)
    if refused and not accepted:
        evidence.append(
            Evidence(
                "kill_session applicable",
                True,
                False,
                False,
                f"the target answered 405 to all {refused} DELETE(s) kill_session sent: it does not let "
                "clients end sessions, so the fault meant to cause these 404s is not applicable",
            )
        )
    notes = _tap_cross_check(ctx, ex)
    return GateResult(
        verdict=decide(count > budget, evidence),
        summary=(
            f"{len(bad)} of {len(lost)} session 404s not followed by a new initialize; {len(server_bad)} of "
            f"{len(judged_after_delete)} requests carrying a terminated session answered otherwise than 404"
            + (
                f"; {len(served)} of {len(stripped)} requests without their session ID served"
                if len(stripped)
                else ""
            )
            + f" (budget {budget})"
        ),
        budget={"missing_rehandshake_max": budget, "min_404": need},
        measured={
            "session_404s": len(lost),
            "rehandshaken": int((joined["outcome"] == "initialize").sum()) if len(joined) else 0,
            "already_newer_session": int((joined["outcome"] == "newer_session").sum()) if len(joined) else 0,
            "no_next_request": no_next,
            "violations": count,
            "tap_cross_checked": tap_session is not None,
            "after_termination": len(judged_after_delete),
            "terminated_session_not_404": len(server_bad),
            "without_session_id": len(stripped),
            "served_without_session": len(served),
        },
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(
            wire_sessions.witness(r, ctx) for _, r in server_bad.head(ctx.witness_limit).iterrows()
        )
        + tuple(
            wire_sessions.without_session_witness(r, ctx)
            for _, r in served.head(ctx.witness_limit).iterrows()
        )
        + tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"client": len(bad), "server": len(server_bad) + len(served)},
        notes=tuple(notes),
    )


def _flag(values: pd.Series) -> pd.Series:
    """A 0/1 ledger column as bool; null is false (not `bool(nan)`, which is true)."""
    return pd.to_numeric(values, errors="coerce").fillna(0).astype(bool)


def _tap_sessions(ctx: Context) -> dict[str, Any] | None:
    """conn ("client:n") -> the session HMAC that request carried, as the tap saw it."""
    if ctx.data.tap is None:
        return None
    flows = ctx.data.tap["flow"]
    known = flows[flows["conn"].notna()]
    return dict(zip(known["conn"].astype(str), known["session"], strict=True))


def _with_next_request(lost: pd.DataFrame, following: pd.DataFrame) -> pd.DataFrame:
    """`lost` with, per 404, the client's next request as `next_*` columns (NaN if none).

    The next request is the first, in (started_at, conn_id) order, that started after the
    404 arrived — or at that very instant on a later connection: a client reacting to a
    404 opens its next request in the same step, with the same clock reading, and that
    request is the one that must be the new initialize.
    """
    ordered = following.sort_values(["client_id", "started_at", "conn_id"], kind="stable").reset_index(
        drop=True
    )
    by_client = {str(c): g for c, g in ordered.groupby("client_id", sort=False)}
    picks: list[int | None] = []
    for client, ended, conn in zip(lost["client_id"], lost["ended_at"], lost["conn_id"], strict=True):
        group = by_client.get(str(client))
        pick = None
        if group is not None:
            starts = group["started_at"].to_numpy(dtype="float64")
            conns = group["conn_id"].to_numpy()
            i = int(np.searchsorted(starts, float(ended), side="left"))
            while i < len(starts) and starts[i] == float(ended) and int(conns[i]) <= int(conn):
                i += 1
            if i < len(starts):
                pick = int(group.index[i])
        picks.append(pick)
    nxt = ordered.reindex([p if p is not None else -1 for p in picks])
    nxt = nxt.rename(columns={c: f"next_{c}" for c in NEXT_COLUMNS}).drop(columns=["client_id"])
    return pd.concat([lost.reset_index(drop=True), nxt.reset_index(drop=True)], axis=1)


def _outcome(r: pd.Series, tap_session: dict[str, Any] | None) -> str:
    if not present(r["next_started_at"]):
        return "no_next_request"
    carried = bool(r["next_carried_session"])
    if r["next_purpose"] == "initialize":
        return "violation: initialize with a session ID" if carried else "initialize"
    if not carried:
        return "violation: a request without a session and no initialize"
    if tap_session is not None:
        this = tap_session.get(f"{r['client_id']}:{r['conn_id']}")
        after = tap_session.get(f"{r['client_id']}:{int(r['next_conn_id'])}")
        if present(this) and present(after) and this == after:
            return "violation: the proxy saw it carry the expired session"
    if int(r["next_session_generation"]) > int(r["session_generation"]):
        return "newer_session"
    return "violation: it carried the expired session"


def _witness(r: pd.Series, ctx: Context) -> Witness:
    client = r["client_id"]
    gap = float(r["next_started_at"]) - float(r["ended_at"])
    kind = "initialize" if r["next_purpose"] == "initialize" else str(r["next_purpose"])
    text = (
        f"client {client} got 404 for its {r['purpose']} {r['method']} (connection {client}:{r['conn_id']}, "
        f"session generation {r['session_generation']}) {at(r['ended_at'], ctx.origin)}; its next request, "
        f"started {gap:.3f} s later, was a {kind} (connection {client}:{int(r['next_conn_id'])}, session generation "
        f"{int(r['next_session_generation'])}) — {str(r['outcome']).removeprefix('violation: ')}, "
        "with no initialize without a session ID before it"
    )
    fields = row_of(
        r, ["client_id", "conn_id", "purpose", "method", "session_generation", "started_at", "ended_at"]
    )
    fields |= row_of(r, [f"next_{c}" for c in NEXT_COLUMNS if not c.startswith("_")])
    files = ctx.data.client_files
    refs = client_ref(files, "http_exchanges", r) + client_ref(files, "http_exchanges", r, prefix="next_")
    return Witness("no_rehandshake", text, Attribution.CLIENT, fields, tuple(refs))


def _tap_cross_check(ctx: Context, ex: pd.DataFrame) -> list[str]:
    if ctx.data.tap is None:
        return []
    flows = ctx.data.tap["flow"]
    tap404 = flows[(pd.to_numeric(flows["status"], errors="coerce") == 404) & flows["session"].notna()]
    if not len(tap404):
        return []
    client_id, conn_id = split_conn(tap404["conn"])
    seen = pd.DataFrame({"client_id": client_id, "conn_id": conn_id}).dropna()
    mine = ex[["client_id", "conn_id", "status"]].astype({"conn_id": "Int64"})
    j = seen.merge(mine, on=["client_id", "conn_id"], how="left")
    other = j[pd.to_numeric(j["status"], errors="coerce") != 404]
    if not len(other):
        return []
    sample = ", ".join(
        f"{r.client_id}:{r.conn_id} ({_recorded(r.status)})" for r in other.head(3).itertuples()
    )
    return [
        f"the proxy saw {len(other)} session 404(s) that the client ledger records otherwise or not at all: "
        f"{sample}"
    ]


def _recorded(status: object) -> str:
    """How the client ledger records a request's status, in words (never pandas' `nan`)."""
    number = pd.to_numeric(pd.Series([status]), errors="coerce").iloc[0]
    if not present(status):
        return "not in the client ledger"
    if pd.isna(number):
        return f"status {status!r}"
    return f"recorded as {int(number)}"


RULE = Rule(
    id="missing_rehandshake",
    number=3,
    title="404 without a new handshake",
    blames=(Attribution.SERVER, Attribution.CLIENT),
    evidence="at least one 404 to a request that carried a session ID",
    check=check,
    check_under_test=read_under_test,
    placed_in_time=True,
    eras=HANDSHAKE_ONLY,
    era_note="it has no sessions, so no session is lost and there is no handshake to make again",
)
