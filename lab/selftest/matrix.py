"""The defect × gate matrix: each case's outcome, the selftest's exit code, and the
matrix as text (terminal), markdown and JSON (`mcpLabSelftest.v1`).

A defect is **caught** when its expected gate failed with at least one witness of an
expected check attributed to the **server** (read from the run's report.json). The
pristine case **passed** when `lab run` exited 0 (every gate passed, the run complete).

Exit code (lab.exitcodes), the worst case decides, in this order:
4 a run's lab failed (lab run exited 4, hung, or left no readable report);
1 a detector did not fire (a defect missed) or a false alarm (a pristine gate failed);
3 a run could not be made (the server did not start, lab run exited 3);
2 a run could not be judged (the expected gate inconclusive, the run incomplete or interrupted);
0 every defect caught and the pristine run passed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.exitcodes import ExitCode
from lab.report.document import rules_of
from lab.selftest.cases import Case, gates
from lab.selftest.execute import CaseRun

GATES = gates()

SCHEMA = "mcpLabSelftest.v1"


class Outcome(enum.StrEnum):
    CAUGHT = "caught"
    MISSED = "MISSED"
    PASSED = "passed"
    FALSE_ALARM = "FALSE ALARM"
    UNDECIDED = "undecided"
    NOT_MADE = "not made"
    LAB_FAILED = "lab failed"
    NOT_RUN = "not run"

    @property
    def exit_code(self) -> ExitCode:
        return {
            Outcome.CAUGHT: ExitCode.PASS,
            Outcome.PASSED: ExitCode.PASS,
            Outcome.MISSED: ExitCode.GATE_FAILED,
            Outcome.FALSE_ALARM: ExitCode.GATE_FAILED,
            Outcome.UNDECIDED: ExitCode.INCONCLUSIVE,
            Outcome.NOT_RUN: ExitCode.INCONCLUSIVE,
            Outcome.NOT_MADE: ExitCode.CANNOT_RUN,
            Outcome.LAB_FAILED: ExitCode.LAB_FAILED,
        }[self]


EXIT_ORDER = (ExitCode.LAB_FAILED, ExitCode.GATE_FAILED, ExitCode.CANNOT_RUN, ExitCode.INCONCLUSIVE)


@dataclass(frozen=True, slots=True)
class Cell:
    """One gate of one run."""

    verdict: str
    """pass | fail | inconclusive, or "" when the run has no report."""
    server: int
    """Violations the gate attributed to the server."""
    server_checks: tuple[str, ...]
    """The checks of its server witnesses."""

    def text(self, expected: bool) -> str:
        if not self.verdict:
            return "-"
        word = {"pass": "pass", "fail": "FAIL", "inconclusive": "inc", "not_applicable": "n/a"}.get(
            self.verdict, self.verdict
        )
        if self.server:
            word += f" s{self.server}"
        return f"{word}*" if expected else word


@dataclass(frozen=True, slots=True)
class Row:
    run: CaseRun
    cells: tuple[Cell, ...]
    outcome: Outcome
    why: str
    earlier: tuple[Row, ...] = ()
    """The tries of this case before this one, each undecided (lab.selftest.session)."""

    @property
    def case(self) -> Case:
        return self.run.case

    @property
    def seconds(self) -> float:
        """Wall time of every try of the case."""
        return self.run.seconds + sum(r.run.seconds for r in self.earlier)

    @property
    def outcome_text(self) -> str:
        """`passed`, or `passed (try 2)` when earlier tries were undecided."""
        return str(self.outcome) + (f" (try {len(self.earlier) + 1})" if self.earlier else "")

    @property
    def why_text(self) -> str:
        """Why, with each earlier try's outcome first."""
        before = "".join(f"try {i} {r.outcome}: {r.why}; " for i, r in enumerate(self.earlier, start=1))
        return before + (f"try {len(self.earlier) + 1}: " if self.earlier else "") + self.why


def cells_of(report: dict[str, Any] | None) -> tuple[Cell, ...]:
    by_id = {g.get("gate"): g for g in rules_of(report)} if report is not None else {}
    out = []
    for _, rule_id in GATES:
        g = by_id.get(rule_id)
        if g is None:
            out.append(Cell("", 0, ()))
            continue
        counts = g.get("attribution_counts") or {}
        checks = sorted(
            {
                str(w.get("check"))
                for w in g.get("witnesses") or []
                if isinstance(w, dict) and w.get("attribution") == "server"
            }
        )
        out.append(Cell(str(g.get("verdict", "")), int(counts.get("server", 0) or 0), tuple(checks)))
    return tuple(out)


