"""`lab report`'s work: check a run folder and write every output into it.

Outputs (in RUN_DIR): report.json (mcpLabReport.v1, docs/report.md), report.md,
junit.xml, fig-*.png and report.html. Each is written on its own: a writer or figure
that fails is reported (stderr and report.json `problems`) and the others are still
written. The exit code is the verdict's (0 pass, 1 a gate failed, 2 inconclusive) and
never depends on whether an output could be written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from lab.checker import report_json, report_junit, report_md
from lab.checker.run import check_dir

EXIT_NOT_A_RUN = 2


def report_run(
    run_dir: Path, *, witness_limit: int, figures: bool, quiet: bool, out: TextIO, err: TextIO
) -> int:
    if not run_dir.is_dir():
        print(f"lab report: {run_dir} is not a folder (expected a run folder, e.g. results/<run>)", file=err)
        return EXIT_NOT_A_RUN
    data, report = check_dir(run_dir, witness_limit)
    failures: list[str] = []
    drawn: list[dict[str, str]] = []
    if figures:
        try:
            from dashboards.figures import draw_all

            drawn, figure_errors = draw_all(data, run_dir)
            failures += figure_errors
        except Exception as e:
            failures.append(f"figures: {type(e).__name__}: {e}")
    doc = report_json.document(report, drawn)
    problems = doc["problems"]
    assert isinstance(problems, list)
    problems += [{"path": "report", "message": f} for f in failures]

    def html() -> None:
        from dashboards.html import render

        images = {
            f["file"]: (run_dir / f["file"]).read_bytes() for f in drawn if (run_dir / f["file"]).is_file()
        }
        (run_dir / "report.html").write_text(render(doc, images), encoding="utf-8")

    writers: list[tuple[str, Callable[[], Any]]] = [
        ("report.json", lambda: report_json.write(run_dir / "report.json", doc)),
        ("report.md", lambda: (run_dir / "report.md").write_text(report_md.render(doc), encoding="utf-8")),
        ("junit.xml", lambda: (run_dir / "junit.xml").write_text(report_junit.render(doc), encoding="utf-8")),
        ("report.html", html),
    ]
    written = []
    for name, write in writers:
        try:
            write()
            written.append(name)
        except Exception as e:
            failures.append(f"{name} not written: {type(e).__name__}: {e}")
    for p in report.problems:
        print(f"lab report: {p}", file=err)
    for note in report.notes:
        print(f"lab report: note: {note}", file=err)
    for f in failures:
        print(f"lab report: {f}", file=err)
    try:
        if quiet:
            print(f"{report.verdict.upper()} {run_dir}", file=out)
        else:
            banner = report_md.incomplete_banner(doc)
            if banner:
                print(banner, file=out)
            print(report_md.gate_table(doc), file=out)
            print(
                f"verdict: {report.verdict.upper()} (exit {report.verdict.exit_code}); "
                f"checked in {report.check_seconds:.2f} s; wrote {', '.join(written)} in {run_dir}",
                file=out,
            )
            out.flush()
    except BrokenPipeError:
        # `lab report RUN | head`: the reader left early. The files are written and the
        # exit code still tells the verdict; stdout goes nowhere so exiting is quiet.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.verdict.exit_code
