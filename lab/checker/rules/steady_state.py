"""Gate 7 — steady state restored (scenarios with `recovery` phases only).

The chaos-engineering hypothesis: state the normal, break things, check the normal came
back. The normal is the **baseline**: the `steady` phase before the first `recovery`
phase (the last one before it, when there are several). Each `recovery` phase must bring
the run back within tolerance of it. Both are judged on their **last half** (the
baseline's first half holds the clients' ramp-up, a recovery's first half the aftermath
the phase exists to absorb). Tolerances are run.json budgets (docs/scenarios.md), by
default:

    events_per_s     >= recovery_events_ratio (0.9) x the baseline's
    resume_p99_s     <= recovery_resume_p99_factor (1.5) x the baseline's
                        + recovery_resume_p99_slack_s (0.25 s)   (no recovery in the
                        baseline: its p99 is taken as 0; none in the recovery phase:
                        nothing was slow; a loss never recovered is infinitely slow).
                        Judged on the target's own share of each recovery where the
                        recoveries could be split on the wire (baseline and recovery
                        phase alike, lab.checker.truth.shares), by the one rule
                        `judge_share`: a total over the limit that the target's share
                        does not explain is limited by the lab, not a miss
    call_error_rate  <= the baseline's + recovery_error_rate_slack (0.01: one point)
                        (not judged when no call finished in the recovery half)

Each metric that did not come back is one violation, with a witness naming the phase and
the metric. Inconclusive: no steady phase before the first recovery phase, fewer than
`min_baseline_events` (100) events in the baseline's last half, or a recovery phase the
run never reached. A recovery phase whose judged half coincides with a saturated lab
process (`lab.checker.health.lab_limits`) is not held against the target: its misses are
listed as limited by the lab, and the gate is inconclusive, never passed on them.
"""

from __future__ import annotations

import math

from lab.checker.context import Context
from lab.checker.health import lab_limits
from lab.checker.inputs.phase_specs import PhaseSpec
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Scalar, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.timeline import phases
from lab.checker.timeline.phases import Metrics
from lab.checker.truth.shares import ShareVerdict, judge_share


def applies(ctx: Context) -> bool:
    """Only scenarios with a `recovery` phase are judged by this gate."""
    return any(p.kind == "recovery" for p in phases.specs(ctx))


def baseline(specs: list[PhaseSpec]) -> PhaseSpec | None:
    """The last `steady` phase before the first `recovery` phase."""
    first = next((i for i, p in enumerate(specs) if p.kind == "recovery"), None)
    if first is None:
        return None
    steady = [p for p in specs[:first] if p.kind == "steady"]
    return steady[-1] if steady else None


def limits(base: Metrics, tol: phases.Tolerances) -> dict[str, float]:
    """What a recovery phase must reach, from the baseline's metrics (its resume p99: the
    target's share where it was split)."""
    base_p99 = base.resume_p99_or_inf if base.resume_target_p99 is None else base.resume_target_p99
    return {
        "events_per_s_min": (base.events_per_s or 0.0) * tol["recovery_events_ratio"],
        "resume_p99_s_max": (0.0 if base_p99 is None else base_p99) * tol["recovery_resume_p99_factor"]
        + tol["recovery_resume_p99_slack_s"],
        "call_error_rate_max": (base.call_error_rate or 0.0) + tol["recovery_error_rate_slack"],
    }


def misses(m: Metrics, lim: dict[str, float]) -> list[tuple[str, float | None, float]]:
    """(metric, measured, limit) for each metric of `m` outside `lim` (pure)."""
    out: list[tuple[str, float | None, float]] = []
    if (m.events_per_s or 0.0) < lim["events_per_s_min"]:
        out.append(("events_per_s", m.events_per_s, lim["events_per_s_min"]))
    p99 = m.resume_p99_or_inf
    share = resume_share_verdict(m, lim)
    if share is not None:
        if share.failed:
            judged = m.resume_target_p99
            out.append(
                (
                    "resume_p99_s",
                    None if judged is None or math.isinf(judged) else judged,
                    lim["resume_p99_s_max"],
                )
            )
    elif p99 is not None and p99 > lim["resume_p99_s_max"]:
        out.append(("resume_p99_s", None if math.isinf(p99) else p99, lim["resume_p99_s_max"]))
    if m.call_error_rate is not None and m.calls and m.call_error_rate > lim["call_error_rate_max"]:
        out.append(("call_error_rate", m.call_error_rate, lim["call_error_rate_max"]))
    return out


