"""A run folder's life (lab.runfolder): created exclusively, run.json written whole or not
at all, and a `running` folder whose owner is gone marked abandoned — but never one whose
owner still runs, nor a finished one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.runfolder import (
    RunFolderError,
    create_run_folder,
    mark_abandoned,
    mark_abandoned_runs,
    owner,
    write_run_json,
    write_secret,
)


def test_folders_are_new_every_time_and_named_to_the_millisecond(tmp_path: Path) -> None:
    folders = [create_run_folder(tmp_path, "smoke") for _ in range(30)]
    assert len(set(folders)) == 30 and all(f.is_dir() for f in folders)
    assert all(re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-smoke-[0-9a-f]{4}", f.name) for f in folders)


def test_an_unwritable_run_json_raises_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json.tmp").mkdir()  # the temporary name is taken by a folder: the write fails
    with pytest.raises(RunFolderError, match=r"cannot write .*run\.json"):
        write_run_json(folder, {"schema": "x"})
    assert not (folder / "run.json").exists()
    (folder / "run.json.tmp").rmdir()
    write_run_json(folder, {"schema": "x"})
    assert (
        json.loads((folder / "run.json").read_text()) == {"schema": "x"}
        and not (folder / "run.json.tmp").exists()
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run(tmp_path: Path, name: str, **record: object) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    write_run_json(folder, {"schema": "mcpLabRun.v1", "complete": False, "end_reason": "running", **record})
    write_secret(folder, "server-config.json", "{}")
    return folder


def test_only_a_running_folder_whose_owner_is_gone_is_marked_abandoned(tmp_path: Path) -> None:
    gone = _run(tmp_path, "gone", status="running", owner={**owner(), "pid": _dead_pid()})
    alive = _run(tmp_path, "alive", status="running", owner=owner())
    reused = _run(
        tmp_path, "reused", status="running", owner={**owner(), "start_ticks": -1}
    )  # our PID, not us
    finished = _run(tmp_path, "finished", status="finished", owner={**owner(), "pid": _dead_pid()})
    legacy = _run(tmp_path, "legacy")  # written before `state`: running, no owner
    assert mark_abandoned_runs(tmp_path) == [gone, legacy, reused]
    doc = json.loads((gone / "run.json").read_text())
    assert doc["status"] == "abandoned" and doc["complete"] is False
    assert doc["end_reason"].startswith("abandoned: the lab run that owned this folder (pid ")
    assert not (gone / ".secrets").exists(), "an abandoned run's secrets are dropped"
    assert json.loads((alive / "run.json").read_text())["status"] == "running"
    assert (alive / ".secrets").exists()
    assert json.loads((finished / "run.json").read_text())["status"] == "finished"
    assert not mark_abandoned(gone), "marked once"
    assert os.getpid() == owner()["pid"]


def test_lab_report_marks_a_folder_whose_lab_run_died(tmp_path: Path) -> None:
    from tests.livesrv import LAB

    folder = _run(tmp_path, "gone", status="running", owner={**owner(), "pid": _dead_pid()}, started_at=1.0)
    proc = subprocess.run(
        [LAB, "report", str(folder), "--quiet", "--no-figures"], capture_output=True, text=True, timeout=120
    )
    assert "marked abandoned" in proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr  # incomplete, never a pass
    assert json.loads((folder / "run.json").read_text())["status"] == "abandoned"
