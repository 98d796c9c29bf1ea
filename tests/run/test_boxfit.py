"""Before anything starts, `lab run` says what the box cannot be expected to hold
(lab.run.boxfit): warned, or refused with `--strict` (exit 3, nothing started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.run.boxfit import Box, misfits
from lab.scenario import load_scenario
from tests.livesrv import ROOT

LAB = str(Path(sys.executable).with_name("lab"))
SCENARIOS = ROOT / "scenarios"
TWO_CORES = Box(cores=2, available_bytes=4 * 2**30, open_files=20_000)


def big(tmp_path: Path, users: int) -> Path:
    text = (SCENARIOS / "clients-10k.toml").read_text()
    path = tmp_path / f"big-{users}.toml"
    path.write_text(text.replace("users = 6000", f"users = {users}", 1))
    assert f"users = {users}" in path.read_text()
    return path


def test_the_stock_scenarios_fit_a_two_core_box() -> None:
    for name in ("smoke", "gate-100k", "clients-10k", "chaos-day"):
        assert misfits(load_scenario(SCENARIOS / f"{name}.toml"), TWO_CORES) == [], name


def test_fifty_thousand_clients_are_named_by_every_figure_they_exceed(tmp_path: Path) -> None:
    found = misfits(load_scenario(big(tmp_path, 50_000)), TWO_CORES)
    assert len(found) == 3, found
    assert found[0].startswith("50,000 clients at once, where a box of 2 core(s) held about 6,000")
    assert "about 140,000 open files in each proxy" in found[1] and "limit of 20,000" in found[1]
    assert "GiB for 50,000 clients" in found[2] and "of the 4.0 GiB available" in found[2]
    # The same on a bigger box fits.
    assert misfits(load_scenario(big(tmp_path, 50_000)), Box(32, 64 * 2**30, 1 << 20)) == []


def test_strict_refuses_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [LAB, "run", str(big(tmp_path, 500_000)), "--strict", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "this box cannot hold the run (--strict): 500,000 clients at once" in done.stderr
    assert not out.exists() or not any(out.iterdir())
