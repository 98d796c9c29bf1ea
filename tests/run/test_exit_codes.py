"""Every exit code of `lab.exitcodes`, as `lab run` and the `lab` command line give it
(README: "Exit codes"). Elsewhere: 0 for a complete run (test_lab_run.py), 2 for an
interrupted run (test_lab_run.py), a stalled one and a part's death (tests/robustness), 4
for a full disk (tests/robustness)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import lab.cli
from lab.exitcodes import ExitCode
from lab.report.document import rules_of
from tests.livesrv import LAB

HERE = Path(__file__).resolve().parent


def lab_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LAB, "run", *args, "--out", str(tmp_path / "results"), "--quiet", "--no-figures"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )


@pytest.mark.live
def test_1_a_gate_failed(tmp_path: Path) -> None:
    proc = lab_run(tmp_path, str(HERE / "failgate.toml"))
    assert proc.returncode == ExitCode.GATE_FAILED, proc.stdout[-2000:] + proc.stderr[-2000:]
    (report,) = (tmp_path / "results").glob("*/report.json")
    gates = {g["gate"]: g["verdict"] for g in rules_of(json.loads(report.read_text()))}
    assert gates["reconnect_qps"] == "fail", gates


def test_3_a_bad_option_is_3_not_argparses_2(tmp_path: Path) -> None:
    for args in (["--workers", "0"], ["--workers", "two"], ["--no-such-flag"]):
        proc = lab_run(tmp_path, "smoke", *args)
        assert proc.returncode == ExitCode.CANNOT_RUN, (args, proc.stderr)
        assert "error:" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_3_an_unknown_scenario(tmp_path: Path) -> None:
    proc = lab_run(tmp_path, "no-such-scenario")
    assert proc.returncode == ExitCode.CANNOT_RUN and "known scenarios: " in proc.stderr
    assert "smoke" in proc.stderr


def test_4_a_results_root_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "results").write_text("a file where the results folder should be")
    proc = lab_run(tmp_path, str(HERE / "url.toml"))
    assert proc.returncode == ExitCode.LAB_FAILED
    assert proc.stderr.strip().splitlines() == [
        f"lab run: the lab failed: cannot create the results folder {tmp_path / 'results'}: File exists"
    ]


def test_4_a_crash_is_one_line_and_a_log_with_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        lab.cli, "SUBCOMMAND_MODULES", [*lab.cli.SUBCOMMAND_MODULES, "tests.run.crashing_command"]
    )
    code = lab.cli.main(["crash-for-test"])
    assert code == ExitCode.LAB_FAILED
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "lab crash-for-test: the lab failed: ZeroDivisionError: a bug of ours (traceback in "
    )
    log = Path(line.rsplit("traceback in ", 1)[1].rstrip(")"))
    text = log.read_text()
    assert "Traceback" in text and "_crash" in text and "ZeroDivisionError" in text
    log.unlink()
