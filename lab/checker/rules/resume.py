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

Three server checks from the wire stand beside the latency, each a violation that fails
the gate, attributed to the server: `no_priming` (a 2025-11-25 POST stream that does not
start with its priming event), `silent_resumption` (a cursor the server never sent,
answered 2xx with a stream that carries no message for resume_p99_s or more; both
`lab.checker.truth.wire_streams`) and `unreplayed_resumption` (a known cursor, answered
2xx, whose stream carried none of the messages the server had sent after it, or skipped
some: `lab.checker.truth.owed`). They are counted in `violations` and witnessed first;
the evidence minimum (recoveries) is the latency's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, client_ref, finite_or_none, row_of, tap_ref
from lab.checker.health.lab_limits import JUDGED_ON_TARGET
from lab.checker.inputs.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.resume_sut import check as read_under_test
from lab.checker.truth.eras import ERAS, client_eras
from lab.checker.truth.liveness import describe_stuck, never_finished_latencies
from lab.checker.truth.owed import unreplayed_resumptions, unreplayed_witness
from lab.checker.truth.recoveries import NEVER_FINISHED, PERCENTILE, nearest_rank, run_latencies
from lab.checker.truth.shares import (
    SHARES,
    ShareFigures,
    ShareVerdict,
    judge_share,
    recovery_shares,
    share_figures,
)
from lab.checker.truth.wire_streams import no_priming, no_priming_witness, silent_resumptions, silent_witness


def _p99_text(p99: float) -> str:
    return "n/a" if math.isnan(p99) else ("never (inf)" if math.isinf(p99) else f"{p99:.3f} s")