def resume_share_verdict(m: Metrics, lim: dict[str, float]) -> ShareVerdict | None:
    """The phase's resume p99 judged on the target's share (None: not split)."""
    total = m.resume_p99_or_inf
    if m.resume_target_p99 is None or total is None:
        return None
    return judge_share(total, m.resume_target_p99, lim["resume_p99_s_max"], share="target")


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "never (a loss never recovered)" if metric == "resume_p99_s" else "n/a"
    if metric == "call_error_rate":
        return f"{value:.2%}"
    if metric == "resume_p99_s":
        return f"{value:.3f} s"
    return f"{value:.1f}/s"


def check(ctx: Context) -> GateResult:
    specs = phases.specs(ctx)
    tol = phases.tolerances(ctx.data.run)
    base_spec = baseline(specs)
    recovery = [p for p in specs if p.kind == "recovery"]
    reached = [p for p in recovery if p.reached and p.seconds > 0]
    base = phases.phase_metrics(ctx, base_spec, last_half=True) if base_spec and base_spec.reached else None
    evidence = _evidence(base_spec, base, recovery, reached, need=max(1, int(tol["min_baseline_events"])))
    judged: list[dict[str, JsonValue]] = []
    witnesses: list[Witness] = []
    notes: list[str] = []
    violations = 0
    lab_limited: list[str] = []
    if base is not None and base_spec is not None:
        lim = limits(base, tol)
        for spec in reached:
            row, limited, missed = _judge_phase(ctx, spec, base, base_spec, lim)
            judged.append(row)
            share = resume_share_verdict(phases.phase_metrics(ctx, spec, last_half=True) or base, lim)
            if limited is None and share is not None and share.limited_by_lab and not missed:
                lab_limited.append(spec.name)
                notes.append(f"recovery phase {spec.name!r}: resume p99 {share.text}")
                evidence.append(
                    Evidence(
                        f"phase {spec.name!r} judged on the target's share",
                        "a total resume p99 within the limit, or the target's share over it",
                        "limited by the lab",
                        False,
                        share.text,
                    )
                )
                continue
            if limited is not None:
                lab_limited.append(spec.name)
                notes.append(f"recovery phase {spec.name!r}: {limited.text()}")
                evidence.append(lab_limits.lab_evidence(limited))
                continue
            violations += len(missed)
            witnesses += missed
        measured: dict[str, JsonValue] = {
            "baseline": _baseline_json(base_spec, base),
            "limits": {k: round(v, 4) for k, v in lim.items()},
            "phases": list(judged),
            "lab_limited": list(lab_limited),
        }
    else:
        measured = {"baseline": None, "phases": [], "lab_limited": []}
    measured["tolerances"] = dict(tol.values)
    if tol.defaulted:
        measured["tolerances_defaulted"] = list(tol.defaulted)
    failed = violations > 0
    n_ok = len(reached) - len({w.row["phase"] for w in witnesses}) - len(lab_limited)
    summary = (
        f"{n_ok} of {len(recovery)} recovery phase(s) back within tolerance of the steady baseline "
        f"{base_spec.name if base_spec else '(none)'}; {violations} metric(s) not restored"
        + (f"; {len(lab_limited)} limited by the lab" if lab_limited else "")
    )
    return GateResult(
        verdict=decide(failed, evidence),
        summary=summary,
        budget={k: v for k, v in tol.values.items() if k.startswith(("recovery_", "min_baseline"))},
        measured=measured,
        evidence=tuple(evidence),
        violations=violations,
        witnesses=tuple(witnesses[: ctx.witness_limit]),
        attribution_counts={"unattributed": violations} if violations else {},
        notes=tuple(notes),
    )


