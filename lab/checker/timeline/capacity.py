"""Capacity: the knee of a stepped ramp (scenarios with `ramp` phases).

A **step** begins with a `ramp` phase (its `users` are the step's) and lasts until the
next ramp phase begins, so it holds the phases that follow its ramp (a `steady` hold).
A step is **judged** on its hold (the phases after its ramp) when it has one, else on
its ramp's last half: the clients have arrived by then. A step **holds** when, in its
judged window:
- resume p99 < `resume_p99_s` (gate 5's budget; a loss never recovered: infinite),
- the call error rate <= `call_error_rate_max` (default 0.01),
- the busiest second of reconnects <= `reconnect_qps` (gate 6's budget),
- no violation of gates 1–4 happened in it (their offending rows, by time).

The **knee** is the largest step before the first step that does not hold (`knee_users`
its users; null when the first step already fails; the last step's users, with
`knee_passed` false, when every step holds). The first step past it is reported with its
metrics and the criteria it broke. When the lab itself was saturated in that step
(`lab.checker.health.lab_limits`), the knee is the lab's, not the target's: `limited_by` says
so and names the process, with the Locust workers the step would have needed.

**Which metric bent first**: for each metric, the first step where it left its first
step's level — events per client per second below 90 %, resume p99 above 2 x the first
step's + 0.25 s, the error rate 1 point above, peak reconnects above 2 x + 5 — and
`bent_first` the earliest of those (ties: all of them, in that order).

`step_misses` is pure: `lab run` uses it live (with the client tables alone) to stop a
ramp one step past its knee (`load.until_knee`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import pandas as pd

from lab.checker.context import Context
from lab.checker.health import lab_limits
from lab.checker.inputs.phase_specs import PhaseSpec
from lab.checker.model import Attribution, GateResult, JsonValue
from lab.checker.timeline import phases
from lab.checker.timeline.phases import Metrics


@dataclass(frozen=True, slots=True)
class TimedRule:
    """A rule whose violations are placed in a step by the times of their rows (the judge
    gives them, from the rule registry: the timeline knows no rule)."""

    id: str
    check: Callable[[Context], GateResult]
    server_times: Callable[[Context], Sequence[float]] | None = None
    """The times of all the server's own offending sends, known without witnesses."""


type Rejudge = Callable[[GateResult, Context], GateResult | None]
"""A rule's verdict judged again on other inputs (None: that rule is not judged again)."""
TIME_FIELDS = ("t", "accepted_at", "at", "started_at", "ended_at", "sent_at", "lost_at")
MAX_WITNESSES = 500
"""Violations placed in time by their witnesses (beyond these, a step's count is a lower bound)."""


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    users: int | None
    start: float
    end: float
    judged_start: float
    judged_end: float


def steps(specs: Sequence[PhaseSpec]) -> list[Step]:
    """The ramp's steps that ran to their end, each from its ramp phase to the next ramp
    (a step the run stopped in, e.g. once a ramp passed its knee, is left out)."""
    out = []
    ramps = [i for i, p in enumerate(specs) if p.kind == "ramp"]
    for n, i in enumerate(ramps):
        ramp = specs[i]
        last = ramps[n + 1] if n + 1 < len(ramps) else len(specs)
        if not all(p.complete for p in specs[i:last]):
            break
        hold = [p for p in specs[i + 1 : last] if p.seconds > 0]
        end = max([ramp.end, *(p.end for p in hold)])
        judged = (hold[0].start, end) if hold else ramp.last_half()
        out.append(Step(ramp.name, ramp.users, ramp.start, end, judged[0], judged[1]))
    return out


def applies(specs: Sequence[PhaseSpec]) -> bool:
    return any(p.kind == "ramp" for p in specs)


