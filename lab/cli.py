"""The `lab` command line.

Each subcommand lives in its own module and is imported only when it runs (Locust and
trio must not be imported together, and `lab --help` should be instant).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lab import __version__

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _cmd_diagram(args: argparse.Namespace) -> int:
    from lab.client import state_diagram_document as document

    text = document()
    target = DOCS / "state-machine.md"
    if args.write:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
        return 0
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target} is out of date: run `lab diagram --write`", file=sys.stderr)
            return 1
        print(f"{target} matches the state table")
        return 0
    print(text, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lab",
        description="Network fault-injection and load lab for MCP Streamable HTTP session resumption.",
    )
    p.add_argument("--version", action="version", version=f"lab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser(
        "diagram", help="print (or write/check) the client state diagram generated from the table"
    )
    g = d.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="write docs/state-machine.md")
    g.add_argument("--check", action="store_true", help="exit 1 if docs/state-machine.md is out of date")
    d.set_defaults(func=_cmd_diagram)

    for register in _registrars():
        register(sub)
    return p


SUBCOMMAND_MODULES: list[str] = [
    "lab.server.cli",
    "lab.nemesis.cli",
    "lab.run.cli",
    "lab.report.cli",
]
"""Modules with a `register(subparsers)` function adding their subcommand. They must not
import anything heavy at module level (the work happens in the function they register)."""


def _registrars() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    out = []
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        out.append(module.register)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    result: int = func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
