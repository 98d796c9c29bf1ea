"""What the judge adds to the rules' verdicts: the lab's own limits, and the report's
sections beside the rules.

    finish(ctx, gates, timed, rejudge)
                                the lab's limits on gate 5 (a failure caused by a
                                saturated lab process is inconclusive, naming it:
                                `lab.checker.health.lab_limits`) and the lab's own latency
                                (a warning in gate 5's notes: `lab.checker.health.lab_latency`),
                                and requests gone unanswered on the lab's hops while a
                                lab part was saturated (`lab_limits.qualify_unanswered`);
                                report.json's sections (`unanswered`, `fault_outcomes`,
                                `fault_triggers`, `lab_latency`, `phases`, `capacity`, `rollout`, `restarts`, `processes`);
                                and, in a
                                capacity ramp that passed its knee, the rules judged to the
                                knee (5 and 6) judged up to the first step past it (the steps
                                beyond are what found the knee, not a failure of the run)

Called by `lab.checker.judge.verdict.judge`, the single judge.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from lab.checker.context import Context
from lab.checker.health import lab_latency, lab_limits, processes, unanswered
from lab.checker.model import GateResult, JsonValue
from lab.checker.rules import resume, rollout
from lab.checker.timeline import capacity, phases, restarts
from lab.checker.truth import eras, fault_outcomes, triggers


def finish(
    ctx: Context,
    gates: tuple[GateResult, ...],
    timed: Sequence[capacity.TimedRule],
    rejudge: capacity.Rejudge,
) -> tuple[tuple[GateResult, ...], dict[str, JsonValue], list[str]]:
    """(the gates as the verdict takes them, report.json's sections, problems). `timed`:
    the rules whose violations a capacity step places by time; `rejudge`: a rule judged
    again on the rows before a ramp's knee (both from the judge's registry)."""
    gates = qualify(ctx, gates)
    found, problems = sections(ctx, gates, timed)
    cap = found.get("capacity")
    # (A ramp whose first step already failed has no knee: that failure is the run's.)
    if isinstance(cap, dict) and isinstance(cap.get("past_knee"), dict) and cap.get("knee_users") is not None:
        try:
            gates = capacity.bounded_to_knee(ctx, gates, cap, rejudge)
            gates = qualify(ctx, gates)
        except Exception as e:
            problems.append(
                f"capacity: gates 5 and 6 could not be judged up to the knee: {type(e).__name__}: {e}"
            )
    return gates, found, problems


def qualify(ctx: Context, gates: tuple[GateResult, ...]) -> tuple[GateResult, ...]:
    out = []
    for g in gates:
        if g.gate == resume.RULE.id:
            # On an error the gate's own verdict stands; the report lists the process figures
            # and the unanswered requests (their section reports its own error).
            with contextlib.suppress(Exception):
                g = lab_limits.qualify_unanswered(ctx, g)
            with contextlib.suppress(Exception):
                g = lab_limits.qualify_resume(ctx, g)
            # The lab's own latency, when it is a sizeable share of the budget: a warning
            # in the notes, the verdict unchanged (an error here leaves the gate as it is;
            # the section then reports the error).
            with contextlib.suppress(Exception):
                g = lab_latency.qualify_resume(ctx, g)
        out.append(g)
    return tuple(out)


def sections(
    ctx: Context, gates: tuple[GateResult, ...], timed: Sequence[capacity.TimedRule] = ()
) -> tuple[dict[str, JsonValue], list[str]]:
    """(report.json sections, problems in computing them): `unanswered`, `fault_outcomes`,
    `fault_triggers`, `lab_latency`, `phases`, `capacity` (null without ramp phases), `rollout` (null without
    rollout knobs), `restarts` (null without restarts), `eras` (null in a run of one protocol
    era), `processes`."""
    out: dict[str, JsonValue] = {}
    problems: list[str] = []
    makers: list[tuple[str, Callable[[], JsonValue]]] = [
        (
            "unanswered",
            lambda: unanswered.section(
                ctx,
                lab_limits.unanswered_limit_json(lim := lab_limits.unanswered_limit(ctx), ctx.origin),
                None if lim is None else list(lim.reasons),
            ),
        ),
        ("fault_outcomes", lambda: fault_outcomes.section(ctx)),
        ("fault_triggers", lambda: triggers.section(ctx)),
        ("lab_latency", lambda: lab_latency.section(ctx)),
        ("phases", lambda: list(phases.section(ctx))),
        ("capacity", lambda: capacity.section(ctx, gates, timed)),
        ("rollout", lambda: rollout.section(ctx)),
        ("restarts", lambda: restarts.section(ctx)),
        ("eras", lambda: eras.section(ctx)),
        ("processes", lambda: processes.section(processes.samples(ctx))),
    ]
    for name, make in makers:
        try:
            out[name] = make()
        except Exception as e:
            out[name] = None
            problems.append(f"{name}: could not be computed: {type(e).__name__}: {e}")
    return out, problems
