"""`lab selftest`: the lab tests itself.

Each deliberate defect of the reference server (`lab serve --defect NAME`) is run in
black-box mode — a URL target, opaque event IDs, no server ledger for the checker, no
admin control — with a short scenario whose faults give every gate its evidence from the
wire. The gate expected to catch the defect must FAIL with a server witness; the pristine
server, run the same way, must PASS every gate. docs/selftest.md.

    cases.py     the cases and what each expects (gate, checks, why)
    execute.py   one case: the server, `lab run --target URL`, its report
    matrix.py    outcomes, the exit code, the matrix as text, markdown and JSON
    session.py   one selftest: its folder, runs at a time, progress, outputs
    cli.py       the subcommand
"""
