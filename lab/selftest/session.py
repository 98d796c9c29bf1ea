"""One `lab selftest`: its folder, its cases run `jobs` at a time, a progress line per
finished run, and the matrix at the end (terminal, selftest.json, selftest.md).

Folder (`<out>/<UTC time>-selftest-<4 hex>/`, created exclusively):
    selftest.json, selftest.md     the matrix (mcpLabSelftest.v1) and its markdown
    runs/<case>/<run folder>/      what `lab run` wrote (report.json, ledgers, logs)
    runs/<case>/lab-run.log        lab run's own output
    servers/<case>/                the reference server's log and ledger (never shown to the checker)
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from types import FrameType

from lab.exitcodes import ExitCode
from lab.runfolder import create_run_folder, replace_file
from lab.scenario import Scenario, load_scenario
from lab.selftest.cases import Case
from lab.selftest.execute import CaseRun, Children, run_case
from lab.selftest.matrix import LEGEND, Outcome, Row, as_json, exit_code, judge_case, markdown, text_matrix


class Selftest:
    def __init__(
        self,
        cases: list[Case],
        scenario: Scenario,
        *,
        out: Path,
        jobs: int,
        event_ids: str,
        figures: bool = True,
        retries: int = 1,
    ) -> None:
        self.cases = cases
        self.scenario = scenario
        self.out = out
        self.jobs = jobs
        self.event_ids = event_ids
        self.figures = figures
        self.retries = retries
        self.children = Children()
        self._signals = 0
        self._print_lock = threading.Lock()

    def say(self, text: str, *, err: bool = False) -> None:
        with self._print_lock, contextlib.suppress(OSError):
            print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Pass the signal on as SIGINT: each `lab run` stops and keeps its evidence (a second
        one forces it), each server stops; runs not yet started are not started."""
        self._signals += 1
        self.children.stopping.set()
        self.say(
            f"\n{signal.Signals(signum).name}: stopping the runs under way, keeping what they wrote"
            + (" (again: forcing)" if self._signals > 1 else " (again to force)"),
            err=True,
        )
        self.children.send(signal.SIGINT)

    def _case(self, case: Case, folder: Path) -> Row:
        """A case, tried again while it is undecided (up to `retries` more times): a run the
        lab could not judge (inconclusive, incomplete: most often the lab's own parts short
        of CPU on a busy machine) says nothing about the detector. A caught defect, a miss
        or a false alarm is never tried again; the earlier tries stay in the matrix."""
        earlier: list[Row] = []
        while True:
            row = judge_case(self._one(case, folder, attempt=len(earlier) + 1))
            row = replace(row, earlier=tuple(earlier))
            if (
                row.outcome is not Outcome.UNDECIDED
                or len(earlier) >= self.retries
                or self.children.stopping.is_set()
            ):
                return row
            self.say(f"       {case.name:<22} undecided ({row.why}): trying again")
            earlier.append(replace(row, earlier=()))

    def _one(self, case: Case, folder: Path, *, attempt: int) -> CaseRun:
        if self.children.stopping.is_set():
            return CaseRun(case, None, 0.0, None, None)
        try:
            scenario = self.scenario if case.scenario is None else load_scenario(case.scenario)
            return run_case(
                case,
                folder,
                scenario.path,
                event_ids=self.event_ids,
                figures=self.figures,
                hard_timeout_s=scenario.load.hard_timeout,
                children=self.children,
                attempt=attempt,
            )
        except Exception as e:  # a bug of ours, or the disk: this case's lab failed, the others go on
            return CaseRun(case, None, 0.0, None, None, error=f"lab failed: {type(e).__name__}: {e}")

    def execute(self, started: float) -> int:
        folder = create_run_folder(self.out, "selftest")
        n = len(self.cases)
        defects = sum(1 for c in self.cases if c.defect is not None)
        shapes = sum(1 for c in self.cases if c.shape)
        self.say(
            f"lab selftest: {n} run(s) ({defects} defect(s)"
            f"{', pristine' if defects + shapes < n else ''}"
            f"{f', {shapes} legal shape(s)' if shapes else ''}), {self.jobs} at a time, "
            f"scenario {self.scenario.name}, event IDs {self.event_ids}, black-box (URL target)"
        )
        self.say(f"results: {folder}")
        t0 = time.monotonic()
        rows: dict[str, Row] = {}
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="selftest") as pool:
            futures: dict[Future[Row], Case] = {pool.submit(self._case, c, folder): c for c in self.cases}
            for done, fut in enumerate(as_completed(futures), start=1):
                row = fut.result()
                rows[row.case.name] = row
                self.say(
                    f"[{done:>2}/{n}] {row.case.name:<22} {row.outcome_text:<11} {row.seconds:5.0f} s  "
                    f"{row.why_text}"
                )
        ordered = [rows[c.name] for c in self.cases]
        wall = time.monotonic() - t0
        code = exit_code(ordered)
        self.say("")
        self.say(text_matrix(ordered))
        self.say(LEGEND)
        self._write(folder, ordered, started=started, wall=wall, code=code)
        caught = sum(1 for r in ordered if r.outcome is Outcome.CAUGHT)
        pristine = [r for r in ordered if r.case.defect is None and not r.case.shape]
        tail = f", pristine {pristine[0].outcome}" if pristine else ""
        legal = [r for r in ordered if r.case.shape]
        if legal:
            passed = sum(1 for r in legal if r.outcome is Outcome.PASSED)
            tail += f", {passed} of {len(legal)} legal shape(s) passed"
        self.say(
            f"lab selftest: exit {int(code)} — {caught} of {defects} defect(s) caught{tail}; "
            f"wall time {wall:.0f} s; matrix in {folder / 'selftest.md'}"
        )
        return int(code)

    def _write(self, folder: Path, rows: list[Row], *, started: float, wall: float, code: ExitCode) -> None:
        ids, name = self.event_ids, self.scenario.name
        doc = as_json(
            rows, started_at=started, wall_s=wall, code=code, event_ids=ids, scenario=name, folder=folder
        )
        replace_file(folder / "selftest.json", json.dumps(doc, indent=2) + "\n")
        replace_file(
            folder / "selftest.md", markdown(rows, wall_s=wall, code=code, event_ids=ids, scenario=name)
        )
