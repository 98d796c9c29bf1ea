"""`lab report`'s work: judge a run folder and write every output into it.

`report_run(run_dir)` is the one entry point, for `lab report RUN_DIR` and for `lab run`
(which calls it when its run ends): the verdict comes from `lab.checker.judge` and
nothing else. Outputs (in RUN_DIR): report.json (mcpLabReport.v2, docs/report.md),
fault_triggers.jsonl (every fault firing by its logical trigger, mcpLabTriggers.v1),
report.md, junit.xml, fig-*.png and report.html. Each is written on its own (to a
temporary file renamed into place, so a half-written report never stands): a figure that
fails is reported and the others are still written.

Exit codes (lab.exitcodes): the verdict's (0 pass, 1 a gate failed, 2 inconclusive or
incomplete); 3 when RUN_DIR is not a folder; 4 when the lab itself failed: an output
could not be written (a read-only folder, a full disk) or the command crashed. A crash
prints one line naming a log file that holds the traceback, never the traceback itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from lab.exitcodes import ExitCode
from lab.runfolder import RUN_FILE

CRASH_LOG = "report-crash.log"


def report_run(
    run_dir: Path,
    *,
    witness_limit: int = 5,
    figures: bool = True,
    quiet: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Judge RUN_DIR, write its outputs, print the verdict; return the exit code."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        return _report_run(
            run_dir, witness_limit=witness_limit, figures=figures, quiet=quiet, out=out, err=err
        )
    except Exception as e:
        log = _crash_log(run_dir, traceback.format_exc())
        print(f"lab report: the lab failed ({type(e).__name__}: {e}); traceback in {log}", file=err)
        return ExitCode.LAB_FAILED


def _crash_log(run_dir: Path, text: str) -> Path:
    """Where the traceback went: the run folder if it can be written, else a temp file."""
    try:
        path = run_dir / CRASH_LOG
        path.write_text(text, encoding="utf-8")
        return path
    except OSError:
        fd, name = tempfile.mkstemp(prefix="lab-report-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return Path(name)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _report_run(
    run_dir: Path, *, witness_limit: int, figures: bool, quiet: bool, out: TextIO, err: TextIO
) -> int:
    from lab.checker import fault_triggers_jsonl, judge, load_run
    from lab.report import document
    from lab.report.evidence import raw_rows

    if not run_dir.is_dir():
        print(f"lab report: {run_dir} is not a folder (expected a run folder, e.g. results/<run>)", file=err)
        return ExitCode.CANNOT_RUN
    if not (run_dir / RUN_FILE).is_file():
        # Every `lab run` writes run.json first: a folder without one is not a run (a
        # mistyped path), and nothing is written into it.
        print(
            f"lab report: {run_dir} is not a run folder: it has no {RUN_FILE} (expected a folder "
            "`lab run` made, e.g. results/<run>); nothing was written",
            file=err,
        )
        return ExitCode.CANNOT_RUN
    started = time.perf_counter()
    data = load_run(run_dir)
    if figures:
        from lab.report.aside import draw_beside

        figures_drawn = draw_beside(data, run_dir)  # drawn while the rules judge (lab.report.aside)
    report = judge(data, witness_limit=witness_limit, started=started)
    unwritten: list[str] = []
    """Outputs that could not be written: the lab failed (exit 4)."""
    warnings: list[str] = []
    """Parts that could not be made (a figure that raised): said, not fatal."""
    drawn: list[dict[str, str]] = []
    if figures:
        from lab.report.figures import draw_all

        drawn, figure_errors, figures_unwritten = figures_drawn()
        # The figures that depend on the verdict's sections (a capacity ramp's knee; what
        # each fault did, unless the child drew it: lab.report.aside).
        sections = {k: v for k, v in report.sections.items() if k not in {d["name"] for d in drawn}}
        more, more_errors, more_unwritten = draw_all(data, run_dir, specs=(), sections=sections)
        drawn += more
        warnings += figure_errors + more_errors
        unwritten += figures_unwritten + more_unwritten
    doc = document.document(report, drawn)
    refs = [r for g in report.gates for w in g.witnesses for r in w.refs]
    try:
        evidence = raw_rows(run_dir, refs)
    except Exception as e:  # the appendix is a convenience: the report stands without it
        evidence = {}
        warnings.append(f"raw evidence not read: {type(e).__name__}: {e}")
    problems = doc["problems"]
    assert isinstance(problems, list)
    problems += [{"path": "report", "message": w} for w in warnings]
    try:
        triggers = fault_triggers_jsonl(data)
    except Exception as e:  # the file is for a later replay: the report stands without it
        triggers = ""
        warnings.append(f"fault_triggers.jsonl not written: {type(e).__name__}: {e}")
    written, not_written = _write_outputs(run_dir, doc, drawn, evidence, triggers)
    unwritten += not_written
    unreadable = {s.path for s in report.sources if s.status == "error"}
    said = [f"{'evidence unreadable: ' if p.path in unreadable else ''}{p}" for p in report.problems]
    said += [f"note: {note}" for note in report.notes]
    for line in [*said, *warnings]:
        print(f"lab report: {line}", file=err)
    code: int = report.verdict.exit_code
    verdict: str = report.verdict.upper()
    basis = document.basis_text(doc)
    summary = (
        f"verdict: {verdict} (exit {code}); "
        + (f"{basis}; " if basis else "")
        + f"checked in {report.check_seconds:.2f} s; wrote {', '.join(written) or 'nothing'} in {run_dir}"
    )
    _print_verdict(doc, f"{verdict} {run_dir}" if quiet else None, summary, out)
    if unwritten:
        print(
            f"lab report: the lab failed: outputs not written in {run_dir} ({'; '.join(unwritten)}); "
            f"the verdict would have been {verdict}",
            file=err,
        )
        return ExitCode.LAB_FAILED
    return code


def _write_outputs(
    run_dir: Path,
    doc: Mapping[str, Any],
    drawn: list[dict[str, str]],
    evidence: Mapping[str, str],
    triggers: str = "",
) -> tuple[list[str], list[str]]:
    """Write report.json, fault_triggers.jsonl (`triggers`), report.md, junit.xml and
    report.html, each on its own: (the names written, why each of the others was not)."""
    from lab.checker import FAULT_TRIGGERS_FILE
    from lab.report import document, junit, markdown
    from lab.report.html import render

    def html() -> None:
        images = {
            f["file"]: (run_dir / f["file"]).read_bytes() for f in drawn if (run_dir / f["file"]).is_file()
        }
        _write_text(run_dir / "report.html", render(doc, images, evidence))

    writers: list[tuple[str, Callable[[], Any]]] = [
        ("report.json", lambda: _write_text(run_dir / "report.json", document.dumps(doc))),
        (FAULT_TRIGGERS_FILE, lambda: _write_text(run_dir / FAULT_TRIGGERS_FILE, triggers)),
        ("report.md", lambda: _write_text(run_dir / "report.md", markdown.render(doc))),
        ("junit.xml", lambda: _write_text(run_dir / "junit.xml", junit.render(doc))),
        ("report.html", html),
    ]
    written: list[str] = []
    unwritten: list[str] = []
    for name, write in writers:
        try:
            write()
            written.append(name)
        except OSError as e:
            unwritten.append(f"{name}: {e.strerror or e}")
    return written, unwritten


def _print_verdict(doc: Mapping[str, Any], quiet_line: str | None, summary: str, out: TextIO) -> None:
    """The verdict on `out`: one line (`quiet_line`), or the gate table, the liveness
    findings and `summary`."""
    from lab.report import markdown
    from lab.report.html import liveness_lines

    try:
        if quiet_line is not None:
            print(quiet_line, file=out)
        else:
            text = markdown.incomplete_banner(doc)
            if text:
                print(text, file=out)
            print(markdown.gate_table(doc), file=out)
            for line in liveness_lines(doc):
                print(f"liveness: {line}", file=out)
            print(summary, file=out)
        out.flush()
    except BrokenPipeError:
        # `lab report RUN | head`: the reader left early. The files are written and the
        # exit code still tells the verdict; stdout goes nowhere so exiting is quiet.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
