"""`lab run SCENARIO`: run a scenario end to end and exit with the verdict."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run a scenario end to end (server, faults, nemesis, Locust) and check it",
        description=(
            "Run a scenario end to end on 127.0.0.1 and exit with the verdict: 0 every gate "
            "passed, 1 a gate failed, 2 inconclusive or incomplete, 3 the run could not be made."
        ),
    )
    p.add_argument("scenario", help="a name in scenarios/ (e.g. smoke) or a path to a .toml file")
    p.add_argument("--target", help="'reference' (start the reference server) or the URL of an MCP endpoint")
    p.add_argument("--workers", type=int, help="Locust worker processes (default: the scenario's)")
    p.add_argument("--toxiproxy", help="URL of a real Toxiproxy API to use instead of the embedded nemesis")
    p.add_argument("--out", type=Path, help="results folder (default: results/)")
    p.add_argument("--ui", action="store_true", help="serve Locust's web UI (127.0.0.1) while the run goes")
    p.add_argument("--no-report", action="store_true", help="skip `lab report` at the end")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)

    q = sub.add_parser(
        "prepare",
        help="compose mode: write a run folder's inputs for containers, then run the toxics schedule",
        description=(
            "For compose.yaml: write the fault plan, the Locust settings and run.json of SCENARIO into "
            "--out, then (with --toxiproxy) add and remove the scenario's toxics on time."
        ),
    )
    q.add_argument("scenario", help="a name in scenarios/ or a path to a .toml file")
    q.add_argument("--out", type=Path, required=True, help="the run folder to write (e.g. /results/compose)")
    q.add_argument(
        "--client-url", required=True, help="where the Locust clients connect (the front of the chain)"
    )
    q.add_argument("--toxiproxy", help="Toxiproxy API URL whose proxy `mcp` gets the scenario's toxics")
    q.add_argument("--workers", type=int, help="Locust workers expected (default: the scenario's)")
    q.add_argument(
        "--tokens", default="", help="bearer tokens token=subject,... for the clients (the server's)"
    )
    q.set_defaults(func=prepare)


def run(args: argparse.Namespace) -> int:
    from lab.run.orchestrator import EXIT_CANNOT_RUN, ROOT, Run, RunError, RunOptions
    from lab.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"lab run: the scenario was refused, nothing was started:\n{e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except FileNotFoundError as e:
        print(f"lab run: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    opts = RunOptions(
        scenario=scenario,
        target=args.target,
        workers=args.workers,
        toxiproxy=args.toxiproxy,
        out=args.out or ROOT / "results",
        ui=args.ui,
        report=not args.no_report,
        quiet=args.quiet,
    )
    run = Run(opts)
    try:
        run.check()
    except RunError as e:
        print(f"lab run: refused, nothing was started: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return run.execute()


def prepare(args: argparse.Namespace) -> int:
    from lab.run.orchestrator import EXIT_CANNOT_RUN, Run, RunError, RunOptions
    from lab.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario)
        run = Run(
            RunOptions(scenario=scenario, workers=args.workers, toxiproxy=args.toxiproxy, out=args.out.parent)
        )
        tokens = dict(scenario.target.tokens)
        for part in filter(None, (p.strip() for p in args.tokens.split(","))):
            token, _, subject = part.partition("=")
            tokens[token] = subject
        run.client_tokens = tuple(sorted(tokens.items()))
        run.dir = args.out
        run.run_id = args.out.name
        return run.prepare(args.client_url, run_schedule=True)
    except (ScenarioError, RunError, FileNotFoundError) as e:
        print(f"lab prepare: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
