"""Gate 5 — resume latency p99 (budget: resume_p99_s, by default < 5 s).

Per client `recoveries` row: latency = recovered_at - lost_at (seconds: loss detected ->
next accepted event on the resumed stream, or completion by a retry, re-handshakes
included). A loss that never recovered (recovered_at NULL) counts as infinitely slow —
except when it was detected less than resume_p99_s before the run stopped, or before its
client went away (left, or was stopped: its last exchange ended then): it was given no
chance, so it is *censored* (left out and counted).

Calls that never got an outcome (`lab.checker.truth.liveness`: a tool call the wire shows,
whose client never wrote its outcome by the end of the run) are never recovered too,
whatever the client recorded: each counts as one infinitely slow recovery (path
`never_finished`), unless the client already lists it as an open recovery or it started
less than resume_p99_s before the run stopped.

p99 is the nearest-rank percentile: the ceil(0.99 n)-th smallest latency, a latency that
really happened (no interpolation, which would be meaningless next to infinity). The
gate fails when p99 >= the budget. Witnesses: the recoveries at or above the budget,
slowest first (never-recovered ones first). Evidence: recoveries (censored excluded)
>= min_recoveries. Slow recoveries are not attributed: the ledgers do not say whose
slowness it was.

Two server checks from the wire stand beside the latency (`lab.checker.truth.wire_streams`),
each a violation that fails the gate, attributed to the server: `no_priming` (a
2025-11-25 POST stream that does not start with its priming event) and
`silent_resumption` (a cursor the server never sent, answered 2xx with a stream that
carries no message for resume_p99_s or more). They are counted in `violations` and
witnessed first; the evidence minimum (recoveries) is the latency's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, client_ref, finite_or_none, row_of, tap_ref
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.resume_sut import check as read_under_test
from lab.checker.truth.liveness import describe_stuck, never_finished_latencies
from lab.checker.truth.recoveries import NEVER_FINISHED, PERCENTILE, nearest_rank, run_latencies
from lab.checker.truth.wire_streams import no_priming, no_priming_witness, silent_resumptions, silent_witness


def check(ctx: Context) -> GateResult:
    budget = ctx.budgets.resume_p99_s
    lat = run_latencies(ctx)
    stuck = never_finished_latencies(ctx)
    if len(stuck):
        lat = pd.concat([lat, _as_recoveries(stuck)], ignore_index=True)
    counted = lat[~lat["censored"]]
    values = counted["latency"].to_numpy(dtype="float64")
    p99 = nearest_rank(values, PERCENTILE)
    n = len(counted)
    slow_p99 = n > 0 and p99 >= budget
    unprimed, primed_judged = no_priming(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    silent, silent_judged = silent_resumptions(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    server_count = len(unprimed) + len(silent)
    failed = slow_p99 or server_count > 0
    slow = counted[counted["latency"] >= budget].sort_values("latency", ascending=False, kind="stable")
    finite = values[np.isfinite(values)]
    never = int(np.isinf(values).sum())
    negative = int((finite < 0).sum())
    need = max(1, ctx.budgets.min_recoveries)  # no recovery at all is no evidence, whatever the budget
    evidence = [
        ctx.events_evidence(),
        Evidence("recoveries", need, n, n >= need),
        *ctx.client_evidence(),
    ]
    notes = []
    if negative:
        notes.append(f"{negative} recovery row(s) have recovered_at before lost_at")
    censored = int(lat["censored"].sum())
    if censored:
        notes.append(f"{censored} loss(es) still open when the run stopped were left out (censored)")
    p99_text = "n/a" if math.isnan(p99) else ("never (inf)" if math.isinf(p99) else f"{p99:.3f} s")
    return GateResult(
        verdict=decide(failed, evidence),
        summary=f"p99 {p99_text} over {n} recoveries (budget < {budget:g} s)"
        + (
            f"; server: {len(unprimed)} POST stream(s) without priming event, {len(silent)} silent "
            "resumption(s) on an unknown cursor"
            if server_count
            else ""
        ),
        budget={"resume_p99_s": budget, "min_recoveries": need},
        measured={
            "recoveries": n,
            "p50_s": finite_or_none(nearest_rank(values, 0.5)),
            "p90_s": finite_or_none(nearest_rank(values, 0.9)),
            "p99_s": finite_or_none(p99),
            "p99_unbounded": bool(math.isinf(p99)),
            "max_recovered_s": float(finite.max()) if len(finite) else None,
            "never_recovered": never,
            "never_finished_calls": len(stuck),
            "censored": censored,
            "by_path": {str(k): int(v) for k, v in counted["path"].value_counts().items()},
            "no_priming": len(unprimed),
            "post_streams_judged_for_priming": primed_judged,
            "silent_resumptions": len(silent),
            "unknown_cursor_resumptions_served": silent_judged,
        },
        evidence=tuple(evidence),
        violations=(len(slow) if slow_p99 else 0) + server_count,
        witnesses=tuple(no_priming_witness(r, ctx) for _, r in unprimed.head(ctx.witness_limit).iterrows())
        + tuple(silent_witness(r, ctx) for _, r in silent.head(ctx.witness_limit).iterrows())
        + (
            tuple(_witness(r, budget, ctx) for _, r in slow.head(ctx.witness_limit).iterrows())
            if slow_p99
            else ()
        ),
        attribution_counts=({"unattributed": len(slow)} if slow_p99 else {})
        | ({"server": server_count} if server_count else {}),
        notes=tuple(notes),
    )


def _as_recoveries(stuck: pd.DataFrame) -> pd.DataFrame:
    """Calls without an outcome as never-recovered `recoveries` rows."""
    return pd.DataFrame(
        {
            "client_id": stuck["client_id"].to_numpy(dtype=object),
            "stream_key": None,
            "operation_key": stuck["operation_key"].to_numpy(dtype=object),
            "cause": "no_outcome",
            "lost_at": stuck["started_at"].to_numpy(dtype="float64"),
            "recovered_at": np.nan,
            "path": NEVER_FINISHED,
            "attempts": 0,
            "reinitialized": 0,
            "latency": math.inf,
            "censored": False,
            "tool": stuck["tool"].to_numpy(dtype=object),
            "started_at": stuck["started_at"].to_numpy(dtype="float64"),
            "_line": stuck["_line"].to_numpy(dtype=object),
        }
    )


def _witness(r: pd.Series, budget: float, ctx: Context) -> Witness:
    if r["path"] == NEVER_FINISHED:
        fields = row_of(r, ["client_id", "operation_key", "tool", "started_at"])
        fields["latency_s"] = None
        text = f"{describe_stuck(r, ctx)}: never recovered (counts as infinite; budget {budget:g} s)"
        return Witness("never_finished", text, Attribution.UNATTRIBUTED, fields, tuple(tap_ref(r)))
    latency = float(r["latency"])
    took = "never recovered" if math.isinf(latency) else f"recovered after {latency:.3f} s"
    text = (
        f"client {r['client_id']} lost {r['stream_key']} ({r['cause']}) {at(r['lost_at'], ctx.origin)} and {took} "
        f"(path {r['path']}, {r['attempts']} attempt(s), re-handshake {'yes' if r['reinitialized'] else 'no'}); "
        f"budget {budget:g} s"
    )
    fields = row_of(
        r,
        [
            "client_id",
            "stream_key",
            "operation_key",
            "cause",
            "lost_at",
            "recovered_at",
            "path",
            "attempts",
            "reinitialized",
        ],
    )
    fields["latency_s"] = None if math.isinf(latency) else latency
    refs = client_ref(ctx.data.client_files, "recoveries", r)
    return Witness("slow_recovery", text, Attribution.UNATTRIBUTED, fields, tuple(refs))


RULE = Rule(
    id="resume_p99",
    number=5,
    title="Resume latency p99",
    blames=(Attribution.SERVER, Attribution.CLIENT, Attribution.UNATTRIBUTED),
    evidence="enough recoveries (budgets.min_recoveries)",
    check=check,
    check_under_test=read_under_test,
    budget_key="resume_p99_s",
    judged_to_knee=True,
    liveness=True,
)
