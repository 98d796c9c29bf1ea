"""`lab nemesis`: run the TCP nemesis (a Toxiproxy-API TCP proxy) on 127.0.0.1.

    lab nemesis --api-port 0 --log results/RUN/nemesis.jsonl [--seed N] [--compat]

Prints `lab-nemesis api http://127.0.0.1:PORT` (flushed) once the API listens, then serves
until SIGINT or SIGTERM. trio is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `nemesis` subcommand."""
    p = subparsers.add_parser(
        "nemesis",
        help="run the TCP nemesis: a TCP proxy driven by the Toxiproxy HTTP API (127.0.0.1 only)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--api-port", type=_port, default=0, help="port of the HTTP API (0: pick a free one)")
    p.add_argument("--log", type=Path, required=True, help="the mcpLabNemesis.v1 JSON-lines log to append to")
    p.add_argument("--seed", type=int, default=None, help="seed of the toxicity/jitter/slicer randomness")
    p.add_argument(
        "--compat",
        action="store_true",
        help="accept what a real Toxiproxy accepts (negative attributes, any toxicity, unknown fields, "
        "rate 0, ...) and answer as it does; still 127.0.0.1 only (docs/nemesis.md lists the differences)",
    )
    p.set_defaults(func=_cmd_nemesis)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0..65535)")
    return value


def _cmd_nemesis(args: argparse.Namespace) -> int:
    import trio

    from lab.exitcodes import ExitCode
    from lab.nemesis.server import run_nemesis

    def announce(line: str) -> None:
        print(line, flush=True)

    try:
        trio.run(
            lambda: run_nemesis(
                args.api_port, args.log, seed=args.seed, announce=announce, compat=args.compat
            )
        )
    except OSError as exc:
        print(f"lab nemesis: {exc}", file=sys.stderr)
        return int(ExitCode.CANNOT_RUN)
    return 0
