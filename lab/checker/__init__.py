"""The checker, the only judge: reads a run's ledgers and decides the six gates and the
run's whole verdict (completeness included).

Pure and offline (Jepsen's checker): it reads files only (or rows given in memory),
answers pass / fail / inconclusive per gate with witnesses that point at their raw rows,
and can be re-run on any results folder. It presents nothing: `lab.report` writes the
outputs from its `RunReport`.

The API (everything else is internal):
    judge_dir(run_dir) -> (RunData, RunReport)   load a run folder and judge it
    judge(data) -> RunReport                      judge loaded (or in-memory) inputs
    run_data_from_records(...) -> RunData         inputs from in-memory ledger rows
    judge_records(...) -> RunReport               both at once
    gate_check(data, gate_module) -> GateResult   one gate (gate_* modules below)

    load.py      ledgers -> pandas (RunData), refusing bad or damaged files by name
    records.py   the same inputs from rows in memory (for property tests)
    schemas.py   the ledger contract of docs/ledgers.md as data; run.json's field checks
    context.py   budgets, event count, shared evidence
    streams.py   logical streams: which stream each event and each client key belong to
    gate_*.py    one module per gate (cross_stream, duplicates, rehandshake, origin,
                 resume, reconnect), each with `check(ctx) -> GateResult`
    wire.py      what the server did wrong on the wire, whatever the clients did
    liveness.py  calls that never got an outcome, throughput collapses
    faults.py    faults fired per kind; not_applicable.py faults the target refused
    verdict.py   runs the gates, gives the run's verdict
"""

from lab.checker.inputs.records import gate_check, judge_records, run_data_from_records
from lab.checker.judge.verdict import judge, judge_dir

__all__ = ["gate_check", "judge", "judge_dir", "judge_records", "run_data_from_records"]