def judge_case(run: CaseRun) -> Row:
    cells = cells_of(run.report)
    case = run.case
    if run.exit_code is None and run.error is None:
        return Row(run, cells, Outcome.NOT_RUN, "interrupted before it started")
    if run.exit_code == ExitCode.LAB_FAILED or (run.report is None and run.exit_code != ExitCode.CANNOT_RUN):
        if run.exit_code is None and run.error and run.error.startswith("lab serve"):
            return Row(run, cells, Outcome.NOT_MADE, run.error)
        return Row(run, cells, Outcome.LAB_FAILED, run.error or f"lab run exited {run.exit_code}")
    if run.exit_code == ExitCode.CANNOT_RUN:
        return Row(run, cells, Outcome.NOT_MADE, run.error or "lab run exited 3: the run could not be made")
    if run.error is not None:  # e.g. the reference server itself failed during the run
        return Row(run, cells, Outcome.LAB_FAILED, run.error)
    verdict = str((run.report or {}).get("verdict", ""))
    if case.gate is None:
        failed = [GATES[i][1] for i, c in enumerate(cells) if c.verdict == "fail"]
        if failed:
            return Row(
                run,
                cells,
                Outcome.FALSE_ALARM,
                f"gate(s) failed on {'a legal shape' if case.shape else 'the pristine server'}: "
                f"{', '.join(failed)}",
            )
        if run.exit_code == ExitCode.PASS and verdict == "pass":
            return Row(run, cells, Outcome.PASSED, "every gate passed")
        open_gates = [GATES[i][1] for i, c in enumerate(cells) if c.verdict != "pass"]
        return Row(
            run,
            cells,
            Outcome.UNDECIDED,
            f"run verdict {verdict or 'unknown'}"
            + (f"; not passed: {', '.join(open_gates)}" if open_gates else ""),
        )
    cell = cells[[n for n, _ in GATES].index(case.gate)]  # numbers need not be contiguous
    hit = [c for c in cell.server_checks if c in case.checks]
    gate = f"gate {case.gate} {case.gate_name}"
    if cell.verdict == "fail" and cell.server and hit:
        return Row(
            run, cells, Outcome.CAUGHT, f"{gate} failed: {cell.server} server violation(s), {', '.join(hit)}"
        )
    if cell.verdict == "inconclusive" or (
        verdict in ("incomplete", "inconclusive") and cell.verdict != "fail"
    ):
        return Row(run, cells, Outcome.UNDECIDED, f"{gate} {cell.verdict or 'not judged'} (run {verdict})")
    seen = f"; server checks seen: {', '.join(cell.server_checks)}" if cell.server_checks else ""
    return Row(
        run,
        cells,
        Outcome.MISSED,
        f"{gate} {cell.verdict}, no server witness of {' or '.join(case.checks)}{seen}",
    )


def exit_code(rows: Sequence[Row]) -> ExitCode:
    codes = {r.outcome.exit_code for r in rows}
    for code in EXIT_ORDER:
        if code in codes:
            return code
    return ExitCode.PASS if rows else ExitCode.INCONCLUSIVE


def expected_text(case: Case) -> str:
    return "every gate passes" if case.gate is None else f"{case.gate} {'/'.join(case.checks)}"


HEADERS = ("case", "expected", *(f"{n} {name.split('_')[0]}" for n, name in GATES), "outcome", "time")


def table(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        cells = tuple(c.text(r.case.gate == GATES[i][0]) for i, c in enumerate(r.cells))
        out.append((r.case.name, expected_text(r.case), *cells, r.outcome_text, f"{r.seconds:.0f} s"))
    return out


def text_matrix(rows: Sequence[Row]) -> str:
    """The matrix for a terminal: fixed-width columns."""
    body = table(rows)
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
    return "\n".join(lines)


LEGEND = (
    "Cells: the gate's verdict (pass, FAIL, inc = inconclusive, - = no report); sN = N violations "
    "attributed to the server; * = the gate expected to fail on this defect."
)


def markdown(rows: Sequence[Row], *, wall_s: float, code: int, event_ids: str, scenario: str) -> str:
    lines = [
        "# lab selftest",
        "",
        f"Scenario `{scenario}`, event IDs `{event_ids}`, black-box mode (URL target, no server "
        f"ledger, no admin control). Wall time {wall_s:.0f} s. Exit code {code}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + " --- |" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table(rows)]
    lines += ["", LEGEND, "", "## Why each outcome", ""]
    for r in rows:
        where = f" — `{r.run.run_dir}`" if r.run.run_dir else ""
        lines.append(f"- **{r.case.name}**: {r.outcome_text} — {r.why_text}{where}")
    return "\n".join(lines) + "\n"


def as_json(
    rows: Sequence[Row],
    *,
    started_at: float,
    wall_s: float,
    code: int,
    event_ids: str,
    scenario: str,
    folder: Path,
) -> dict[str, Any]:
    def rel(p: Path | None) -> str | None:
        if p is None:
            return None
        try:
            return str(p.relative_to(folder))
        except ValueError:
            return str(p)

    return {
        "schema": SCHEMA,
        "started_at": started_at,
        "wall_s": wall_s,
        "exit_code": code,
        "event_ids": event_ids,
        "scenario": scenario,
        "cases": [
            {
                "case": r.case.name,
                "defect": r.case.defect,
                "expected": {
                    "gate": r.case.gate,
                    "gate_name": r.case.gate_name,
                    "checks": list(r.case.checks),
                    "attribution": None if r.case.gate is None else "server",
                },
                "outcome": str(r.outcome),
                "why": r.why,
                "seconds": round(r.run.seconds, 3),
                "earlier_tries": [
                    {
                        "outcome": str(e.outcome),
                        "why": e.why,
                        "seconds": round(e.run.seconds, 3),
                        "run_verdict": (e.run.report or {}).get("verdict"),
                        "run_dir": rel(e.run.run_dir),
                    }
                    for e in r.earlier
                ],
                "lab_run_exit_code": r.run.exit_code,
                "run_verdict": (r.run.report or {}).get("verdict"),
                "run_dir": rel(r.run.run_dir),
                "server_log": rel(r.run.server_log),
                "error": r.run.error,
                "gates": [
                    {
                        "number": n,
                        "gate": name,
                        "verdict": c.verdict or None,
                        "server_violations": c.server,
                        "server_checks": list(c.server_checks),
                    }
                    for (n, name), c in zip(GATES, r.cells, strict=True)
                ],
            }
            for r in rows
        ],
    }
