"""The single judge: run every gate over a loaded run and give the run's whole verdict.

`judge(data)` is the only place a verdict is decided, for `lab report` and `lab run`
alike (both go through `lab.report.outputs.report_run`, which calls it), and for tests
that build their inputs in memory (`lab.checker.inputs.records`).

The run's verdict, in this order:
- `fail` if any gate failed (a violation is a violation, even in an interrupted run) —
  except that a run which did not finish cannot fail on liveness alone: a call that never
  recovered because the run (or one of the lab's own parts) was cut short is no evidence
  against the target, so gate 5 failing in an incomplete run leaves it `incomplete`;
- `incomplete` if the run did not finish: run.json `complete` false, or a run still
  `running` or `abandoned` (its `end_reason` or `status`);
- `inconclusive` if any gate was, or run.json is missing or refused, or any input file
  was refused (damaged, unreadable, an unknown schema, a field of the wrong type);
- `pass` otherwise.

Known failures (run.json `client.expected_failures`, lab.checker.judge.baseline) count as
passes, and a listed gate that passed ("fixed") as a failure, until the baseline loses it.
A run whose load was a client under test is judged by each rule's `check_under_test`
(lab.checker.judge.under_test). The rules are the registry's (lab.checker.rules).

A gate whose input is missing or refused is inconclusive with the reason; a gate whose
own code raises is inconclusive with the error (exception type, message and the line
that raised), and the other gates still run.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from lab.checker.context import Context, parse_budgets
from lab.checker.explain import short_reason
from lab.checker.inputs.load import MissingInput, RunData, load_run
from lab.checker.inputs.records import run_data_from_records
from lab.checker.inputs.schemas import RUN_STATES_UNFINISHED
from lab.checker.judge import baseline, by_era, capacity_check
from lab.checker.judge import sections as extras
from lab.checker.judge import under_test as sut
from lab.checker.model import (
    Evidence,
    FaultCount,
    GateResult,
    JsonValue,
    Liveness,
    NotApplicable,
    Problem,
    RunInfo,
    RunReport,
    Verdict,
    combine,
)
from lab.checker.rules import REGISTRY, Audience, Registry, Rule
from lab.checker.timeline.capacity import Rejudge, TimedRule
from lab.checker.truth import liveness
from lab.checker.truth.bounds import bound_notes
from lab.checker.truth.faults import configured_faults, count_faults
from lab.checker.truth.not_applicable import not_applicable
from lab.wire.revisions import BOTH_ERAS


def judge_dir(run_dir: Path, witness_limit: int = 5) -> tuple[RunData, RunReport]:
    """Load a run folder and judge it: (the loaded ledgers, the report)."""
    started = time.perf_counter()
    data = load_run(run_dir)
    return data, judge(data, witness_limit=witness_limit, started=started)


def judge(
    data: RunData,
    *,
    witness_limit: int = 5,
    started: float | None = None,
    rules: Registry = REGISTRY,
) -> RunReport:
    """The whole verdict of one run: the registry's rules that apply to it, faults, liveness."""
    started = time.perf_counter() if started is None else started
    budgets = parse_budgets(data.run)
    ctx = Context(data, budgets, witness_limit)
    # A client under test keeps no client ledger: its rules read the wire and its
    # application logs (each rule's `check_under_test`; lab.checker.judge.under_test).
    client = sut.client_of(data.run)
    under_test = sut.under_test(data.run)
    audience = Audience.UNDER_TEST if under_test else Audience.LAB
    judged = applicable(rules, ctx, audience)
    # A rule of no era the run tested is not applicable: shown as such, judging nothing.
    era_problems: list[Problem] = []
    eras = _eras(ctx, era_problems)
    in_era = tuple(rule for rule in judged if rule.eras & eras)
    gates = tuple(
        era_said(run_rule(rule, ctx, audience), rule, eras) if rule in in_era else not_in_era(rule, eras)
        for rule in judged
    )
    # The lab's own limits, the sections beside the rules (lab.checker.judge.sections).
    gates, sections, section_problems = extras.finish(
        ctx, gates, timed_rules(in_era, audience), rejudger(in_era, audience)
    )
    section_problems += _by_era(ctx, sections, eras, in_era, audience)
    if capacity_check.declared(data.run):
        # No faults by design: a rule left without the evidence only faults make is not
        # applicable there, not inconclusive (lab.checker.judge.capacity_check).
        gates = tuple(capacity_check.waive(g, rules[g.gate]) if g.gate in rules else g for g in gates)
    expectations = baseline.apply(gates, client.expected_failures if client is not None else ())
    problems = list(data.problems) + era_problems
    sources, notes = list(data.sources), list(data.notes) + bound_notes(ctx)
    if under_test and client is not None:
        logs = sut.logs_of(ctx)
        sources += logs.sources
        problems += logs.problems
        notes += logs.notes
        client = sut.implementations(ctx, client)
    if data.run is not None and budgets.defaulted:
        problems.append(
            Problem("run.json", f"budgets missing, the defaults used: {', '.join(budgets.defaulted)}")
        )
    run = run_info(data)
    unfinished = unfinished_reason(data.run)
    if unfinished is not None:
        problems.append(Problem("run.json", f"the run is incomplete ({unfinished}): it cannot pass"))
    unusable = data.run is None or any(s.status == "error" for s in sources)
    count, source = _event_count(ctx)
    faults, never, skipped = _faults(data, problems)
    problems += [Problem("report", p) for p in section_problems]
    live = _liveness(ctx, under_test, problems)
    return RunReport(
        run=run,
        verdict=run_verdict(
            (
                baseline.counted(g, expectations)  # known failures pass, fixed ones fail
                for g in gates
                # Liveness is the one thing an interrupted run cannot judge (module docstring).
                if not (unfinished is not None and g.gate in rules and rules[g.gate].liveness)
            ),
            incomplete=unfinished is not None,
            unusable=unusable,
        ),
        gates=gates,
        budgets=budgets.as_dict(),
        budgets_defaulted=budgets.defaulted,
        event_count=count,
        event_count_source=source,
        sources=tuple(sources),
        problems=tuple(problems),
        notes=tuple(notes),
        faults=tuple(faults),
        faults_never_fired=tuple(never),
        checked_at=time.time(),
        check_seconds=time.perf_counter() - started,
        incomplete=unfinished is not None,
        faults_not_applicable=tuple(skipped),
        liveness=live,
        sections=sections,
        client=client,
        expectations=expectations,
    )


