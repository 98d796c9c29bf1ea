"""Scenarios: one TOML file per named run in `scenarios/`, validated whole before anything starts.

    from lab.scenario import load_scenario, ScenarioError
    try:
        sc = load_scenario("smoke")            # or a path to a .toml file
    except ScenarioError as e:
        print(e)                               # every problem, one per line: file: key: what
    sc.fault_plan_json(run_start)              # for mitmdump (lab/faults/plan.py format)
    sc.toxics_schedule()                       # for the TCP nemesis: plain dicts
    sc.budgets()                               # run.json "budgets"
    sc.stages()                                # the load shape: users over time
    sc.to_dict()                               # the scenario as loaded, defaults filled in

Every key, its unit and default is documented in docs/scenarios.md. The loader reports
*all* problems of a file at once (`ScenarioError.problems`), each naming the file, the
dotted key (with list indexes, e.g. `faults[2].rate`) and what was expected. Nothing here
starts a process or touches the network.
"""

from __future__ import annotations

from lab.scenario.parts import (
    PHASE_KINDS,
    ROLLBACK_MODES,
    SCENARIO_DIR,
    Budgets,
    Load,
    Phase,
    Reconnect,
    Scenario,
    ScenarioError,
    TargetSpec,
    Ticker,
    Toxic,
)
from lab.scenario.read import (
    BASELINE_CLIENTS,
    CLIENT_SPEC,
    OVERRIDABLE,
    load_baseline,
    load_scenario,
    read_expected_failures,
    resolve,
    scenario_names,
)

__all__ = [
    "BASELINE_CLIENTS",
    "CLIENT_SPEC",
    "OVERRIDABLE",
    "PHASE_KINDS",
    "ROLLBACK_MODES",
    "SCENARIO_DIR",
    "Budgets",
    "Load",
    "Phase",
    "Reconnect",
    "Scenario",
    "ScenarioError",
    "TargetSpec",
    "Ticker",
    "Toxic",
    "load_baseline",
    "load_scenario",
    "read_expected_failures",
    "resolve",
    "scenario_names",
]
