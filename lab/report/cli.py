"""`lab report RUN_DIR`: judge a run's ledgers against the gates and write the report.

Nothing heavy is imported here (pandas and matplotlib load only when the command runs),
so `lab --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.exitcodes import ExitCode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "report",
        help="check a run folder against the rules (gates and checks) and write report.json/md/html, junit.xml, figures",
        description=(
            "Offline and re-runnable: reads the ledgers of RUN_DIR only, writes its outputs into RUN_DIR. "
            "Exit code 0 every gate passed, 1 a gate failed, 2 inconclusive or incomplete (evidence too "
            "thin, an input missing or unreadable, the run interrupted), 3 RUN_DIR is not a run folder, "
            "4 the lab failed (an output could not be written, a crash: one line names the log)."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder, e.g. results/<run>")
    p.add_argument(
        "--witnesses", type=int, default=5, metavar="N", help="witnesses kept per check (default 5)"
    )
    p.add_argument("--no-figures", action="store_true", help="do not draw the PNG figures")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from lab.report.outputs import report_run
    from lab.runfolder import RunFolderError, mark_abandoned

    if args.witnesses < 0:
        print("lab report: --witnesses must be >= 0", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    try:  # a folder whose lab run died (kill -9) says so before it is judged
        if mark_abandoned(args.run_dir):
            print(
                f"lab report: {args.run_dir}: its lab run died without finishing; marked abandoned",
                file=sys.stderr,
            )
    except RunFolderError:
        pass  # a read-only folder: its run.json still says `running`, which is judged incomplete too
    return report_run(
        args.run_dir,
        witness_limit=args.witnesses,
        figures=not args.no_figures,
        quiet=args.quiet,
        out=sys.stdout,
        err=sys.stderr,
    )
