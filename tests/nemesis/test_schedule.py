"""The toxics schedule on a fake clock and a fake API: order, timing, failures, cleanup."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lab.nemesis.client import NotFoundError, ToxiproxyRejected, ToxiproxyUnreachable
from lab.nemesis.schedule import ScheduledToxic, ToxicScheduleRunner, plan_steps
from lab.nemesis.toxics import ToxicSpec, make_toxic

LATENCY = make_toxic("latency", latency=100)
RESET = make_toxic("reset_peer", timeout=0)
START = 1000.0


@dataclass
class FakeTime:
    now: float = START
    waits: list[float] = field(default_factory=list)
    stop_after: int | None = None  # the n-th wait reports "stopped"

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.stop_after is not None and len(self.waits) >= self.stop_after:
            return True
        self.now += seconds
        return False


@dataclass
class FakeApi:
    time: FakeTime
    calls: list[tuple[float, str, str, str]] = field(default_factory=list)
    fail_add: Exception | None = None
    fail_remove: Exception | None = None

    def add_toxic(self, proxy: str, toxic: ToxicSpec) -> None:
        self.calls.append((self.time.now - START, "add", proxy, toxic.name))
        if self.fail_add is not None:
            raise self.fail_add

    def remove_toxic(self, proxy: str, name: str) -> None:
        self.calls.append((self.time.now - START, "remove", proxy, name))
        if self.fail_remove is not None:
            raise self.fail_remove


def _runner(
    entries: list[ScheduledToxic], *, fail_add: Exception | None = None, fail_remove: Exception | None = None
) -> tuple[ToxicScheduleRunner, FakeApi, FakeTime]:
    t = FakeTime()
    api = FakeApi(t, fail_add=fail_add, fail_remove=fail_remove)
    return ToxicScheduleRunner(api, entries, START, clock=t.clock, wait=t.wait), api, t


def test_steps_are_in_time_order_with_removes_first_at_a_tie() -> None:
    steps = plan_steps(
        [
            ScheduledToxic("p", LATENCY, at=5, until=10),
            ScheduledToxic("p", LATENCY, at=10, until=12),  # starts where the other ends
            ScheduledToxic("q", RESET, at=0),
        ]
    )
    assert [(s.offset, s.action, s.proxy) for s in steps] == [
        (0, "add", "q"),
        (5, "add", "p"),
        (10, "remove", "p"),
        (10, "add", "p"),
        (12, "remove", "p"),
    ]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([ScheduledToxic("p", LATENCY, at=-1)], "at must be >= 0"),
        ([ScheduledToxic("p", LATENCY, at=3, until=3)], "until .* must be after at"),
        (
            [ScheduledToxic("p", LATENCY, at=0, until=5), ScheduledToxic("p", LATENCY, at=4)],
            "overlapping windows",
        ),
        ([ScheduledToxic("p", LATENCY, at=0), ScheduledToxic("p", LATENCY, at=9)], "overlapping windows"),
    ],
)
def test_bad_schedules_are_refused_before_anything_runs(entries: list[ScheduledToxic], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_steps(entries)


def test_same_toxic_on_two_proxies_is_not_an_overlap() -> None:
    assert (
        len(plan_steps([ScheduledToxic("p", LATENCY, at=0, until=5), ScheduledToxic("q", LATENCY, at=1)]))
        == 3
    )


def test_run_acts_on_time_and_cleans_up() -> None:
    runner, api, _t = _runner([ScheduledToxic("p", LATENCY, at=2, until=5), ScheduledToxic("q", RESET, at=3)])
    outcomes = runner.run()
    assert api.calls == [
        (2, "add", "p", "latency_downstream"),
        (3, "add", "q", "reset_peer_downstream"),
        (5, "remove", "p", "latency_downstream"),
        (5, "remove", "q", "reset_peer_downstream"),  # cleanup at the end of the run
    ]
    assert all(o.ok for o in outcomes)
    assert [o.due_at - START for o in outcomes[:3]] == [2, 3, 5]


def test_a_late_runner_acts_at_once_and_says_how_late() -> None:
    runner, api, t = _runner([ScheduledToxic("p", LATENCY, at=1, until=2)])
    t.now = START + 7
    outcomes = runner.run_due()
    assert [c[1] for c in api.calls] == ["add", "remove"]
    assert [(o.due_at - START, o.done_at - START) for o in outcomes] == [(1, 7), (2, 7)]
    assert runner.next_due() is None


def test_driving_it_from_a_loop() -> None:
    runner, _api, t = _runner([ScheduledToxic("p", LATENCY, at=1, until=4)])
    assert runner.run_due() == [] and runner.next_due() == START + 1
    t.now = START + 1
    assert [o.step.action for o in runner.run_due()] == ["add"]
    assert runner.next_due() == START + 4


def test_a_refused_add_is_not_removed_later() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=1, until=2)], fail_add=ToxiproxyRejected(404, "proxy not found")
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add"]
    assert not outcomes[0].ok and not outcomes[0].unknown and "404" in (outcomes[0].error or "")
    assert outcomes[1].ok and outcomes[1].error == "not added: nothing to remove"


def test_an_unanswered_add_is_removed_all_the_same() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=1, until=2)], fail_add=ToxiproxyUnreachable("timed out")
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add", "remove"]
    assert outcomes[0].unknown and not outcomes[0].ok
    assert outcomes[1].ok


def test_a_toxic_already_gone_counts_as_removed() -> None:
    runner, _api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=0, until=1)], fail_remove=NotFoundError(404, "toxic not found")
    )
    assert all(o.ok for o in runner.run())


def test_an_unanswered_remove_is_retried_by_cleanup() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=0, until=1)], fail_remove=ToxiproxyUnreachable("timed out")
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add", "remove", "remove"]
    assert [o.unknown for o in outcomes] == [False, True, True]


def test_toxicity_zero_is_refused_before_any_call() -> None:
    class Refusing(FakeApi):
        def add_toxic(self, proxy: str, toxic: ToxicSpec) -> None:
            raise ValueError("toxicity 0")

    t = FakeTime()
    runner = ToxicScheduleRunner(
        Refusing(t), [ScheduledToxic("p", LATENCY, at=0, until=1)], START, clock=t.clock, wait=t.wait
    )
    outcomes = runner.run()
    assert not outcomes[0].ok and outcomes[1].error == "not added: nothing to remove"


def test_stopping_removes_what_was_added() -> None:
    runner, api, t = _runner(
        [ScheduledToxic("p", LATENCY, at=0, until=60), ScheduledToxic("q", RESET, at=30)]
    )
    t.stop_after = 1  # step 0 is due at once; the wait for step 30 reports a stop
    runner.run()
    assert [c[1:] for c in api.calls] == [
        ("add", "p", "latency_downstream"),
        ("remove", "p", "latency_downstream"),
    ]