def _event_count(ctx: Context) -> tuple[int | None, str]:
    try:
        return ctx.event_count()
    except Exception as e:  # the count is also evidence inside the gates, which report it
        return None, f"error: {e}"


def _faults(
    data: RunData, problems: list[Problem]
) -> tuple[list[FaultCount], list[str], list[NotApplicable]]:
    """(faults fired per kind, configured kinds never fired, faults the target refused)."""
    try:
        faults, never = count_faults(data)
        return faults, never, not_applicable(data)
    except Exception as e:
        problems.append(Problem("proxy/tap.jsonl", f"fault counts failed: {type(e).__name__}: {e}"))
        return [], [], []


def _liveness(ctx: Context, under_test: bool, problems: list[Problem]) -> Liveness | None:
    try:
        return sut.liveness(ctx) if under_test else liveness.summary(ctx)
    except Exception as e:
        problems.append(Problem("liveness", f"could not be computed: {type(e).__name__}: {e}"))
        return None


def run_verdict(gate_verdicts: Iterable[Verdict], *, incomplete: bool, unusable: bool) -> Verdict:
    """fail > incomplete > inconclusive > pass (the caller leaves out what an incomplete run
    cannot judge; see the module docstring)."""
    combined = combine(gate_verdicts)
    if combined is Verdict.FAIL:
        return Verdict.FAIL
    if incomplete:
        return Verdict.INCOMPLETE
    if unusable:
        return Verdict.INCONCLUSIVE
    return combined