def step_misses(
    m: Metrics, *, resume_p99_s: float, call_error_rate_max: float, reconnect_qps: float | None
) -> list[str]:
    """The budget criteria a step's metrics break (pure): resume_p99_s, call_error_rate,
    reconnect_qps."""
    out = []
    p99 = m.resume_p99_or_inf
    if p99 is not None and p99 >= resume_p99_s:
        out.append("resume_p99_s")
    if m.calls and m.call_error_rate is not None and m.call_error_rate > call_error_rate_max:
        out.append("call_error_rate")
    if (
        reconnect_qps is not None
        and m.reconnect_qps_peak is not None
        and m.reconnect_qps_peak > reconnect_qps
    ):
        out.append("reconnect_qps")
    return out


def _time_of(row: Mapping[str, object]) -> float | None:
    for name in TIME_FIELDS:
        value = row.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def gate_violation_times(
    ctx: Context, gates: Sequence[GateResult], timed: Sequence[TimedRule] = ()
) -> dict[str, list[float]]:
    """rule ID -> the times of its violations, for the timed rules (gates 1–4) that failed.
    The server's offending sends (gate 1) all come with their time (`server_times`);
    other violations are placed by their witnesses' times, re-run with up to
    `MAX_WITNESSES` of them (the verdict's copy keeps only the first few)."""
    failing = {g.gate: g for g in gates if g.violations}
    out: dict[str, list[float]] = {}
    for rule in timed:
        g = failing.get(rule.id)
        if g is None:
            continue
        times: list[float] = []
        rerun = True
        if rule.server_times is not None:
            times += [
                float(t) for t in pd.to_numeric(pd.Series(rule.server_times(ctx)), errors="coerce").dropna()
            ]
            rerun = bool(g.attribution_counts.get("client"))
        if rerun:
            full = Context(ctx.data, ctx.budgets, MAX_WITNESSES, ctx._cache)
            result = rule.check(full)
            times += [
                t
                for w in result.witnesses
                if not (rule.server_times is not None and w.attribution is Attribution.SERVER)
                and (t := _time_of(w.row)) is not None
            ]
        out[rule.id] = times
    return out


BEND_RULES: tuple[tuple[str, str], ...] = (
    ("events_per_client_s", "below 90 % of the first step's"),
    ("resume_p99_s", "above 2 x the first step's + 0.25 s"),
    ("call_error_rate", "1 point above the first step's"),
    ("reconnect_qps_peak", "above 2 x the first step's + 5"),
)


def _per_client(m: Metrics, users: int | None) -> float | None:
    if m.events_per_s is None or not users:
        return None
    return m.events_per_s / users


def bent(first: Metrics, m: Metrics, first_users: int | None, users: int | None) -> list[str]:
    """The metrics of `m` that left the first step's level (BEND_RULES)."""
    out = []
    a, b = _per_client(first, first_users), _per_client(m, users)
    if a is not None and b is not None and b < 0.9 * a:
        out.append("events_per_client_s")
    p0, p1 = first.resume_p99_or_inf, m.resume_p99_or_inf
    if p1 is not None and p1 > 2 * (p0 or 0.0) + 0.25:
        out.append("resume_p99_s")
    if m.calls and (m.call_error_rate or 0.0) > (first.call_error_rate or 0.0) + 0.01:
        out.append("call_error_rate")
    if (m.reconnect_qps_peak or 0) > 2 * (first.reconnect_qps_peak or 0) + 5:
        out.append("reconnect_qps_peak")
    return out