def _evidence(
    base_spec: PhaseSpec | None,
    base: Metrics | None,
    recovery: list[PhaseSpec],
    reached: list[PhaseSpec],
    *,
    need: int,
) -> list[Evidence]:
    """The gate's evidence: a steady baseline reached, every recovery phase reached, and
    at least `need` events in the baseline's last half."""
    return [
        Evidence(
            "steady baseline phase",
            "a steady phase before the first recovery phase",
            base_spec.name if base_spec else None,
            base_spec is not None and base_spec.reached,
        ),
        Evidence("recovery phases reached", len(recovery), len(reached), len(reached) == len(recovery)),
        Evidence(
            "baseline events",
            need,
            None if base is None else base.events,
            base is not None and (base.events or 0) >= need,
            "SSE events with a message in the baseline's last half",
        ),
    ]


def _judge_phase(
    ctx: Context, spec: PhaseSpec, base: Metrics, base_spec: PhaseSpec, lim: dict[str, float]
) -> tuple[dict[str, JsonValue], lab_limits.LabLimit | None, list[Witness]]:
    """One recovery phase judged on its last half: (its row in `measured.phases`, the lab's
    limit when it missed while the lab was saturated, else a witness per metric missed)."""
    m = phases.phase_metrics(ctx, spec, last_half=True)
    assert m is not None
    missed = misses(m, lim)
    limited = (
        lab_limits.limit(
            ctx, m.start, m.end, users=spec.users, reference=(base.start, base.end, base_spec.users)
        )
        if missed
        else None
    )
    row: dict[str, JsonValue] = {
        "phase": spec.name,
        "judged_start": m.start,
        "judged_end": m.end,
        "events_per_s": m.events_per_s,
        "resume_p99_s": m.resume_p99_s,
        "resume_p99_unbounded": m.resume_p99_unbounded,
        "call_error_rate": m.call_error_rate,
        "events": m.events,
        "recoveries": m.recoveries,
        "calls": m.calls,
        "missed": [name for name, _, _ in missed],
        "limited_by_lab": lab_limits.limit_json(limited),  # type: ignore[dict-item]
    }
    if limited is not None:
        return row, limited, []
    origin = ctx.origin or 0.0
    return row, None, [_not_restored(spec, m, base, base_spec, miss, origin) for miss in missed]


def _not_restored(
    spec: PhaseSpec,
    m: Metrics,
    base: Metrics,
    base_spec: PhaseSpec,
    miss: tuple[str, float | None, float],
    origin: float,
) -> Witness:
    """The witness of one metric a recovery phase did not bring back to the baseline's."""
    name, value, bound = miss
    base_value = {
        "events_per_s": base.events_per_s,
        "resume_p99_s": base.resume_p99_s,
        "call_error_rate": base.call_error_rate,
    }[name]
    relation = ">=" if name == "events_per_s" else "<="
    text = (
        f"recovery phase {spec.name!r} (T+{spec.start - origin:.0f}..{spec.end - origin:.0f} s, judged on "
        f"T+{m.start - origin:.0f}..{m.end - origin:.0f} s) did not restore {name}: "
        f"{_fmt(name, value)}, needed {relation} {_fmt(name, bound)} "
        f"(steady baseline {base_spec.name!r}: {_fmt(name, base_value)})"
    )
    row: dict[str, Scalar] = {
        "phase": spec.name,
        "metric": name,
        "measured": value,
        "limit": round(bound, 4),
        "baseline_phase": base_spec.name,
        "baseline": base_value,
        "judged_start": m.start,
        "judged_end": m.end,
    }
    return Witness(name, text, Attribution.UNATTRIBUTED, row)


def _baseline_json(base_spec: PhaseSpec, base: Metrics) -> dict[str, JsonValue]:
    """`measured.baseline`: the steady baseline phase and its metrics on its last half."""
    return {
        "phase": base_spec.name,
        "judged_start": base.start,
        "judged_end": base.end,
        "events_per_s": base.events_per_s,
        "resume_p99_s": base.resume_p99_s,
        "resume_p99_unbounded": base.resume_p99_unbounded,
        "call_error_rate": base.call_error_rate,
        "events": base.events,
        "recoveries": base.recoveries,
        "calls": base.calls,
    }


RULE = Rule(
    id="steady_state",
    number=7,
    title="Steady state restored after each recovery phase",
    blames=(Attribution.SERVER, Attribution.UNATTRIBUTED),
    evidence="a steady phase before the first recovery phase, with min_baseline_events in its last half",
    check=check,
    check_under_test=check,
    applies=applies,
)
