"""Run every gate over a loaded run and combine the verdicts (Jepsen's rules).

A gate whose input is missing or refused is inconclusive with the reason; a gate whose
own code raises is inconclusive with the error (exception type, message and the line
that raised), and the other gates still run. The run's verdict is the combination of
the six (fail > inconclusive > pass), and never better than inconclusive when run.json
could not be used (the budgets then are docs/spec.md's defaults, not the scenario's) or when
any input file was refused.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from lab.checker import (
    gate_cross_stream,
    gate_duplicates,
    gate_origin,
    gate_reconnect,
    gate_rehandshake,
    gate_resume,
)
from lab.checker.context import Context, parse_budgets
from lab.checker.faults import configured_faults, count_faults
from lab.checker.load import MissingInput, RunData, load_run
from lab.checker.model import Evidence, GateResult, Problem, RunInfo, RunReport, Verdict, combine
from lab.checker.report_md import short_reason

GATES: tuple[ModuleType, ...] = (
    gate_cross_stream,
    gate_duplicates,
    gate_rehandshake,
    gate_origin,
    gate_resume,
    gate_reconnect,
)


def check_dir(run_dir: Path, witness_limit: int = 5) -> tuple[RunData, RunReport]:
    started = time.perf_counter()
    data = load_run(run_dir)
    return data, check_run(data, witness_limit=witness_limit, started=started)


def check_run(data: RunData, *, witness_limit: int = 5, started: float | None = None) -> RunReport:
    started = time.perf_counter() if started is None else started
    budgets = parse_budgets(data.run)
    ctx = Context(data, budgets, witness_limit)
    gates = tuple(run_gate(module, ctx) for module in GATES)
    problems = list(data.problems)
    if budgets.invalid:
        problems.append(Problem("run.json", f"budgets not usable as numbers: {', '.join(budgets.invalid)}"))
    if data.run is not None and budgets.defaulted:
        problems.append(
            Problem(
                "run.json", f"budgets missing, docs/spec.md defaults used: {', '.join(budgets.defaulted)}"
            )
        )
    run = run_info(data)
    if run.complete is False:
        problems.append(
            Problem("run.json", f"the run is incomplete (end_reason: {short_reason(run.end_reason)})")
        )
    verdicts = [g.verdict for g in gates]
    if data.run is None or any(s.status == "error" for s in data.sources):
        # A run cannot pass on files the checker refused to read, even ones no gate needs.
        verdicts.append(Verdict.INCONCLUSIVE)
    try:
        count, source = ctx.event_count()
    except Exception as e:  # the count is also evidence inside the gates, which report it
        count, source = None, f"error: {e}"
    try:
        faults, never = count_faults(data)
    except Exception as e:
        faults, never = [], []
        problems.append(Problem("proxy/tap.jsonl", f"fault counts failed: {type(e).__name__}: {e}"))
    return RunReport(
        run=run,
        verdict=combine(verdicts),
        gates=gates,
        budgets=budgets.as_dict(),
        budgets_defaulted=budgets.defaulted,
        event_count=count,
        event_count_source=source,
        sources=tuple(data.sources),
        problems=tuple(problems),
        notes=tuple(data.notes),
        faults=tuple(faults),
        faults_never_fired=tuple(never),
        checked_at=time.time(),
        check_seconds=time.perf_counter() - started,
    )


def run_gate(module: ModuleType, ctx: Context) -> GateResult:
    number: int = module.NUMBER
    gate: str = module.GATE
    title: str = module.TITLE
    try:
        result: GateResult = module.check(ctx)
        return result
    except MissingInput as e:
        return GateResult(
            number=number,
            gate=gate,
            title=title,
            verdict=Verdict.INCONCLUSIVE,
            summary=f"cannot be checked: {e}",
            budget={},
            measured={},
            evidence=(Evidence("inputs", True, False, False, str(e)),),
        )
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        error = f"{type(e).__name__}: {e} (at {where})"
        return GateResult(
            number=number,
            gate=gate,
            title=title,
            verdict=Verdict.INCONCLUSIVE,
            summary=f"the checker failed on this gate: {error}",
            budget={},
            measured={},
            error=error,
        )


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
    )
