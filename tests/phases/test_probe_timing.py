"""The rollout probe's late return waits for the old sessions' TTL counted from when the
probe last used them: a busy box that made its return late must not make the late one
come before those sessions could expire (gate 8's 'cursors of expired old sessions
presented' was then 0, seen in a full test run)."""

from __future__ import annotations

import time
from dataclasses import replace
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


class CountingProbe(FakeProbe):
    def __init__(self) -> None:
        super().__init__()
        self.pings: list[float] = []
        self.back_at: float | None = None

    def keep_alive(self) -> None:
        self.pings.append(time.time())

    def come_back(self) -> None:
        self.back_at = time.time()


def test_the_probe_keeps_its_sessions_alive_until_it_comes_back(tmp_path: Path) -> None:
    """Its sessions' TTL counts idle time: on a busy box (seen in a full test run) the old
    sessions expired before the return, and the rollback's cursors met a 404 instead of
    the rollback's own answer. A ping every TTL/3 at most, up to the return, prevents it."""
    d, _ = driver(tmp_path)
    probe = CountingProbe()
    d.probe = probe  # type: ignore[assignment]
    d.sc = replace(d.sc, target=replace(d.sc.target, session_ttl=1.5))  # a ping every 0.5 s
    started = time.time()
    d._rolled_back_at = started
    d._rolled_back.set()
    d.come_back_after_rollback(1.6)
    assert probe.back_at is not None and probe.back_at - started >= 1.6 - 0.01
    gaps = [b - a for a, b in zip([started, *probe.pings], [*probe.pings, probe.back_at], strict=True)]
    assert len(probe.pings) >= 3 and max(gaps) <= 0.5 + 0.2, gaps