def unfinished_reason(run: dict[str, Any] | None) -> str | None:
    """Why run.json says the run did not finish (None if it finished or run.json is absent)."""
    if run is None:
        return None
    for field in ("status", "end_reason"):
        value = run.get(field)
        if isinstance(value, str) and value in RUN_STATES_UNFINISHED:
            return f"{field}: {value}"
    if run.get("complete") is not True:
        # False, or absent/mistyped (refused by the loader too): no claim of a finished run.
        return f"complete: {run.get('complete')!r}, end_reason: {short_reason(run.get('end_reason'))}"
    return None


ERA_NAMES = {
    "handshake": "the handshake era (2025-03-26 to 2025-11-25)",
    "modern": "the modern era (2026-07-28)",
}


def _eras(ctx: Context, problems: list[Problem]) -> frozenset[str]:
    try:
        return ctx.eras()
    except Exception as e:  # every rule then judges, as in a run of the handshake era
        problems.append(Problem("eras", f"the run's protocol eras are not known: {type(e).__name__}: {e}"))
        return BOTH_ERAS


def _by_era(
    ctx: Context,
    sections: dict[str, JsonValue],
    eras: frozenset[str],
    rules: tuple[Rule, ...],
    audience: Audience,
) -> list[str]:
    """In a run of both eras, every rule judged again on each era's part of it, into the
    `eras` section (lab.checker.judge.by_era): figures, never the run's verdict."""
    found = sections.get("eras")
    if eras != BOTH_ERAS or not isinstance(found, dict) or not found.get("eras"):
        return []

    def judge(rule: Rule, part: Context) -> GateResult:
        return extras.qualify(part, (run_rule(rule, part, audience),))[0]

    try:
        found["gates"] = by_era.gates(ctx, rules, judge)
    except Exception as e:
        return [f"eras: the rules could not be judged era by era: {type(e).__name__}: {e}"]
    return []


def not_in_era(rule: Rule, eras: frozenset[str]) -> GateResult:
    """The verdict of a rule that does not exist in the eras the run tested."""
    tested = " and ".join(ERA_NAMES.get(e, e) for e in sorted(eras))
    why = f": {rule.era_note}" if rule.era_note else ""
    return GateResult(
        verdict=Verdict.NOT_APPLICABLE,
        summary=f"not applicable: the run tested {tested}, where this rule does not exist{why}",
        budget={},
        measured={"eras": list[JsonValue](sorted(eras)), "rule_eras": list[JsonValue](sorted(rule.eras))},
        number=rule.number,
        gate=rule.id,
        title=rule.title,
    )


def era_said(result: GateResult, rule: Rule, eras: frozenset[str]) -> GateResult:
    """In a run of both eras, a rule of one era says whose clients it judged."""
    if len(eras) < 2 or rule.eras >= eras:
        return result
    era = next(iter(rule.eras & eras))
    other = next(iter(eras - rule.eras))
    note = (
        f"a rule of {ERA_NAMES.get(era, era)} only: it judged that era's clients and requests "
        f"(in {ERA_NAMES.get(other, other)}, {rule.era_note})"
    )
    return replace(result, notes=(*result.notes, note))


def applicable(rules: Registry, ctx: Context, audience: Audience) -> tuple[Rule, ...]:
    """The rules that judge this run: those for its kind of client, less the ones whose
    scenario feature it lacks (`applies`; an `applies` that raises counts as applying, and
    the rule then reports its error, inconclusive)."""
    out = []
    for rule in rules.for_audience(audience):
        try:
            applies = rule.applies is None or bool(rule.applies(ctx))
        except Exception:
            applies = True
        if applies:
            out.append(rule)
    return tuple(out)


