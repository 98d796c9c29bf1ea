"""The process clock that runs every sync driver's timers: real threads, no I/O.

Times are generous (a shared 2-core machine): what is checked is order, that an earlier
request wins over a later one, and that nothing is woken that should not be.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref

import pytest

from lab.drivers.clock import Clock


class Waker:
    def __init__(
        self, name: str, woken: list[tuple[str, float]], done: threading.Event | None = None
    ) -> None:
        self.name = name
        self.wake_at: float | None = None
        self.woken = woken
        self.done = done

    def on_clock(self) -> None:
        self.woken.append((self.name, time.monotonic()))
        if self.done is not None:
            self.done.set()


def test_wakes_each_waker_at_its_time_in_order() -> None:
    clock, done = Clock(), threading.Event()
    woken: list[tuple[str, float]] = []
    late, early = Waker("late", woken, done), Waker("early", woken)
    t0 = time.monotonic()
    clock.schedule(late, 0.3)
    clock.schedule(early, 0.05)
    assert done.wait(5)
    assert [name for name, _ in woken] == ["early", "late"]
    assert woken[0][1] - t0 >= 0.05 and woken[1][1] - t0 >= 0.3
    assert late.wake_at is None and early.wake_at is None  # woken: forgotten


def test_an_earlier_request_wins_and_a_later_one_changes_nothing() -> None:
    clock = Clock()
    woken: list[tuple[str, float]] = []
    first, second = threading.Event(), threading.Event()
    a = Waker("a", woken, first)
    t0 = time.monotonic()
    clock.schedule(a, 60.0)
    clock.schedule(a, 0.05)  # earlier: wins
    assert first.wait(5)
    assert woken[0][1] - t0 < 30
    a.done = second
    clock.schedule(a, 0.05)
    clock.schedule(a, 60.0)  # later: ignored
    assert second.wait(5)
    time.sleep(0.2)
    assert [name for name, _ in woken] == ["a", "a"]  # each request woke it once, stale entries never


def test_a_waker_that_asks_again_from_on_clock_is_woken_again() -> None:
    clock, done = Clock(), threading.Event()
    count = [0]

    class Ticker:
        wake_at: float | None = None

        def on_clock(self) -> None:
            count[0] += 1
            if count[0] < 3:
                clock.schedule(self, 0.01)
            else:
                done.set()

    ticker = Ticker()
    clock.schedule(ticker, 0.0)
    assert done.wait(5)
    assert count[0] == 3


def test_a_failing_waker_is_logged_and_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    clock, done = Clock(), threading.Event()
    woken: list[tuple[str, float]] = []

    class Broken:
        wake_at: float | None = None

        def on_clock(self) -> None:
            raise RuntimeError("broken timer")

    broken, ok = Broken(), Waker("ok", woken, done)
    with caplog.at_level(logging.ERROR, logger="lab.drivers.clock"):
        clock.schedule(broken, 0.0)
        clock.schedule(ok, 0.1)
        assert done.wait(5)
    assert woken[0][0] == "ok"
    assert any("failed" in r.message and r.exc_info for r in caplog.records)
    # The thread survived: a new request is served.
    again = threading.Event()
    ok.done = again
    clock.schedule(ok, 0.0)
    assert again.wait(5)


def test_the_clock_does_not_keep_a_dropped_waker_alive() -> None:
    clock, done = Clock(), threading.Event()
    woken: list[tuple[str, float]] = []
    dropped, kept = Waker("dropped", woken), Waker("kept", woken, done)
    ref = weakref.ref(dropped)
    clock.schedule(dropped, 0.1)
    clock.schedule(kept, 0.3)
    del dropped
    gc.collect()
    assert ref() is None  # a driver its owner let go is not held until its next wake-up
    assert done.wait(5)
    assert [name for name, _ in woken] == ["kept"]


def test_the_thread_ends_when_nothing_waits_and_a_new_request_starts_one() -> None:
    clock = Clock()
    woken: list[tuple[str, float]] = []
    for n in range(2):
        done = threading.Event()
        waker = Waker(f"w{n}", woken, done)
        clock.schedule(waker, 0.0)
        assert done.wait(5)
        deadline = time.monotonic() + 5
        while clock._running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not clock._running  # nothing waits: the thread is gone
    assert [name for name, _ in woken] == ["w0", "w1"]
