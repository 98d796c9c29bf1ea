"""The rollout probe's late return waits for the old sessions' TTL counted from when the
probe last used them: a busy box that made its return late must not make the late one
come before those sessions could expire (gate 8's 'cursors of expired old sessions
presented' was then 0, seen in a full test run)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lab.run import phases
from lab.run.phases import PhaseDriver
from lab.scenario import load_scenario

HERE = Path(__file__).parent


class FakeProbe:
    def __init__(self) -> None:
        self.late_at: float | None = None

    def come_back(self) -> None:
        time.sleep(0.2)  # the return itself took a while

    def come_back_late(self) -> None:
        self.late_at = time.time()


def driver(tmp_path: Path) -> tuple[PhaseDriver, FakeProbe]:
    d = PhaseDriver(
        load_scenario(str(HERE / "rollout-mini.toml")),
        tmp_path,
        time.time(),
        admin_url=None,
        admin_token="",
        client_url="http://127.0.0.1:9/mcp",
        origin=None,
        token=None,
    )
    probe = FakeProbe()
    d.probe = probe  # type: ignore[assignment]
    return d, probe


def test_the_late_return_counts_the_ttl_from_the_probes_actual_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(phases, "PROBE_LATE_MARGIN_S", 0.1)
    d, probe = driver(tmp_path)
    d._rolled_back.set()
    d._rolled_back_at = time.time()
    d.come_back_after_rollback(0.0)
    came_back = time.time()
    d.come_back_late_after(0.3)
    assert probe.late_at is not None and probe.late_at - came_back >= 0.4 - 0.01


def test_without_a_return_the_late_one_goes_at_once(tmp_path: Path) -> None:
    d, probe = driver(tmp_path)
    started = time.time()
    d.come_back_late_after(30.0)
    assert probe.late_at is not None and probe.late_at - started < 1.0