def run_rule(rule: Rule, ctx: Context, audience: Audience = Audience.LAB) -> GateResult:
    """One rule's verdict, with the rule's identity stamped on it. A rule whose input is
    missing or refused is inconclusive with the reason; one whose code raises, with the
    error and the line that raised."""
    check = rule.check_for(audience)
    if check is None:
        raise ValueError(f"rule {rule.id!r} does not judge {audience} clients")
    try:
        return replace(check(ctx), number=rule.number, gate=rule.id, title=rule.title)
    except MissingInput as e:
        return GateResult(
            verdict=Verdict.INCONCLUSIVE,
            summary=f"cannot be checked: {e}",
            budget={},
            measured={},
            evidence=(Evidence("inputs", True, False, False, str(e)),),
            number=rule.number,
            gate=rule.id,
            title=rule.title,
        )
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        error = f"{type(e).__name__}: {e} (at {where})"
        return GateResult(
            verdict=Verdict.INCONCLUSIVE,
            summary=f"the checker failed on this gate: {error}",
            budget={},
            measured={},
            error=error,
            number=rule.number,
            gate=rule.id,
            title=rule.title,
        )


def timed_rules(rules: Iterable[Rule], audience: Audience) -> list[TimedRule]:
    """The rules a capacity step places by time, as the timeline takes them."""
    return [
        TimedRule(r.id, check, r.server_times)
        for r in rules
        if r.placed_in_time and (check := r.check_for(audience)) is not None
    ]


def rejudger(rules: Iterable[Rule], audience: Audience) -> Rejudge:
    """Judges a rule judged to the knee again, on the inputs given (None for the others)."""
    by_id = {r.id: r for r in rules if r.judged_to_knee}

    def rejudge(result: GateResult, ctx: Context) -> GateResult | None:
        rule = by_id.get(result.gate)
        return None if rule is None else run_rule(rule, ctx, audience)

    return rejudge


def run_info(data: RunData) -> RunInfo:
    run: dict[str, Any] = data.run or {}

    def number(name: str) -> float | None:
        v = run.get(name)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    scenario = run.get("scenario")
    name = scenario.get("name") if isinstance(scenario, dict) else None
    target = run.get("target")
    target_text = None
    if isinstance(target, dict):
        target_text = " ".join(str(target[k]) for k in ("kind", "url") if target.get(k) is not None) or None
    complete = run.get("complete")
    seed = run.get("seed")
    return RunInfo(
        run_id=str(run.get("run_id") or data.run_dir.name),
        complete=complete if isinstance(complete, bool) else None,
        end_reason=str(run["end_reason"]) if run.get("end_reason") is not None else None,
        started_at=number("started_at"),
        stopped_at=number("stopped_at"),
        scenario=str(name)
        if name is not None
        else (str(run["scenario_file"]) if run.get("scenario_file") else None),
        seed=seed if isinstance(seed, str | int | float | bool) or seed is None else str(seed),
        target=target_text,
        fault_windows=tuple(configured_faults(data.run)),
        overrides=dict(overrides) if isinstance(overrides := run.get("overrides"), dict) else {},
    )


def gate_check(
    data: RunData, rule: Rule | ModuleType | str, *, witness_limit: int = 5, rules: Registry = REGISTRY
) -> GateResult:
    """One rule's result over `data`, as `lab report` decides it: the rule, its module
    (`lab.checker.rules.resume`) or its ID, read for the run's kind of client."""
    if isinstance(rule, str):
        rule = rules[rule]
    elif isinstance(rule, ModuleType):
        rule = rule.RULE
    assert isinstance(rule, Rule)
    audience = Audience.UNDER_TEST if sut.under_test(data.run) else Audience.LAB
    return run_rule(rule, Context(data, parse_budgets(data.run), witness_limit), audience)


def judge_records(*, witness_limit: int = 5, **rows: Any) -> RunReport:
    """`judge(run_data_from_records(**rows))`: the whole verdict of in-memory records."""
    return judge(run_data_from_records(**rows), witness_limit=witness_limit)
