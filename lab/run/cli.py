"""`lab run SCENARIO` (a scenario end to end), `lab scenarios` (the named ones), and
compose mode: `lab compose` (prints compose.yaml), `lab prepare` and `lab watch`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.exitcodes import ExitCode


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of worker processes, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 worker process, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a TCP port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0..65535 (0: a free one), got {value}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run a scenario end to end (server, faults, nemesis, Locust) and check it",
        description=(
            "Run a scenario end to end on 127.0.0.1 and exit with the verdict: 0 every gate "
            "passed, 1 a gate failed, 2 inconclusive or incomplete, 3 the run could not be made, "
            "4 the lab itself failed."
        ),
    )
    p.add_argument("scenario", help="a name from `lab scenarios` (e.g. smoke) or a path to a .toml file")
    p.add_argument("--target", help="'reference' (start the reference server) or the URL of an MCP endpoint")
    p.add_argument("--workers", type=_workers, help="Locust worker processes, >= 1 (default: the scenario's)")
    size = p.add_argument_group(
        "the size of the run",
        "Applied on top of the scenario before it is checked, recorded in run.json (`overrides`) and "
        "shown in the report's header. A scenario with [[phases]] refuses --users, --spawn-rate and "
        "--duration (its phases set them).",
    )
    size.add_argument("--users", type=int, metavar="N", help="concurrent clients (load.users)")
    size.add_argument(
        "--spawn-rate", type=float, metavar="R", help="clients started per second (load.spawn_rate)"
    )
    size.add_argument(
        "--duration",
        metavar="D",
        help="how long the load lasts, like 30s, 2m, 1h30m (load.duration; the hard timeout becomes 2x + 60 s)",
    )
    size.add_argument(
        "--events", type=int, metavar="N", help="stop after this many events (load.event_target)"
    )
    size.add_argument("--seed", type=int, metavar="N", help="the seed every random decision derives from")
    size.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="reference servers behind the lab's proxy, which balances over them (target.replicas; "
        "the scenario says target.affinity and target.store)",
    )
    size.add_argument(
        "--era",
        choices=("handshake", "modern", "both"),
        help="the protocol era the clients speak (target.era; docs/eras.md): handshake (sessions, "
        "resumption), modern (2026-07-28) or both at once",
    )
    p.add_argument("--toxiproxy", help="URL of a real Toxiproxy API to use instead of the embedded nemesis")
    p.add_argument("--out", type=Path, default=Path("results"), help="results root (default: ./results)")
    p.add_argument("--ui", action="store_true", help="serve Locust's web UI (127.0.0.1) while the run goes")
    p.add_argument("--no-report", action="store_true", help="skip `lab report` at the end")
    p.add_argument(
        "--no-figures",
        action="store_true",
        help="the report without its PNG figures (faster: CI that reads only the verdict)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 3) a run this box cannot be expected to hold (clients per core, open "
        "files, memory: measured figures), instead of warning",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve the run's counters (events, reconnects, faults, calls) as Prometheus text at "
        "http://127.0.0.1:PORT/metrics while it runs (0: a free port, printed)",
    )
    p.add_argument(
        "--metrics-file",
        type=Path,
        metavar="FILE",
        help="append the same counters to FILE while it runs, one JSON object a second "
        "(schema mcpLabMetrics.v1, docs/report.md)",
    )
    p.add_argument(
        "--client",
        help="who the load is: lab (the lab's own clients, the default), python-sdk, typescript-sdk "
        "or cmd:<command> (a client under test behind an adapter; docs/clients.md). "
        "Default: the scenario's [load] client",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        help="a TOML file whose [expected_failures] lists the gate/check IDs known to fail for the client "
        "(shown as known, not failing the run); default: the scenario's [expected_failures]",
    )
    p.set_defaults(func=run)

    s = sub.add_parser("scenarios", help="list the named scenarios with their descriptions")
    s.set_defaults(func=scenarios)

    c = sub.add_parser(
        "compose",
        help="print compose.yaml, generated from the lab's topology (lab/topology.py)",
        description="Print compose.yaml: `lab compose > compose.yaml`.",
    )
    c.set_defaults(func=compose)

    k = sub.add_parser(
        "kubernetes",
        help="print Kubernetes manifests of a run, from the same topology as compose.yaml",
        description=(
            "Print the Kubernetes objects of a run (multi-document YAML): the chain's serving parts as "
            "Deployments and Services, prepare, the load and the watch as Jobs, the run folder as a "
            "ReadWriteMany claim. Secrets come from a Secret `lab-secrets` you make (the header says how). "
            "No cluster ran them here: they are validated against the Kubernetes API's schemas in the tests "
            "(docs/scaling.md)."
        ),
    )
    k.add_argument("--scenario", default="smoke", help="the scenario the run prepares (default: smoke)")
    k.add_argument("--workers", type=_workers, default=1, help="Locust worker pods (default: 1)")
    k.add_argument(
        "--report", action="store_true", help="print only the report's Job (apply it once the load ended)"
    )
    k.set_defaults(func=kubernetes)

    q = sub.add_parser(
        "prepare",
        help="compose mode: a fresh run folder with the inputs of SCENARIO (one-shot)",
        description=(
            "For compose.yaml: make --out a fresh run folder (an earlier run's is moved aside) and write "
            "the fault plan, the Locust settings, an empty nemesis.jsonl and run.json of SCENARIO into it."
        ),
    )
    q.add_argument("scenario", help="a name from `lab scenarios` or a path to a .toml file")
    q.add_argument("--out", type=Path, required=True, help="the run folder to write (e.g. /results/compose)")
    q.add_argument(
        "--client-url", required=True, help="where the Locust clients connect (the front of the chain)"
    )
    q.add_argument("--workers", type=_workers, help="Locust workers expected (default: the scenario's)")
    q.add_argument(
        "--tokens", default="", help="bearer tokens token=subject,... for the clients (the server's)"
    )
    q.set_defaults(func=prepare)

    w = sub.add_parser(
        "watch",
        help="compose mode: carry out a prepared run's toxics and watch it until its end",
        description=(
            "For compose.yaml: add and remove the scenario's toxics on time through a Toxiproxy API "
            "(outcomes in nemesis.jsonl), end the run early when the traffic stalls or a removal fails, "
            "and complete run.json. Exit 0 when the run ended complete, 2 when not."
        ),
    )
    w.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the folder `lab prepare` wrote")
    w.add_argument(
        "--toxiproxy", required=True, help="the Toxiproxy API URL whose proxy `mcp` gets the toxics"
    )
    w.set_defaults(func=watch)


def _load(name: str, command: str, overrides: dict[str, object] | None = None) -> object:
    from lab.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(name, overrides=overrides)
    except ScenarioError as e:
        given = ", ".join(f"{k} = {v!r}" for k, v in (overrides or {}).items())
        applied = f" (with the command line's {given})" if given else ""
        print(f"lab {command}: the scenario was refused{applied}, nothing was started:\n{e}", file=sys.stderr)
        return None


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    """The size flags given (`--users 50`), as the scenario keys they set."""
    from lab.scenario import OVERRIDABLE

    return {key: value for flag, key in OVERRIDABLE.items() if (value := getattr(args, flag)) is not None}


def run(args: argparse.Namespace) -> int:
    from lab.run.options import RunError, RunOptions
    from lab.run.orchestrator import Run
    from lab.scenario import Scenario

    scenario = _load(args.scenario, "run", _overrides(args))
    if not isinstance(scenario, Scenario):
        return ExitCode.CANNOT_RUN
    opts = RunOptions(
        scenario=scenario,
        target=args.target,
        workers=args.workers,
        toxiproxy=args.toxiproxy,
        out=args.out,
        ui=args.ui,
        report=not args.no_report,
        figures=not args.no_figures,
        quiet=args.quiet,
        client=args.client,
        baseline=args.baseline,
        metrics_port=args.metrics_port,
        metrics_file=args.metrics_file,
        strict=args.strict,
    )
    try:
        return Run(opts).execute()
    except RunError as e:
        print(f"lab run: refused, nothing was started: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN


def scenarios(args: argparse.Namespace) -> int:
    from lab.scenario import SCENARIO_DIR, ScenarioError, load_scenario, scenario_names

    names = scenario_names()
    if not names:
        print(f"lab scenarios: no scenario in {SCENARIO_DIR}", file=sys.stderr)
        return ExitCode.LAB_FAILED
    from lab.scenario.size import size_of

    width = max(len(n) for n in names)
    for name in names:
        size = ""
        try:
            sc = load_scenario(name)
            text = sc.description or "(no description)"
            size = size_of(sc).line()
        except ScenarioError as e:
            text = f"(refused: {e.problems[0].message if e.problems else e})"
        print(f"{name:<{width}}  {text}")
        if size:
            print(f"{'':<{width}}    {size}")
    return ExitCode.PASS


def compose(args: argparse.Namespace) -> int:
    from lab.run.compose import render_compose

    sys.stdout.write(render_compose())
    return ExitCode.PASS


def kubernetes(args: argparse.Namespace) -> int:
    from lab.run.kubernetes import manifests, yaml_text
    from lab.scenario import ScenarioError, load_scenario

    try:
        load_scenario(args.scenario)  # refused here, not in a cluster's prepare Job
    except ScenarioError as e:
        print(f"lab kubernetes: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    sys.stdout.write(yaml_text(manifests(args.scenario, args.workers, report=args.report)))
    return ExitCode.PASS


def prepare(args: argparse.Namespace) -> int:
    from lab.run.composerun import prepare as prepare_run
    from lab.run.options import RunError, RunOptions
    from lab.run.orchestrator import Run
    from lab.scenario import Scenario

    scenario = _load(args.scenario, "prepare")
    if not isinstance(scenario, Scenario):
        return ExitCode.CANNOT_RUN
    tokens = dict(scenario.target.tokens)
    for part in filter(None, (p.strip() for p in args.tokens.split(","))):
        token, _, subject = part.partition("=")
        tokens[token] = subject
    try:
        Run(RunOptions(scenario=scenario, workers=args.workers)).check(compose=True)
    except RunError as e:
        print(f"lab prepare: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    workers = args.workers or scenario.load.workers
    moved = prepare_run(scenario, args.out, client_url=args.client_url, workers=workers, tokens=tokens)
    if moved is not None:
        print(f"an earlier run's folder was moved to {moved}")
    print(f"prepared {args.out}")
    return ExitCode.PASS


def watch(args: argparse.Namespace) -> int:
    from lab.nemesis.client import ToxiproxyError
    from lab.run.composerun import watch as watch_run
    from lab.scenario import ScenarioError

    try:
        return watch_run(args.run_dir, args.toxiproxy)
    except (ScenarioError, ToxiproxyError) as e:
        print(f"lab watch: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
