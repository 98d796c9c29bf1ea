"""A worker that cannot keep up (lab.load.overload): late and at a full core, second after
second, is overloaded; late but idle (a loop held by a blocking call), or busy but on
time, is not. And `lab run`'s watcher ends such a run as limited by the lab."""

from __future__ import annotations

import json
from pathlib import Path

from lab.load.overload import OVERLOAD_S, OverloadWatch
from lab.run.progress import JsonLines
from lab.run.watch import ToxicOutcomes, Watcher
from lab.scenario import load_scenario
from tests.livesrv import ROOT

STRIKES = int(OVERLOAD_S)
"""Looks a second apart that make an overload."""


def run(watch: OverloadWatch, seconds: int, *, cores: float, lag: float, rate: int = 5000) -> bool:
    wall, cpu, accepted = 100.0, 10.0, 0
    if watch._last is not None:
        wall, cpu, accepted = watch._last
    out = False
    for _ in range(seconds):
        wall, cpu, accepted = wall + 1.0, cpu + cores, accepted + rate
        out = watch.look(wall, cpu, accepted, lag)
    return out


def test_late_at_a_full_core_for_long_enough_is_an_overload() -> None:
    watch = OverloadWatch()
    assert not run(watch, STRIKES, cores=1.0, lag=1.2)  # the first look only sets the start
    assert run(watch, 1, cores=1.0, lag=1.2)
    assert watch.events_per_s == 5000


def test_a_starved_loop_that_looks_seldom_counts_the_seconds_between() -> None:
    # Looks 3 s apart (the loop itself starved): two such late, busy looks are 6 s.
    watch = OverloadWatch()
    watch.look(100.0, 10.0, 0, 0.0)
    assert not watch.look(103.0, 13.0, 300, 2.5)
    assert watch.look(106.0, 16.0, 600, 2.5) and watch.events_per_s == 100


def test_late_but_idle_or_busy_but_on_time_is_not() -> None:
    assert not run(OverloadWatch(), 60, cores=0.05, lag=2.0)  # a blocking hold: late, not busy
    assert not run(OverloadWatch(), 60, cores=1.0, lag=0.05)  # busy and keeping up


def test_one_second_on_time_starts_the_count_again() -> None:
    watch = OverloadWatch()
    run(watch, STRIKES, cores=1.0, lag=1.0)
    run(watch, 1, cores=1.0, lag=0.0)
    assert not run(watch, STRIKES - 1, cores=1.0, lag=1.0)
    assert run(watch, 1, cores=1.0, lag=1.0)


def test_the_watcher_ends_an_overloaded_run_as_limited_by_the_lab(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "tests" / "robustness" / "stall.toml")
    watcher = Watcher(tmp_path, sc, 1000.0, ToxicOutcomes(JsonLines(tmp_path / "nemesis.jsonl")))
    (tmp_path / "progress.json").write_text(json.dumps({"users": 4, "calls_ok": 1}))
    assert watcher.tick(1001.0)[1] is None
    progress = {"users": 4, "calls_ok": 2, "overloaded": 1, "overload_events_per_s": 12000}
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    _, reason, complete = watcher.tick(1002.0)
    assert reason is not None and not complete
    assert reason.startswith("limited by the lab: 1 Locust worker(s) could not keep up with the target")
    assert "accepting 12,000 events/s" in reason
