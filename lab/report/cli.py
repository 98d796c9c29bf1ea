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
            "Judges the run by the lab's 16 rules: gates 1-6 on every run (the release gates of "
            "docs/spec.md), gates 7 and 8 where the scenario has phases (steady state, rollout), checks "
            "9-12 for a client under test, check 13 where the proxy saw the sessions' declared "
            "capabilities, check 14 for a target with replicas or a URL target, check 15 in runs of the modern era, "
            "rule 16 in a capacity check (the fault gates then not applicable where faults alone feed them) "
            "(docs/report.md, 'The rules and their registry'). "
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

    c = subparsers.add_parser(
        "compare",
        help="compare two runs: what regressed from BASE to NEW (gates, resume latency, throughput)",
        description=(
            "Reads the report.json of two run folders (run `lab report` first if one has none) and "
            "says what got worse from BASE to NEW: a rule that no longer passes, more violations, the "
            "target's share of the resume p99, events per second or the call error rate beyond the "
            "tolerance. Exit code 0 no regression, 1 a regression, 2 no regression found but the "
            "evidence is weaker (a run unfinished, a rule PASS -> INCONCLUSIVE), 3 a folder without a "
            "readable report.json."
        ),
    )
    c.add_argument("base", type=Path, metavar="BASE", help="the run to compare against (a run folder)")
    c.add_argument("new", type=Path, metavar="NEW", help="the run to judge (a run folder)")
    c.add_argument(
        "--tolerance",
        default="25%",
        metavar="PCT",
        help="how far a measured figure may move before it counts, like 25%% or 0.25 (default 25%%)",
    )
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    c.set_defaults(func=_cmd_compare)


def parse_tolerance(text: str) -> float:
    """'25%' or '0.25' -> 0.25; ValueError naming what was expected."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"--tolerance: expected a share like 25% or 0.25, got {text!r}") from None
    if not 0 <= value <= 10:
        raise ValueError(f"--tolerance: expected between 0% and 1000%, got {text!r}")
    return value


def _cmd_compare(args: argparse.Namespace) -> int:
    import json

    from lab.report.compare import CompareInputError, compare, load_report, render_text

    try:
        tolerance = parse_tolerance(args.tolerance)
        base, new = load_report(args.base), load_report(args.new)
    except (ValueError, CompareInputError) as e:
        print(f"lab compare: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    result = compare(base, new, tolerance)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print(render_text(result, str(args.base), str(args.new)), end="")
    return result.exit_code


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