def section(
    ctx: Context, gates: Sequence[GateResult] = (), timed: Sequence[TimedRule] = ()
) -> dict[str, JsonValue] | None:
    """report.json `capacity` (null for a run without ramp phases)."""
    specs = phases.specs(ctx)
    if not applies(specs):
        return None
    tol = phases.tolerances(ctx.data.run)
    b = ctx.budgets
    budgets: dict[str, JsonValue] = {
        "resume_p99_s": b.resume_p99_s,
        "call_error_rate_max": tol["call_error_rate_max"],
        "reconnect_qps": b.reconnect_qps,
    }
    violations = gate_violation_times(ctx, gates, timed)
    found = steps(specs)
    ramp = _walk_steps(ctx, found, violations, tol["call_error_rate_max"])
    rows, knee, past = ramp.rows, ramp.knee, ramp.past
    limited = _lab_limit_past_knee(ctx, ramp, found)
    first_bend = min(ramp.bend_at.values(), default=None)
    bent_first = (
        [name for name, _ in BEND_RULES if ramp.bend_at.get(name) == first_bend]
        if first_bend is not None
        else []
    )
    knee_users = found[knee].users if knee is not None else None
    text, limited_by = _knee_text(ctx, ramp, found, limited)
    return {
        "steps": list(rows),
        "knee_users": knee_users,
        "knee_step": found[knee].name if knee is not None else None,
        "knee_passed": past is not None,
        "past_knee": dict(rows[past]) if past is not None else None,
        "limited_by": limited_by,
        "limited_by_lab": lab_limits.limit_json(limited),  # type: ignore[dict-item]
        "bent_first": list(bent_first),
        "bent_first_step": found[first_bend].name if first_bend is not None else None,
        "bends": dict(ramp.bends),
        "bend_rules": {name: rule for name, rule in BEND_RULES},
        "budgets": budgets,
        "text": text,
    }


@dataclass(slots=True)
class _Ramp:
    """The steps of a ramp as judged, in order: their report rows, the knee (the last step
    before the first that does not hold) and that first step past it (indices in the
    steps; None when there is none), and for each bent metric the step it first bent at
    (`bends`: its name, `bend_at`: its index)."""

    rows: list[dict[str, JsonValue]]
    knee: int | None
    past: int | None
    bends: dict[str, str]
    bend_at: dict[str, int]


def _walk_steps(
    ctx: Context, found: Sequence[Step], violations: Mapping[str, list[float]], call_error_rate_max: float
) -> _Ramp:
    """Each step measured on its judged window and judged against the budgets, the gate
    violations in it and the first step's level, until the knee and past it."""
    ramp = _Ramp([], None, None, {}, {})
    metrics: list[Metrics] = []
    for i, st in enumerate(found):
        m = ctx.cached(f"capacity:{st.name}", partial(phases.measure, ctx, st.judged_start, st.judged_end))
        metrics.append(m)
        missed = step_misses(
            m,
            resume_p99_s=ctx.budgets.resume_p99_s,
            call_error_rate_max=call_error_rate_max,
            reconnect_qps=ctx.budgets.reconnect_qps,
        )
        in_step = {
            gate: sum(1 for t in times if st.judged_start <= t < st.judged_end)
            for gate, times in violations.items()
        }
        missed += [f"gate:{gate}" for gate, n in in_step.items() if n]
        if i > 0:
            for name in bent(metrics[0], m, found[0].users, st.users):
                if name not in ramp.bend_at:
                    ramp.bend_at[name], ramp.bends[name] = i, st.name
        ramp.rows.append(_step_row(st, m, in_step, missed))
        if missed and ramp.past is None:
            ramp.past = i
        if ramp.past is None:
            ramp.knee = i
    return ramp


def _step_row(st: Step, m: Metrics, in_step: Mapping[str, int], missed: list[str]) -> dict[str, JsonValue]:
    """report.json `capacity.steps[]`: one step, its metrics and what it missed."""
    return {
        "name": st.name,
        "users": st.users,
        "start": st.start,
        "end": st.end,
        "judged_start": st.judged_start,
        "judged_end": st.judged_end,
        **phases.metrics_json(m),
        "events_per_client_s": None if (v := _per_client(m, st.users)) is None else round(v, 4),
        "gate_violations": {k: v for k, v in in_step.items() if v},
        "missed": list(missed),
        "holds": not missed,
    }


