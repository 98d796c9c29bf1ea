"""One timer thread for every sync driver of a process.

A sync driver must run its core's timers (backoff, the reconnect budget, Retry-After,
silent streams) when they fall due. A thread per driver sleeping until then costs every
client a thread — under gevent a greenlet with its saved stack and its own frame stack,
about 10 KiB of a worker's memory per idle client (bench/bench_worker_capacity.py). The
clock keeps one heap of due times instead and wakes each driver when its time comes.

    clock.schedule(waker, delay)   wake `waker` (a `Wakeable`) in `delay` seconds or earlier
    Wakeable.on_clock()            runs in the clock's thread, outside the clock's lock

A waker asks again for its next wake-up from `on_clock` (the clock forgets it once woken).
Asking for a later time than the one pending changes nothing: a waker is woken at the
earliest time it asked for. Times are the monotonic clock's (a driver's sleeps always
were: a wall clock stepped back must not hold every timer). The clock holds its wakers
weakly: a driver its owner dropped (a Locust user that left) is not kept alive until
its next wake-up. The thread starts with the first request and ends when no waker is
waiting.
"""

from __future__ import annotations

import _thread
import heapq
import itertools
import logging
import threading
import time
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

YIELD_EVERY = 64
"""Wakers run between two yields of the clock's thread: under gevent a thousand clients due
at once must not hold the event loop (their reads wait meanwhile) for the whole batch."""


class Wakeable(Protocol):
    wake_at: float | None
    """When (monotonic) the clock will wake it; None: not waiting. Set by the clock only,
    under its lock."""

    def on_clock(self) -> None: ...


class Clock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, weakref.ref[Wakeable]]] = []
        self._order = itertools.count()
        self._changed = threading.Event()
        self._running = False

    def schedule(self, waker: Wakeable, delay: float) -> None:
        at = time.monotonic() + delay
        with self._lock:
            if waker.wake_at is not None and waker.wake_at <= at:
                return
            waker.wake_at = at
            heapq.heappush(self._heap, (at, next(self._order), weakref.ref(waker)))
            if not self._running:
                self._running = True
                # Not threading.Thread.start: it blocks until the thread runs, a switch at
                # which Locust can kill the caller half-way through what it was doing.
                _thread.start_new_thread(self._run, ())
            elif self._heap[0][0] == at:
                self._changed.set()  # earlier than what the thread sleeps for

    def _run(self) -> None:
        try:
            while self._round():
                pass
        except BaseException:
            with self._lock:
                self._running = False  # the next request starts a new thread
            raise

    def _round(self) -> bool:
        """Wake every waker due now, or sleep until the next is due. False: nothing waits."""
        with self._lock:
            now = time.monotonic()
            due = self._take_due(now)
            if not self._heap and not due:
                self._running = False  # under the lock: the next request starts a thread
                return False
            sleep = self._heap[0][0] - now if self._heap else 0.0
            self._changed.clear()
        if not due:
            self._changed.wait(sleep)
        for i, waker in enumerate(due, 1):
            try:
                waker.on_clock()
            except Exception:
                # One driver's failure must not stop every other driver's timers; it is
                # woken again when its core next says something.
                log.exception("timer of %r failed", waker)
            if i % YIELD_EVERY == 0:
                time.sleep(0)
        return True

    def _take_due(self, now: float) -> list[Wakeable]:
        due: list[Wakeable] = []
        while self._heap and self._heap[0][0] <= now:
            at, _, ref = heapq.heappop(self._heap)
            waker = ref()
            # Else gone, or a stale entry: it asked for an earlier time since.
            if waker is not None and waker.wake_at == at:
                waker.wake_at = None
                due.append(waker)
        return due


_clock: list[Clock] = []


def process_clock() -> Clock:
    """The process's clock, made on first use (so after gevent has patched `threading`)."""
    if not _clock:
        _clock.append(Clock())
    return _clock[0]
