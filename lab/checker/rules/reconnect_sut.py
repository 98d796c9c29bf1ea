"""Gate 6 for a client under test, from the wire — reconnect attempts per second within
the budget, and every wait at least what the server advised.

The attempts are the client's requests that get a stream or a session back, as the tap
saw them (lab.checker.truth.client_wire `attempts`): `resume` (a GET with Last-Event-ID),
`reopen` (a GET without it after the session's first standalone GET), `reinitialize`
(an initialize without a session ID after the client had one), `resend` (a tools/call
whose idempotency key an earlier POST of the client carried).

- `over_budget`: attempts of every client, merged, in 1 s bins of the time they reached
  the proxy (the definition of lab.checker.truth.reconnects.per_second); each bin above
  reconnect_qps is a violation.
- `waited_less_than_advised`: an attempt sent sooner after the loss it answers (the end
  of the stream it resumes, or the refusal of the previous attempt) than the server or
  proxy advised for it: the `Retry-After` of a 429/503 answer to the previous attempt
  (the storm rule's, or the reference server's), else the last SSE `retry` sent on that
  stream; less a 1 ms allowance.

Attribution: client. Evidence: at least one attempt, and a reconnect budget in run.json.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.truth import client_wire
from lab.checker.truth.reconnects import WAIT_ALLOWANCE_S, over_budget, per_second

TRUTH_FROM = "the wire (proxy tap): resumptions, re-opened streams, re-initializations and re-sent calls"


def check(ctx: Context) -> GateResult:
    att = client_wire.attempts(ctx)
    budget = ctx.budgets.reconnect_qps
    counts = per_second(att["t_req"].to_numpy(dtype="float64"))
    peak = int(counts.max()) if len(counts) else 0
    over = over_budget(counts, budget)
    advised = pd.to_numeric(att["advised_s"], errors="coerce")
    early = att[advised.notna() & (att["waited_s"] + WAIT_ALLOWANCE_S < advised)].sort_values("t_req")
    witnesses = [
        _over_witness(int(s), int(n), budget or 0.0, att, ctx)
        for s, n in zip(
            over.head(ctx.witness_limit).index.tolist(), over.head(ctx.witness_limit).tolist(), strict=True
        )
    ]
    witnesses += [_early_witness(r, ctx) for _, r in early.head(ctx.witness_limit).iterrows()]
    evidence = [
        ctx.events_evidence(),
        Evidence("reconnects", 1, len(att), len(att) >= 1, "attempts on the wire (proxy tap)"),
        Evidence(
            "reconnect budget", True, budget is not None, budget is not None, "run.json budgets.reconnect_qps"
        ),
    ]
    violations = len(over) + len(early)
    shown = "none" if budget is None else f"{budget:g}/s"
    return GateResult(
        verdict=decide(violations > 0, evidence),
        summary=(
            f"peak {peak} reconnects/s (budget {shown}); {len(over)} second(s) over; "
            f"{len(early)} of {int(advised.notna().sum())} advised wait(s) cut short"
        ),
        budget={"reconnect_qps": budget},
        measured={
            "reconnects": len(att),
            "peak_per_s": peak,
            "seconds_over_budget": len(over),
            "waits_shorter_than_advised": len(early),
            "with_advice": int(advised.notna().sum()),
            "by_kind": {str(k): int(v) for k, v in att["kind"].value_counts().items()},
            "clients_reconnecting": int(att["client_id"].nunique()),
        },
        evidence=tuple(evidence),
        violations=violations,
        witnesses=tuple(witnesses),
        attribution_counts={"client": violations},
        truth_from=TRUTH_FROM,
    )


def _over_witness(second: int, n: int, budget: float, att: pd.DataFrame, ctx: Context) -> Witness:
    t = att["t_req"].astype("float64")
    inside = att[(t >= second) & (t < second + 1)]
    kinds = ", ".join(f"{k} {v}" for k, v in inside["kind"].value_counts().items())
    text = (
        f"{n} reconnect attempts from {inside['client_id'].nunique()} clients in the second starting "
        f"{at(second, ctx.origin)} ({kinds}); budget {budget:g}/s"
    )
    refs = [r for _, row in inside.head(3).iterrows() for r in client_wire.ref(row)]
    fields = {
        "second": second,
        "attempts": n,
        "clients": int(inside["client_id"].nunique()),
        "budget": budget,
    }
    return Witness("over_budget", text, Attribution.CLIENT, fields, tuple(refs))


def _early_witness(r: pd.Series, ctx: Context) -> Witness:
    text = (
        f"client {r['client_id']} sent a {r['kind']} {at(r['t_req'], ctx.origin)}, {float(r['waited_s']):.3f} s "
        f"after the loss it answers ({at(r['lost_at'], ctx.origin)}), though it was advised to wait "
        f"{float(r['advised_s']):.3f} s ({r['advice']})"
    )
    fields = row_of(
        r, ["client_id", "kind", "flow", "previous", "lost_at", "t_req", "waited_s", "advised_s", "advice"]
    )
    refs = client_wire.ref(r) + client_wire.ref(r, "previous_line")
    return Witness("waited_less_than_advised", text, Attribution.CLIENT, fields, tuple(refs))
