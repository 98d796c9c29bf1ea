"""The checker: `lab report RUN_DIR` reads a run's ledgers and decides the six gates.

Pure and offline (Jepsen's checker): it reads files only, answers pass / fail /
inconclusive per gate with witnesses, and can be re-run on any results folder.

    load.py      ledgers -> pandas (RunData), refusing bad files by name
    schemas.py   the ledger contract of docs/ledgers.md as data
    context.py   budgets, event count, shared evidence
    streams.py   logical streams: which stream each event and each client key belong to
    gate_*.py    one module per gate (cross_stream, duplicates, rehandshake, origin,
                 resume, reconnect), each with `check(ctx) -> GateResult`
    faults.py    faults fired per kind
    run.py       runs the gates, combines verdicts
    report_*.py  report.json (schema: docs/report.md), report.md, junit.xml
    outputs.py   what `lab report` writes; cli.py registers the subcommand
The figures and report.html live in the top-level `dashboards` package.
"""