def _by_era(ctx: Context, counted: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """In a run of both eras, the recoveries' count and p99 per era (the clients' eras,
    lab.checker.truth.eras); empty otherwise, or without a client ledger."""
    if len(ctx.eras()) < 2 or ctx.data.client is None or "client_id" not in counted.columns:
        return {}
    era_of = client_eras(ctx)
    eras = counted["client_id"].map(lambda c: era_of.get(str(c)))
    out: dict[str, dict[str, Any]] = {}
    for era in ERAS:
        values = counted.loc[eras == era, "latency"].to_numpy(dtype="float64")
        out[era] = {"n": len(values), "p99": nearest_rank(values, PERCENTILE)}
    return out


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
    unprimed, primed_judged = no_priming(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    silent, silent_judged = silent_resumptions(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    unpaid, owing = unreplayed_resumptions(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    server_count = len(unprimed) + len(silent) + len(unpaid)
    latency = _latency_verdict(ctx, counted, stuck, p99, budget)
    slow_p99, limited, slow, judged, figures = (
        latency.failed,
        latency.limited,
        latency.slow,
        latency.judged,
        latency.figures,
    )
    failed = slow_p99 or server_count > 0
    finite = values[np.isfinite(values)]
    never = int(np.isinf(values).sum())
    negative = int((finite < 0).sum())
    need = max(1, ctx.budgets.min_recoveries)  # no recovery at all is no evidence, whatever the budget
    evidence = [
        ctx.events_evidence(),
        Evidence("recoveries", need, n, n >= need, from_faults=True),
        *ctx.client_evidence(),
    ]
    if limited and judged is not None:
        evidence.append(Evidence("the target's share explains the latency", True, False, False, judged.text))
    declined = int(lat["declined"].sum()) if "declined" in lat.columns else 0
    censored = int(lat["censored"].sum()) - declined
    notes = _notes(negative, censored, judged, figures, declined)
    p99_text = _p99_text(p99)
    by_era = _by_era(ctx, counted)
    if by_era:
        notes.append(
            "by era (resumptions in the handshake era, re-issues in the modern era): "
            + "; ".join(f"{e} p99 {_p99_text(r['p99'])} over {r['n']}" for e, r in by_era.items())
        )
    target_text = "" if judged is None else f"; {judged.text}"
    return GateResult(
        verdict=decide(failed, evidence),
        summary=f"p99 {p99_text} over {n} recoveries (budget < {budget:g} s){target_text}"
        + (
            f"; server: {len(unprimed)} POST stream(s) that did not start with a priming event, "
            f"{len(silent)} resumption(s) from a Last-Event-ID it never sent answered with silence, "
            f"{len(unpaid)} resumption(s) that left out messages they had to replay"
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
            "declined": declined,
            "by_path": {str(k): int(v) for k, v in counted["path"].value_counts().items()},
            "no_priming": len(unprimed),
            "post_streams_judged_for_priming": primed_judged,
            "silent_resumptions": len(silent),
            "unknown_cursor_resumptions_served": silent_judged,
            "unreplayed_resumptions": len(unpaid),
            "resumptions_owing_events": owing,
            "judged_on": JUDGED_ON_TARGET if latency.on_target else "total",
            "shares": _shares_json(figures),
            "by_era": {
                e: {"recoveries": r["n"], "p99_s": finite_or_none(r["p99"])} for e, r in by_era.items()
            }
            or None,
        },
        evidence=tuple(evidence),
        violations=(len(slow) if slow_p99 else 0) + server_count,
        witnesses=tuple(no_priming_witness(r, ctx) for _, r in unprimed.head(ctx.witness_limit).iterrows())
        + tuple(silent_witness(r, ctx) for _, r in silent.head(ctx.witness_limit).iterrows())
        + tuple(unreplayed_witness(r, ctx) for _, r in unpaid.head(ctx.witness_limit).iterrows())
        + (
            tuple(_witness(r, budget, ctx) for _, r in slow.head(ctx.witness_limit).iterrows())
            if slow_p99
            else ()
        ),
        attribution_counts=_blame_counts(slow, server_count, counted=slow_p99),
        notes=tuple(notes),
    )


def _notes(
    negative: int,
    censored: int,
    judged: ShareVerdict | None,
    figures: dict[str, ShareFigures] | None,
    declined: int = 0,
) -> list[str]:
    notes = []
    if negative:
        notes.append(f"{negative} recovery row(s) have recovered_at before lost_at")
    if censored:
        notes.append(
            f"{censored} loss(es) still open when the run stopped were left out: they happened less than the "
            "budget before the end, so the run gave them no chance to recover (censored)"
        )
    if declined:
        notes.append(
            f"{declined} loss(es) their client chose not to recover were left out: by the retry rule, a call that "
            "may have run and whose tool was not declared safe to repeat is not re-sent (its outcome is "
            "reported unknown), so nothing was asked of the target to time"
        )
    if judged is not None and figures is not None:
        notes.append(f"judged on the target's share: {judged.text}; {_shares_text(figures)}")
    return notes


@dataclass(frozen=True, slots=True)
class _LatencyVerdict:
    failed: bool
    """The p99 the target is judged on is at or over the budget."""
    limited: bool
    """The total is over the budget, the target's share is not: limited by the lab."""
    slow: pd.DataFrame
    """The recoveries at or over the budget in what was judged, slowest first."""
    judged: ShareVerdict | None
    figures: dict[str, ShareFigures] | None
    on_target: bool
    """The failure is the target's own share's (over the recoveries split), or nothing failed."""


def _latency_verdict(
    ctx: Context, counted: pd.DataFrame, stuck: pd.DataFrame, p99: float, budget: float
) -> _LatencyVerdict:
    """The target judged on its own share where the recoveries could be split, and on the
    whole latency where they could not (nothing then excuses it)."""
    split = _split(ctx)
    if split is None or not len(counted):
        slow = _slowest(counted, budget)
        return _LatencyVerdict(len(counted) > 0 and p99 >= budget, False, slow, None, None, False)
    shares, figures = split
    rows = _judged_rows(shares, stuck)
    target_p99 = nearest_rank(rows["judged_s"].to_numpy(dtype="float64"), PERCENTILE)
    judged = judge_share(p99, target_p99, budget, share="target")
    slow = rows[rows["judged_s"] >= budget].sort_values("judged_s", ascending=False, kind="stable")
    # The failure is the target's own when its slow recoveries timed on the wire are
    # enough, alone, to put the p99 over the budget: a recovery that could not be split
    # (judged on its whole latency) beside them does not make it a failure of the total
    # (which a saturated lab may then excuse). At n recoveries the p99 is over the budget
    # once n - ceil(0.99 n) + 1 of them are.
    n = len(rows)
    needed = n - max(1, math.ceil(PERCENTILE * n)) + 1
    on_target = not judged.failed or int(slow["target_s"].notna().sum()) >= needed
    return _LatencyVerdict(judged.failed, judged.limited_by_lab, slow, judged, figures, on_target)


def _split(ctx: Context) -> tuple[pd.DataFrame, dict[str, ShareFigures]] | None:
    """The recoveries' shares and their figures; None when they cannot be timed on the wire
    (no tap, an older tap without `t_request`, or not one recovery split)."""
    try:
        shares = recovery_shares(ctx)
    except MissingInput:
        return None
    figures = share_figures(shares)
    return (shares, figures) if figures["target"].n else None


def _slowest(counted: pd.DataFrame, budget: float) -> pd.DataFrame:
    return counted[counted["latency"] >= budget].sort_values("latency", ascending=False, kind="stable")


def _judged_rows(shares: pd.DataFrame, stuck: pd.DataFrame) -> pd.DataFrame:
    """The counted recoveries (and the calls that never finished, which cannot be split)
    with `judged_s`: the target's share where known, else the whole latency."""
    rows = pd.concat([shares, _as_recoveries(stuck)], ignore_index=True) if len(stuck) else shares.copy()
    rows["judged_s"] = rows["target_s"].astype("float64").fillna(rows["latency"].astype("float64"))
    return rows


def _blame(r: pd.Series) -> Attribution:
    """A slow recovery is the server's when its own share, timed at the wire, is what is slow."""
    target = r.get("target_s")
    return (
        Attribution.SERVER
        if isinstance(target, int | float) and not math.isnan(target)
        else Attribution.UNATTRIBUTED
    )


def _blame_counts(slow: pd.DataFrame, server_count: int, *, counted: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    if counted and len(slow):
        known = int(slow["target_s"].notna().sum()) if "target_s" in slow.columns else 0
        if known:
            out["server"] = known
        if len(slow) - known:
            out["unattributed"] = len(slow) - known
    if server_count:
        out["server"] = out.get("server", 0) + server_count
    return out


def _shares_json(figures: dict[str, ShareFigures] | None) -> JsonValue:
    if figures is None:
        return None
    return {
        name: {
            "recoveries": f.n,
            "p50_s": finite_or_none(f.p50_s),
            "p99_s": finite_or_none(f.p99_s),
            "p99_unbounded": bool(math.isinf(f.p99_s)),
        }
        for name, f in figures.items()
    }


def _shares_text(figures: dict[str, ShareFigures]) -> str:
    """`total p50 0.2 s / p99 0.7 s, client ..., lab ..., target ... over N recoveries split`."""

    def shown(v: float) -> str:
        return "never" if math.isinf(v) else ("n/a" if math.isnan(v) else f"{v:.3f} s")

    def one(f: ShareFigures) -> str:
        return f"{f.name} p50 {shown(f.p50_s)} / p99 {shown(f.p99_s)}"

    return "; ".join(one(f) for f in figures.values()) + f" (over {figures['total'].n} recoveries split)"


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
        f"budget {budget:g} s" + _row_shares(r)
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
    for share in SHARES:
        value = r.get(f"{share}_s")
        fields[f"{share}_s"] = finite_or_none(float(value)) if isinstance(value, int | float) else None
    return Witness("slow_recovery", text, _blame(r), fields, tuple(refs))


def _row_shares(r: pd.Series) -> str:
    """`; shares: client 0.1 s, lab 0.3 s, target 5.2 s` where the recovery was split."""
    parts = []
    for share in SHARES:
        value = r.get(f"{share}_s")
        if isinstance(value, int | float) and not math.isnan(value):
            parts.append(f"{share} " + ("never" if math.isinf(value) else f"{value:.3f} s"))
    return f"; shares: {', '.join(parts)}" if parts else ""


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
