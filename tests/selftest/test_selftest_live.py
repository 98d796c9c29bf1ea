"""`lab selftest` for real: the CI subset of the defect matrix (issue 10 §6), and what the
command does around it (listing, refusals, Ctrl-C, no process left behind).

The subset, in two halves run as two tests, is the pristine run and seven defects: a
foreign replay (`shared-event-store`, gate 1), one message on two streams (`broadcast`,
gate 1), resumptions that owe what they never replay (`resume-forget`, `resume-empty`,
gate 5), a request without its session served (`serve-without-session`, gate 3), a
capability never declared (`undeclared-capability`, check 13), IDs counted per stream
(`per-stream-ids`, gate 1); and two legal shapes, which must pass like the pristine run
(`shape-poll`, `shape-2025-03-26`); and the modern era's (2026-07-28) defects,
headers the body contradicts served (`modern-headers-unchecked`) and a session ID minted
(`modern-mints-session`), both check 15, a cancelled call's messages sent on another
response (`modern-sends-after-close`, gate 1), and writes performed again on the modern
path only (`modern-no-idempotency`, gate 2 failing in the modern era's part of a run of both),
with both eras at once on the pristine server (`shape-dual-era`). Each of the others is caught by its check in unit
tests and shown on the wire in tests/server/test_defects.py; the whole matrix is run by
hand (`lab selftest`, docs/selftest.md).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lab.cli import main
from lab.exitcodes import ExitCode
from lab.selftest.matrix import GATES
from lab.server.defects import DEFECT_NAMES
from tests.livesrv import LAB, ROOT

SUBSETS = (
    ("pristine", "broadcast", "resume-forget", "resume-empty", "shape-poll"),
    (
        "shared-event-store",
        "serve-without-session",
        "undeclared-capability",
        "per-stream-ids",
        "shape-2025-03-26",
    ),
    ("modern-headers-unchecked", "modern-mints-session", "modern-sends-after-close"),
    ("modern-no-idempotency", "shape-dual-era"),
    ("stalls-at-capacity", "shape-capacity"),
)
"""Five parts, five tests: the suite's workers run them side by side, one run at a time
each (one test of ten runs was the suite's longest by far). The third and fourth are the
modern era's: its defects (check 15, gate 1 for a cancelled call's messages sent
elsewhere, gate 2 era by era) and both eras at once on the pristine server. The fifth is
the capacity check's: a server that stops answering past its capacity fails rule 16, the
pristine one passes it, the fault gates not applicable."""


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (a test's own folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def the_matrix(out: Path) -> tuple[Path, dict[str, Any]]:
    """The selftest's folder in `out` and its selftest.json."""
    (folder,) = [p for p in out.iterdir() if p.is_dir() and "-selftest-" in p.name]
    doc: dict[str, Any] = json.loads((folder / "selftest.json").read_text(encoding="utf-8"))
    assert (folder / "selftest.md").read_text(encoding="utf-8").startswith("# lab selftest")
    return folder, doc