def _lab_limit_past_knee(ctx: Context, ramp: _Ramp, found: Sequence[Step]) -> lab_limits.LabLimit | None:
    """Whether the lab was saturated in the first step past the knee (compared with the
    knee's step); said in that step's row too. None without a step past the knee."""
    if ramp.past is None:
        return None
    knee = ramp.knee
    st = found[ramp.past]
    reference = (
        (found[knee].judged_start, found[knee].judged_end, found[knee].users) if knee is not None else None
    )
    limited = lab_limits.limit(ctx, st.judged_start, st.judged_end, users=st.users, reference=reference)
    ramp.rows[ramp.past]["limited_by_lab"] = lab_limits.limit_json(limited)  # type: ignore[assignment]
    return limited


def _knee_text(
    ctx: Context, ramp: _Ramp, found: Sequence[Step], limited: lab_limits.LabLimit | None
) -> tuple[str, str | None]:
    """(text, limited_by): the capacity's sentence, and what limited it — `lab`, `target`,
    `unclear` (no process was CPU-bound), None without a knee. A step past the knee that
    the lab did not limit gets its `target_cpu_p95` in its row."""
    rows, knee, past = ramp.rows, ramp.knee, ramp.past
    knee_users = found[knee].users if knee is not None else None
    if past is None:
        text = (
            f"no knee: every step held, up to {knee_users} clients (the target's capacity is at least that)"
            if found
            else "no step of the ramp was reached"
        )
        return text, None
    broke = ", ".join(str(x) for x in rows[past]["missed"])  # type: ignore[union-attr]
    where = f"{knee_users} clients" if knee_users is not None else "below the first step"
    if limited is not None:
        text = (
            f"knee at {where}, {limited.text()}: step {found[past].name!r} ({found[past].users} clients) "
            f"broke {broke} while the lab was saturated — the lab's limit, not the target's capacity"
        )
        return text, "lab"
    st = found[past]
    busy = lab_limits.target_cpu_p95(ctx, st.judged_start, st.judged_end)
    rows[past]["target_cpu_p95"] = None if busy is None else round(busy, 3)
    text = f"knee at {where}: step {st.name!r} ({st.users} clients) broke {broke}"
    if busy is not None and busy < lab_limits.TARGET_IDLE_CPU:
        # Neither the lab nor the target ran out of CPU: something waited in the chain.
        text += (
            f", but no process was CPU-bound: the reference server used at most {busy:.2f} cores "
            "(p95) and no lab process was saturated, so the time went to waiting somewhere in the "
            "chain (client, nemesis, proxy, sockets), not to the target's work"
        )
        return text, "unclear"
    return text, "target"


def bounded_to_knee(
    ctx: Context,
    gates: Sequence[GateResult],
    section: Mapping[str, object],
    rejudge: Rejudge,
) -> tuple[GateResult, ...]:
    """Gates 5 and 6 of a ramp that passed its knee, judged on what happened before the
    first step past it: a capacity ramp goes past its budgets on purpose, and those steps
    are what found the knee. The rows after it still count for gates 1–4."""
    past = section.get("past_knee")
    assert isinstance(past, Mapping)
    bound = float(past["start"])
    data = ctx.data
    client = dict(data.client or {})
    for table, column in (("recoveries", "lost_at"), ("reconnects", "sent_at")):
        if table in client:
            frame = client[table]
            client[table] = frame[pd.to_numeric(frame[column], errors="coerce") < bound]
    tap = None
    if data.tap is not None:
        tap = dict(data.tap)
        tap["flow"] = tap["flow"][pd.to_numeric(tap["flow"]["t"], errors="coerce") < bound]
    run = {**(data.run or {}), "stopped_at": bound}
    before = dataclasses.replace(data, client=client, tap=tap, run=run)
    bounded = Context(before, ctx.budgets, ctx.witness_limit)
    origin = ctx.origin or 0.0
    out = []
    for g in gates:
        r = rejudge(g, bounded)
        if r is None:
            out.append(g)
            continue
        note = (
            f"judged up to the capacity ramp's first step past its knee (T+0..{bound - origin:.0f} s, step "
            f"{past['name']!r}): the steps from there are what found the knee ({section.get('text')})"
        )
        out.append(dataclasses.replace(r, summary=f"{r.summary}; {note}", notes=(*r.notes, note)))
    return tuple(out)
