"""Gate 2 for a client under test — a write performed twice (budget: duplicate_dispatch_max).

The server's side is gate 2's own (lab.checker.rules.duplicates): side effects performed
twice in the server ledger, two different results for one idempotency key on the wire.
The client's side comes from the application log instead of a client ledger:

- `response_delivered_twice`: the implementation handed its application the answer to
  one call more than once (the application would act on it twice). Attribution: client.

Evidence: the run's event count; at least one call whose answer was lost on the wire
(a loss of one of its streams, lab.checker.truth.client_delivery) or whose request the client
sent twice — the situations in which writes get performed twice; the side effects
visible (server ledger or the tap's `result` records).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs, app_ref
from lab.checker.truth.client_delivery import deliveries, recoveries

TRUTH_FROM = (
    "the server ledger and the wire (the proxy's record of each call's answer); the client's side from "
    "its application log"
)
OUTBOX_COMPARED = "what the clients handed their application, compared (outbox)"
"""Gate 2's evidence that the lab's clients' outbox was compared with what the server sent."""
CLIENT_RECORDS = "the clients' records of what they accepted and handed their application (inbox, outbox)"
"""Gate 2's words for the client ledger's inbox and outbox, in a note saying they were not checked."""
CLIENT_LEDGER_EVIDENCE = (OUTBOX_COMPARED, "writes retried")
"""Evidence of gate 2 that a client under test, which keeps no client ledger, replaces."""


def done_twice(count: int, budget: int) -> str:
    """The head of gate 2's summary in plain words, for this check and the gate's own."""
    return (
        f"{count} operation(s) done more than once: a write performed, or its result handled, twice "
        f"(budget {budget})"
    )


def check(ctx: Context, base: GateResult) -> GateResult:
    """Gate 2 for a client under test, given the server-side reading of gate 2 (`base`)."""
    dl = deliveries(ctx)
    # A foreign, made-up or altered answer is gate 1's; here, the call's own answer twice.
    answers = dl[
        dl["call"].notna() & dl["kind"].isin(("response", "error")) & dl["match"].isin(("ok", "unmatched"))
    ]
    sizes = answers.groupby(["client", "call"], sort=False).size()
    twice = sizes[sizes > 1]
    lost_calls = int(recoveries(ctx)["call"].nunique())
    att = client_wire.attempts(ctx)
    resent = int((att["kind"] == "resend").sum())
    situations = lost_calls + resent
    evidence = [e for e in base.evidence if e.name not in CLIENT_LEDGER_EVIDENCE]
    evidence.append(
        Evidence(
            "answers lost or requests re-sent",
            1,
            situations,
            situations >= 1,
            "calls that lost a stream on the wire, plus tools/call requests the client sent again",
        )
    )
    count = base.violations + len(twice)
    budget = ctx.budgets.duplicate_dispatch_max
    witnesses = list(base.witnesses)
    for client, call in twice.index[: ctx.witness_limit]:
        witnesses.append(_witness(answers[(answers["client"] == client) & (answers["call"] == call)], ctx))
    notes = tuple(n for n in base.notes if not n.startswith(f"{CLIENT_RECORDS} not checked"))
    attribution = dict(base.attribution_counts)
    attribution["client"] = int(attribution.get("client", 0)) + len(twice)
    return replace(
        base,
        verdict=decide(count > budget, evidence),
        summary=f"{done_twice(count, budget)}; {len(twice)} answer(s) delivered twice; "
        f"{lost_calls} call(s) lost an answer on the wire, {resent} re-sent",
        measured={
            **base.measured,
            "response_delivered_twice": len(twice),
            "calls_with_a_loss": lost_calls,
            "requests_resent": resent,
        },
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(witnesses[: ctx.witness_limit * 3]),
        attribution_counts=attribution,
        notes=notes,
        truth_from=TRUTH_FROM,
    )


def _witness(rows: pd.DataFrame, ctx: Context) -> Witness:
    first = rows.iloc[0]
    times = ", ".join(at(t, ctx.origin) for t in rows["t"].tolist()[:4])
    text = (
        f"client {first['client']} handed its application the answer to call {first['call']} "
        f"{len(rows)} times ({times}): the application acts on one answer more than once"
    )
    fields = row_of(first, ["client", "session", "call", "id", "kind", "digest"])
    fields["deliveries"] = len(rows)
    logs = app_logs(ctx)
    refs = [ref for _, r in rows.head(3).iterrows() for ref in app_ref(logs, r)]
    return Witness("response_delivered_twice", text, Attribution.CLIENT, fields, tuple(refs))
