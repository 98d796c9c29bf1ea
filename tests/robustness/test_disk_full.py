"""A full disk under the results: `lab run` ends with exit 4 ("the lab failed") and one
line naming the file it could not write, no traceback of its own, no half-written
run.json.tmp, and no process left — whether the disk is full before the run or fills up
during it. The results go on a small tmpfs; where mounting one is not allowed, the tests
skip and say so."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.livesrv import LAB
from tests.robustness.runs import SCENARIOS, survivors

pytestmark = pytest.mark.live


@pytest.fixture
def tiny_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    size_kib, free_kib = request.param
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; this test runs where it may")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        filler = mount / "filler"
        with filler.open("wb") as f:
            try:
                f.write(b"\0" * ((size_kib - free_kib) * 1024))
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                pass  # full already: what the caller asked for
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _run_on(mount: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LAB, "run", str(SCENARIOS / "url.toml"), "--out", str(mount / "results"), "--no-report", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )


@pytest.mark.parametrize("tiny_disk", [(1024, 0)], indirect=True)
def test_a_disk_full_before_the_run(tiny_disk: Path, tmp_path: Path) -> None:
    proc = _run_on(tiny_disk, tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("lab run: the lab failed: cannot ") and "No space left on device" in last
    assert "Traceback" not in proc.stderr
    assert list(tiny_disk.rglob("*.tmp")) == []


@pytest.mark.parametrize("tiny_disk", [(4096, 700)], indirect=True)
def test_a_disk_that_fills_up_during_the_run(tiny_disk: Path, tmp_path: Path) -> None:
    proc = _run_on(tiny_disk, tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("lab run: the lab failed: cannot write ") and last.endswith(
        "No space left on device"
    )
    (folder,) = (tiny_disk / "results").iterdir()
    assert not (folder / "run.json.tmp").exists()
    doc = json.loads((folder / "run.json").read_text())  # the last run.json that could be written
    pids = [p["pid"] for p in doc.get("processes", [])]
    assert pids and survivors(pids) == [], "every part was stopped although nothing could be recorded"
