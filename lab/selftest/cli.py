"""`lab selftest`: the lab proves that each gate fires, and that it does not cry wolf.

Nothing heavy is imported at module level (`lab --help` stays instant).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from lab.cliargs import whole
from lab.exitcodes import ExitCode

DEFAULT_SCENARIO = "selftest"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from lab.selftest.cases import BY_NAME

    p = sub.add_parser(
        "selftest",
        help="run the reference server with each deliberate defect, black-box: every defect must be caught",
        description=(
            "Runs a short scenario against the reference server in black-box mode (a URL target, opaque "
            "event IDs, no server ledger for the checker, no admin control): once per defect, where the "
            "expected gate must FAIL with a server witness, once pristine and once per legal shape "
            "(legal but unusual modes: shape-poll, shape-json, shape-2025-03-26), where every gate must "
            "PASS. Prints a case x gate matrix and writes it (selftest.json, selftest.md) into a folder "
            "of its own. Exit 0 every defect caught, the pristine run and every legal shape passed; 1 a "
            "defect missed or a false alarm; 2 a run could not be judged (inconclusive, incomplete, interrupted); 3 a run "
            "could not be made; 4 the lab failed."
        ),
    )
    p.add_argument(
        "--defect",
        action="append",
        choices=list(BY_NAME),
        metavar="NAME",
        help="run only this case (repeatable; `pristine` is the run without a defect, `shape-…` a legal "
        "shape); default: all",
    )
    p.add_argument("--list", action="store_true", help="list the cases with their expected gate and check")
    p.add_argument("--jobs", type=_jobs, default=2, help="runs at a time (default 2)")
    p.add_argument(
        "--retries",
        type=_retries,
        default=1,
        help="run an undecided case (inconclusive or incomplete, e.g. the lab short of CPU on a busy "
        "machine) again up to this many times; a caught, missed or falsely alarmed case never is "
        "(default 1; 0 to never)",
    )
    p.add_argument(
        "--event-ids", choices=("seq", "uuid"), default="seq", help="the server's opaque IDs (seq)"
    )
    p.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help="a scenario name or .toml file (default: selftest)"
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="results root (default: ./results)")
    p.add_argument(
        "--no-figures", action="store_true", help="the runs' reports without their PNG figures (faster)"
    )
    p.set_defaults(func=selftest)


_jobs = whole(1, 4, "runs at a time")
_retries = whole(0, 3, "retries")


def _list() -> int:
    from lab.selftest.cases import ALL_CASES

    width = max(len(c.name) for c in ALL_CASES)
    for c in ALL_CASES:
        gate = "every gate passes" if c.gate is None else f"gate {c.gate} {c.gate_name}: {'/'.join(c.checks)}"
        print(f"{c.name:<{width}}  {gate}")
        print(f"{'':<{width}}    {c.description}")
        if c.why:
            print(f"{'':<{width}}    caught because {c.why}")
        if c.shape:
            how = " ".join([*c.server_args, *([f"(scenario {c.scenario})"] if c.scenario else [])])
            print(f"{'':<{width}}    lab serve {how}".rstrip())
    return ExitCode.PASS


def selftest(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    from lab.scenario import ScenarioError, load_scenario
    from lab.selftest.cases import select
    from lab.selftest.session import Selftest

    try:
        cases = select(args.defect)
    except ValueError as e:
        print(f"lab selftest: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"lab selftest: the scenario was refused, nothing was started:\n{e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    if scenario.target.kind != "reference" or scenario.target.tokens:
        print(
            f"lab selftest: {scenario.path}: the selftest starts the reference server itself without "
            "tokens: the scenario's [target] must be the default reference one",
            file=sys.stderr,
        )
        return ExitCode.CANNOT_RUN
    st = Selftest(
        cases,
        scenario,
        out=args.out.absolute(),
        jobs=args.jobs,
        event_ids=args.event_ids,
        figures=not args.no_figures,
        retries=args.retries,
    )
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, st.on_signal) for s in signals}
    started = time.time()
    try:
        return st.execute(started)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
