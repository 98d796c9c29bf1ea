"""The checker, the only judge: reads a run's ledgers and decides the rules (the gates and
checks of `lab.checker.rules.REGISTRY`) and the run's whole verdict (completeness included).

Pure and offline (Jepsen's checker): it reads files only (or rows given in memory),
answers pass / fail / inconclusive per rule with witnesses that point at their raw rows,
and can be re-run on any results folder. It presents nothing: `lab.report` writes the
outputs from its `RunReport`.

The rooms, ground floor first (an import only ever goes down this list; tests/test_layering.py):

    model.py, explain.py   what it decides (verdicts, witnesses, results) and how a witness reads
    inputs/                reading a run folder: ledgers into frames, schemas, rows in memory
    context.py             one run's inputs, budgets and measures computed once (a cache)
    truth/                 what happened, from the wire and the ledgers: streams and homes,
                           sessions, deliveries, recoveries and their latency, reconnects,
                           liveness, faults fired
    health/                the lab's own limits: its processes, its hops, unanswered requests
    timeline/              the run over time: phases, capacity steps and the knee, rollout steps
    rules/                 one module per rule, and REGISTRY (a rule judges; it never measures)
    judge/                 the single judge: runs the rules, qualifies them, the run's verdict

The API, the only door the report and run code use (everything else is internal):
    judge_dir(run_dir) -> (RunData, RunReport)   load a run folder and judge it
    load_run(run_dir) -> RunData                  load a run folder (then judge it)
    judge(data) -> RunReport                      judge loaded (or in-memory) inputs
    run_data_from_records(...) -> RunData         inputs from in-memory ledger rows
    judge_records(...) -> RunReport               both at once
    gate_check(data, rule) -> GateResult          one rule (a Rule, its module or its ID)
    REGISTRY, Rule, Audience                      the rules
and the few measures the report's figures and `lab run`'s live views share with the
rules (`__all__` lists them), so that a figure and a gate never compute one thing twice.
"""

from lab.checker.context import Budgets, parse_budgets
from lab.checker.explain import short_reason
from lab.checker.health.processes import SATURATED_CPU, load_samples, saturation_phrases
from lab.checker.inputs.load import RunData, load_run
from lab.checker.inputs.phase_specs import PhaseSpec, phase_specs
from lab.checker.inputs.records import run_data_from_records
from lab.checker.judge.baseline import unknown_ids
from lab.checker.judge.verdict import gate_check, judge, judge_dir, judge_records
from lab.checker.model import GateResult, JsonValue, Liveness, RunReport
from lab.checker.rules import REGISTRY, Audience, Rule
from lab.checker.timeline.capacity import Step as CapacityStep
from lab.checker.timeline.capacity import step_misses
from lab.checker.timeline.capacity import steps as capacity_steps
from lab.checker.timeline.phases import measure_frames
from lab.checker.timeline.restarts import records as restart_records
from lab.checker.truth.fault_outcomes import section_of as fault_outcomes_of
from lab.checker.truth.faults import configured_faults, count_faults
from lab.checker.truth.liveness import active_clients
from lab.checker.truth.reconnects import over_budget, per_second
from lab.checker.truth.recoveries import PERCENTILE, client_ends, latencies, nearest_rank
from lab.checker.truth.triggers import FILE as FAULT_TRIGGERS_FILE
from lab.checker.truth.triggers import jsonl_of as fault_triggers_jsonl

__all__ = [
    "FAULT_TRIGGERS_FILE",
    "PERCENTILE",
    # judging
    "REGISTRY",
    "SATURATED_CPU",
    "Audience",
    # measures the report's figures and `lab run`'s live views share with the rules
    "Budgets",
    "CapacityStep",
    # what it decides, for the report
    "GateResult",
    "JsonValue",
    "Liveness",
    "PhaseSpec",
    "Rule",
    "RunData",
    "RunReport",
    "active_clients",
    "capacity_steps",
    "client_ends",
    "configured_faults",
    "count_faults",
    "fault_outcomes_of",
    "fault_triggers_jsonl",
    "gate_check",
    "judge",
    "judge_dir",
    "judge_records",
    "latencies",
    "load_run",
    "load_samples",
    "measure_frames",
    "nearest_rank",
    "over_budget",
    "parse_budgets",
    "per_second",
    "phase_specs",
    "restart_records",
    "run_data_from_records",
    "saturation_phrases",
    "short_reason",
    "step_misses",
    "unknown_ids",
]
