"""The `lab` command line.

Each subcommand lives in its own module and is imported only when it runs (Locust and
trio must not be imported together, and `lab --help` should be instant).

Every command exits with a code of `lab.exitcodes`, whatever happens: a bad option is 3
(argparse's own 2 would read as "inconclusive"), a run folder that cannot be written is
4 with one line, and any other exception is 4 with one line naming a log file that holds
the traceback — a crash is never 1 ("a gate failed").
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, cast

from lab import __version__
from lab.exitcodes import ExitCode

DOCS = Path(__file__).resolve().parent.parent / "docs"
"""The repository's docs (for `lab diagram --write/--check`, a developer's command)."""


class LabArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error exiting 3 (the run could not be made), not 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.CANNOT_RUN, f"{self.prog}: error: {message}\n")


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
    p = LabArgumentParser(
        prog="lab",
        description="Network fault-injection and load lab for MCP Streamable HTTP session resumption.",
        epilog=(
            "Exit codes (every command): 0 pass, 1 a gate failed, 2 inconclusive or incomplete, "
            "3 the run could not be made (bad scenario or option, a part did not start), 4 the lab itself failed."
        ),
    )
    p.add_argument("--version", action="version", version=f"lab {__version__}")
    # Every subcommand's parser is a LabArgumentParser too (argparse makes them of the parent's class).
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        p.add_subparsers(dest="command", metavar="COMMAND"),
    )

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
    "lab.selftest.cli",
    "lab.replay.cli",
    "lab.replay.shrink_cli",
]
"""Modules with a `register(subparsers)` function adding their subcommand. They must not
import anything heavy at module level (the work happens in the function they register)."""


def _registrars() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    out = []
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        out.append(module.register)
    return out


PRINT_ONLY = frozenset({"scenarios", "compose", "kubernetes", "diagram"})
"""Commands whose whole job is printing: a reader that stops reading is not a failure."""


def crash_log(command: str, exc: BaseException) -> Path:
    """Write the traceback of `exc` to a log file of its own; its path."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = Path(tempfile.gettempdir()) / f"lab-{command}-{stamp}-{id(exc):x}.log"
    text = "".join(traceback.format_exception(exc))
    path.write_text(f"lab {__version__}: {' '.join(sys.argv)}\n{text}", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return ExitCode.PASS
    command = str(args.command)
    from lab.oslimits import raise_open_files_limit
    from lab.runfolder import RunFolderError

    raise_open_files_limit()  # the processes a run starts (mitmdump, Locust) inherit it

    try:
        return int(func(args))
    except RunFolderError as e:  # a full disk, a read-only folder: the lab could not keep its records
        print(f"lab {command}: the lab failed: {e}", file=sys.stderr)
        return ExitCode.LAB_FAILED
    except KeyboardInterrupt:
        print(f"lab {command}: interrupted", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    except BrokenPipeError:  # the reader closed our stdout (`lab scenarios | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        if command in PRINT_ONLY:
            return ExitCode.PASS
        print(f"lab {command}: the lab failed: its output was closed before the end", file=sys.stderr)
        return ExitCode.LAB_FAILED
    except Exception as e:
        try:
            where = f"traceback in {crash_log(command, e)}"
        except OSError as log_error:
            where = f"and its traceback could not be written either: {log_error.strerror or log_error}"
        print(f"lab {command}: the lab failed: {type(e).__name__}: {e} ({where})", file=sys.stderr)
        return ExitCode.LAB_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
