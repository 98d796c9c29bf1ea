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
    scenario_toml(sc)                          # ... as TOML that loads back to it (lab.scenario.write)

Every key, its unit and default is documented in docs/scenarios.md. The loader reports
*all* problems of a file at once (`ScenarioError.problems`), each naming the file, the
dotted key (with list indexes, e.g. `faults[2].rate`) and what was expected. Nothing here
starts a process or touches the network.
"""

from __future__ import annotations

from lab.load.settings import ClientScript
from lab.scenario.parts import (
    CLIENT_OPS,
    PHASE_KINDS,
    ROLLBACK_MODES,
    SCENARIO_DIR,
    Budgets,
    Load,
    Phase,
    Reconnect,
    Restart,
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
from lab.scenario.write import clients_toml, scenario_toml, toml_text

__all__ = [
    "BASELINE_CLIENTS",
    "CLIENT_OPS",
    "CLIENT_SPEC",
    "OVERRIDABLE",
    "PHASE_KINDS",
    "ROLLBACK_MODES",
    "SCENARIO_DIR",
    "Budgets",
    "ClientScript",
    "Load",
    "Phase",
    "Reconnect",
    "Restart",
    "Scenario",
    "ScenarioError",
    "TargetSpec",
    "Ticker",
    "Toxic",
    "clients_toml",
    "load_baseline",
    "load_scenario",
    "read_expected_failures",
    "resolve",
    "scenario_names",
    "scenario_toml",
    "toml_text",
]
