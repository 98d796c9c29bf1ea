"""The toxics schedule on a fake clock and a fake API: order, timing, failures, cleanup."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.nemesis.client import (
    NotFoundError,
    ProxyInfo,
    ToxiproxyRejected,
    ToxiproxyTimeout,
    ToxiproxyUnreachable,
)
from lab.nemesis.log import NemesisLog, read_nemesis_log, read_toxic_outcomes
from lab.nemesis.schedule import (
    API_TIMEOUT_BASE_S,
    ScheduledToxic,
    StepOutcome,
    ToxicScheduleRunner,
    api_timeout_for,
    plan_steps,
)
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
    timeouts: list[float | None] = field(default_factory=list)
    fail_add: Exception | None = None
    fail_remove: Exception | None = None

    def add_toxic(self, proxy: str, toxic: ToxicSpec, *, timeout: float | None = None) -> None:
        self.calls.append((self.time.now - START, "add", proxy, toxic.name))
        self.timeouts.append(timeout)
        if self.fail_add is not None:
            raise self.fail_add

    def remove_toxic(self, proxy: str, name: str, *, timeout: float | None = None) -> None:
        self.calls.append((self.time.now - START, "remove", proxy, name))
        self.timeouts.append(timeout)
        if self.fail_remove is not None:
            raise self.fail_remove

    def get_proxy(self, name: str, *, timeout: float | None = None) -> ProxyInfo | None:
        return ProxyInfo(name, "127.0.0.1:2000", "127.0.0.1:3000", True)


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
    runner, api, t = _runner([ScheduledToxic("p", LATENCY, at=2, until=5), ScheduledToxic("q", RESET, at=3)])
    t.stop_after = 4  # waits for 2, 3 and 5; the 4th (holding q, which has no `until`) is the stop
    outcomes = runner.run()
    assert api.calls == [
        (2, "add", "p", "latency_downstream"),
        (3, "add", "q", "reset_peer_downstream"),
        (5, "remove", "p", "latency_downstream"),
        (5, "remove", "q", "reset_peer_downstream"),  # cleanup when the run stops
    ]
    assert all(o.ok for o in outcomes)
    assert [o.due_at - START for o in outcomes[:3]] == [2, 3, 5]


def test_a_toxic_without_until_stays_until_the_runner_is_stopped() -> None:
    # (It used to be removed as soon as the last step was done: a scenario's toxic without
    # `until`, "to the end", lasted a few milliseconds.)
    runner, api, t = _runner([ScheduledToxic("p", LATENCY, at=1)])
    t.stop_after = 5  # the wait for the add, then three minutes held, then the stop
    runner.run()
    assert api.calls == [(1, "add", "p", "latency_downstream"), (181, "remove", "p", "latency_downstream")]


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
    assert outcomes[0].outcome == "failed" and "404" in outcomes[0].detail
    assert outcomes[1].ok and not outcomes[1].called and outcomes[1].detail == "not added: nothing to remove"


def test_an_unanswered_add_is_removed_all_the_same() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=1, until=2)], fail_add=ToxiproxyTimeout("no answer within 10s")
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add", "remove"]
    assert outcomes[0].outcome == "timeout" and outcomes[0].unknown and not outcomes[0].ok
    assert outcomes[1].ok


def test_an_add_that_never_left_is_failed_and_not_removed() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=1, until=2)],
        fail_add=ToxiproxyUnreachable("cannot connect", maybe_done=False),
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add"]
    assert outcomes[0].outcome == "failed" and not outcomes[1].called


def test_a_toxic_already_gone_counts_as_removed() -> None:
    runner, _api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=0, until=1)], fail_remove=NotFoundError(404, "toxic not found")
    )
    outcomes = runner.run()
    assert all(o.ok for o in outcomes) and "already gone" in outcomes[1].detail


def test_an_unanswered_remove_is_retried_by_cleanup() -> None:
    runner, api, _t = _runner(
        [ScheduledToxic("p", LATENCY, at=0, until=1)], fail_remove=ToxiproxyUnreachable("connection reset")
    )
    outcomes = runner.run()
    assert [c[1] for c in api.calls] == ["add", "remove", "remove"]
    assert [o.outcome for o in outcomes] == ["ok", "unknown", "unknown"]


def test_toxicity_zero_is_refused_before_any_call() -> None:
    class Refusing(FakeApi):
        def add_toxic(self, proxy: str, toxic: ToxicSpec, *, timeout: float | None = None) -> None:
            raise ValueError("toxicity 0")

    t = FakeTime()
    runner = ToxicScheduleRunner(
        Refusing(t), [ScheduledToxic("p", LATENCY, at=0, until=1)], START, clock=t.clock, wait=t.wait
    )
    outcomes = runner.run()
    assert outcomes[0].outcome == "failed" and outcomes[1].detail == "not added: nothing to remove"


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


def test_the_api_timeout_outlasts_the_longest_toxic_wait() -> None:
    """A real Toxiproxy holds the DELETE of a waiting reset_peer until the reset fires."""
    reset_5s = make_toxic("reset_peer", timeout=5000)
    slow = make_toxic("latency", latency=3000, jitter=500)
    assert api_timeout_for([]) == API_TIMEOUT_BASE_S
    assert api_timeout_for([ScheduledToxic("p", LATENCY, at=0)]) == API_TIMEOUT_BASE_S + 0.1
    both = [ScheduledToxic("p", reset_5s, at=0, until=9), ScheduledToxic("p", slow, at=1)]
    assert api_timeout_for(both) == API_TIMEOUT_BASE_S + 5.0
    runner, api, _t = _runner(both)
    runner.run()
    assert api.timeouts and all(t == API_TIMEOUT_BASE_S + 5.0 for t in api.timeouts)
    assert all(t is not None and t > 5.0 + 5.0 for t in api.timeouts), "longer than wait + Toxiproxy's 5 s"


def test_every_call_is_logged_as_a_toxic_outcome(tmp_path: Path) -> None:
    seen: list[StepOutcome] = []
    t = FakeTime()
    api = FakeApi(t, fail_remove=ToxiproxyTimeout("no answer within 10.1s"))
    with NemesisLog(tmp_path / "nemesis.jsonl") as log:
        runner = ToxicScheduleRunner(
            api, [ScheduledToxic("p", LATENCY, at=1, until=2)], START, clock=t.clock, wait=t.wait,
            log=log, on_outcome=seen.append,
        )  # fmt: skip
        runner.run()
    records = read_toxic_outcomes(tmp_path / "nemesis.jsonl")
    assert [(r.action, r.outcome, r.toxic, r.kind, r.proxy) for r in records] == [
        ("add", "ok", "latency_downstream", "latency", "p"),
        ("remove", "timeout", "latency_downstream", "latency", "p"),
        ("remove", "timeout", "latency_downstream", "latency", "p"),  # cleanup tried again
    ]
    assert [r.t - START for r in records] == [1, 2, 2]
    assert records[0].detail == "" and "no answer" in records[1].detail
    assert [o.outcome for o in seen] == ["ok", "timeout", "timeout"]
    assert read_nemesis_log(tmp_path / "nemesis.jsonl") == [], "no change records unless asked"


def test_log_changes_writes_the_windows_a_real_toxiproxy_does_not(tmp_path: Path) -> None:
    t = FakeTime()
    api = FakeApi(t)
    with NemesisLog(tmp_path / "nemesis.jsonl") as log:
        ToxicScheduleRunner(
            api, [ScheduledToxic("p", LATENCY, at=1, until=4)], START, clock=t.clock, wait=t.wait,
            log=log, log_changes=True,
        ).run()  # fmt: skip
    changes = read_nemesis_log(tmp_path / "nemesis.jsonl")
    assert [(r.type, r.t - START, r.toxic, r.listen, r.upstream) for r in changes] == [
        ("toxic_added", 1, "latency_downstream", "127.0.0.1:2000", "127.0.0.1:3000"),
        ("toxic_removed", 4, "latency_downstream", "127.0.0.1:2000", "127.0.0.1:3000"),
    ]
    assert len(read_toxic_outcomes(tmp_path / "nemesis.jsonl")) == 2
    with pytest.raises(ValueError, match="needs a log"):
        ToxicScheduleRunner(api, [], START, log_changes=True)