@pytest.mark.long(3)
@pytest.mark.live
@pytest.mark.parametrize("subset", SUBSETS, ids=["half-1", "half-2", "modern", "both-eras", "capacity"])
def test_the_ci_subset_catches_every_defect_and_the_pristine_server_passes(
    tmp_path: Path, subset: tuple[str, ...]
) -> None:
    # One run at a time per half: the two halves run side by side, so the box carries two
    # lab runs at once, as the single test of two jobs did (four at once starved the other
    # tests' servers of the CPU they need to start).
    argv = [LAB, "selftest", "--jobs", "1", "--no-figures", "--out", str(tmp_path)]
    for name in subset:
        argv += ["--defect", name]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400)
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # One progress line per run as it finishes, then the matrix and the final line.
    assert sum(1 for x in lines if x.startswith("[")) == len(subset)
    shapes = [n for n in subset if n.startswith("shape-")]
    legal = [n for n in subset if n == "pristine" or n in shapes]
    defects = len(subset) - len(legal)
    pristine = ", pristine passed" if "pristine" in subset else ""
    legal_shapes = f", {len(shapes)} of {len(shapes)} legal shape(s) passed" if shapes else ";"
    assert lines[-1].startswith(
        f"lab selftest: exit 0 — {defects} of {defects} defect(s) caught{pristine}{legal_shapes}"
    ), lines[-1]
    folder, doc = the_matrix(tmp_path)
    assert doc["schema"] == "mcpLabSelftest.v1" and doc["exit_code"] == 0 and doc["event_ids"] == "seq"
    cases = {c["case"]: c for c in doc["cases"]}
    assert list(cases) == list(subset)
    for name in legal:
        run = cases[name]
        assert run["outcome"] == "passed" and run["run_verdict"] == "pass", run["why"]
        # Every gate the run has passes (15 is the modern era's: absent from a run of the
        # handshake era only; 16 the capacity checks'). In a capacity check the gates whose
        # evidence only faults make are not applicable, and every other passes.
        verdicts = {g["number"]: g["verdict"] for g in run["gates"]}
        assert set(verdicts) == {n for n, _ in GATES}
        if name == "shape-capacity":
            assert {verdicts[n] for n in (2, 3, 4, 5, 6)} == {"not_applicable"}, verdicts
            assert verdicts[1] == verdicts[13] == verdicts[16] == "pass", verdicts
            continue
        assert {v for n, v in verdicts.items() if n not in (15, 16)} == {"pass"} and verdicts[15] in (
            "pass",
            None,
        )
        assert verdicts[16] is None
    for name in subset:
        if name in legal:
            continue
        case = cases[name]
        (gate,) = [g for g in case["gates"] if g["number"] == case["expected"]["gate"]]
        assert case["outcome"] == "caught", case["why"]
        assert gate["verdict"] == "fail" and gate["server_violations"] >= 1
        assert set(gate["server_checks"]) & set(case["expected"]["checks"])
        # Black-box: the checker had no server ledger; the server's is beside, not inside, the run.
        assert (folder / case["run_dir"] / "report.json").is_file()
        assert not (folder / case["run_dir"] / "server" / "ledger.sqlite").exists()
        assert (folder / "servers" / name / "ledger.sqlite").is_file()
    if "modern-no-idempotency" in subset:
        # A server whose modern path breaks what its handshake path does right: the report
        # judges each era's part alone, and only the modern one fails gate 2.
        report = json.loads((folder / cases["modern-no-idempotency"]["run_dir"] / "report.json").read_text())
        (g2,) = [g for g in report["eras"]["gates"] if g["number"] == 2]
        assert g2["by_era"]["modern"]["verdict"] == "fail" and g2["by_era"]["modern"]["server"] >= 1, g2
        assert g2["by_era"]["handshake"]["verdict"] == "pass", g2
    if "pristine" in subset:
        compare_runs(folder, cases)
    print(f"CI subset of lab selftest: {len(subset)} runs in {wall:.0f} s")
    assert processes_mentioning(str(tmp_path)) == []


def compare_runs(folder: Path, cases: dict[str, Any]) -> None:
    """`lab compare` on the matrix's real runs: the pristine server against a legal shape
    is no regression; against a defect, the defect's gate is named as regressed."""

    def lab_compare(base: str, new: str) -> subprocess.CompletedProcess[str]:
        argv = [LAB, "compare", str(folder / cases[base]["run_dir"]), str(folder / cases[new]["run_dir"])]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)

    legal = lab_compare("pristine", "shape-poll")
    assert legal.returncode == ExitCode.PASS, legal.stdout + legal.stderr
    assert legal.stdout.splitlines()[-1] == "no regression"
    for defect in ("broadcast", "resume-forget"):
        if defect not in cases:
            continue
        gate = cases[defect]["expected"]["gate"]
        caught = lab_compare("pristine", defect)
        assert caught.returncode == ExitCode.GATE_FAILED, caught.stdout + caught.stderr
        headline = caught.stdout.splitlines()[-1]
        assert headline.startswith("REGRESSED") and f"rule {gate} " in headline, headline
        assert "PASS -> FAIL" in headline


@pytest.mark.live
def test_ctrl_c_stops_the_runs_keeps_what_they_wrote_and_leaves_no_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [LAB, "selftest", "--defect", "pristine", "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("*/runs/pristine/*/clients/*.sqlite")):  # the load is under way
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INCONCLUSIVE, out + err
    assert "SIGINT: stopping the runs under way" in err
    (case,) = the_matrix(tmp_path)[1]["cases"]
    assert case["outcome"] == "undecided" and case["run_verdict"] == "incomplete"
    assert processes_mentioning(str(tmp_path)) == []


def test_list_and_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["selftest", "--list"]) == ExitCode.PASS
    listed = capsys.readouterr().out
    for name in DEFECT_NAMES:
        assert f"\n{name} " in listed
    assert re.search(r"\nshared-event-store +gate 1 cross_stream: sent_off_home", listed)
    assert re.search(r"\nmodern-mints-session +gate 15 modern_requests: session_minted", listed)
    for bad in (["--defect", "bogus"], ["--jobs", "0"], ["--event-ids", "e1"]):
        with pytest.raises(SystemExit) as e:
            main(["selftest", *bad, "--out", str(tmp_path)])
        assert e.value.code == ExitCode.CANNOT_RUN
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        'seed = 1\n[target]\ntokens = { "t1" = "alice" }\n[load]\nusers = 1\nduration = "1s"\n',
        encoding="utf-8",
    )
    assert main(["selftest", "--scenario", str(tokens), "--out", str(tmp_path)]) == ExitCode.CANNOT_RUN
    assert "without tokens" in capsys.readouterr().err
    assert main(["selftest", "--scenario", str(tmp_path / "missing.toml")]) == ExitCode.CANNOT_RUN
    assert list(tmp_path.iterdir()) == [tokens]  # nothing was started, no folder made
