"""`lab replay RUN_DIR [--clients ...] [--faults ...]`: run a finished run again, its clients
scripted and its faults pinned to the triggers they fired on, and compare (lab.replay)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.exitcodes import ExitCode


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("a comma-separated list of names, got nothing")
    return names


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="run a finished run again (its clients' operations, its faults at their triggers) and compare",
        description=(
            "A new run against the same target that replays RUN_DIR's clients (each client's operations, "
            "in order, at the times they started) and its fault firings, pinned to their triggers (the "
            "client's request and the event they hit, not the moment), then says whether the rules that "
            "failed fail again with the same culprit and how many triggers fired again. Writes the replay's "
            "scenario file and replay.json in the new run folder. Exit code: the replay run's verdict "
            "(0 pass, 1 a gate failed, 2 inconclusive, 3 cannot replay, 4 the lab failed)."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder of `lab run`")
    p.add_argument("--clients", type=_names, metavar="ID,...", help="only these clients (e.g. w0-u4,w0-u7)")
    p.add_argument(
        "--faults",
        type=_names,
        metavar="NAME,...",
        help="only these firings: fault kinds (cut_stream, toxic:latency), rule IDs (cut_stream#4) or "
        "lines of RUN_DIR's fault_triggers.jsonl (7); default: every one",
    )
    p.add_argument("--target", help="'reference' or an MCP endpoint URL (default: the run's target)")
    p.add_argument("--out", type=Path, default=Path("results"), help="results root (default: ./results)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=replay)


def replay(args: argparse.Namespace) -> int:
    from lab.replay.recorded import ReplayError
    from lab.replay.run import replay_run

    try:
        return replay_run(
            args.run_dir,
            clients=args.clients,
            faults=args.faults,
            target=args.target,
            out=args.out,
            quiet=args.quiet,
        )
    except ReplayError as e:
        print(f"lab replay: cannot replay, nothing was started: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
