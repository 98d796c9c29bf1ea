"""The toxics schedule: add and remove toxics on time, against any Toxiproxy API.

A schedule is a list of windows, each `(proxy, toxic, at, until)` in seconds after a
start time (`until` None: until the runner stops). `plan_steps` turns it into steps
(pure, validated); `ToxicScheduleRunner` carries them out with plain blocking calls — no
trio — either by itself (`run`, in a thread or the caller's own) or from the caller's
loop (`run_due` + `next_due`). The runner never acts early; when it is late it acts at
once, and each outcome records when the step was due and when it was done.

How failures are handled (Jepsen's "info": an unanswered call may or may not have acted):
- an add the API refused (4xx) is not removed later; an add that got no answer is;
- a remove that finds no toxic (404) counts as done;
- `stop()` (or the end of `run`) removes every toxic this runner added and still holds,
  so a stopped run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from lab.nemesis.client import NotFoundError, ToxiproxyError, ToxiproxyRejected
from lab.nemesis.toxics import ToxicSpec

_MAX_WAITS = 1000


class ToxicsApi(Protocol):
    """What the runner needs of a client (`lab.nemesis.client.ToxiproxyClient` has it)."""

    def add_toxic(self, proxy: str, toxic: ToxicSpec) -> None: ...

    def remove_toxic(self, proxy: str, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ScheduledToxic:
    """One window: `toxic` is on `proxy` from `at` to `until` seconds after the start."""

    proxy: str
    toxic: ToxicSpec
    at: float
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One action, `offset` seconds after the start. `window` indexes the entry it came from."""

    offset: float
    action: Literal["add", "remove"]
    proxy: str
    toxic: ToxicSpec
    window: int


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What became of a step. Times are Unix epoch seconds; `ok` False with `unknown` True
    means no answer came (the change may have happened)."""

    step: Step
    due_at: float
    done_at: float
    ok: bool
    unknown: bool = False
    error: str | None = None


def plan_steps(entries: Sequence[ScheduledToxic]) -> list[Step]:
    """The steps of a schedule in time order (at equal times removes come first, so a
    window may start where another of the same toxic ends). ValueError names the entry."""
    steps: list[Step] = []
    for i, e in enumerate(entries):
        where = f"schedule entry {i} ({e.proxy}/{e.toxic.name})"
        if not e.at >= 0:
            raise ValueError(f"{where}: at must be >= 0 seconds, got {e.at}")
        if e.until is not None and not e.until > e.at:
            raise ValueError(f"{where}: until ({e.until}) must be after at ({e.at})")
        steps.append(Step(e.at, "add", e.proxy, e.toxic, i))
        if e.until is not None:
            steps.append(Step(e.until, "remove", e.proxy, e.toxic, i))
    by_toxic: dict[tuple[str, str], list[ScheduledToxic]] = {}
    for e in entries:
        by_toxic.setdefault((e.proxy, e.toxic.name), []).append(e)
    for (proxy, name), windows in by_toxic.items():
        windows.sort(key=lambda w: w.at)
        for before, after in itertools.pairwise(windows):
            if before.until is None or before.until > after.at:
                raise ValueError(
                    f"schedule: toxic {name!r} on proxy {proxy!r} has overlapping windows "
                    f"(one from {before.at}s to {before.until}, the next from {after.at}s); a name exists once at a time"
                )
    steps.sort(key=lambda s: (s.offset, s.action != "remove", s.window))
    return steps


class ToxicScheduleRunner:
    """Carries out a schedule against one API, relative to `start` (Unix epoch seconds).

    `clock` gives the epoch time and `wait(seconds)` sleeps, returning True if the runner
    was stopped meanwhile; both default to real time (tests pass fakes).
    """

    def __init__(
        self,
        api: ToxicsApi,
        entries: Sequence[ScheduledToxic],
        start: float,
        *,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self.steps = plan_steps(entries)
        self.start = start
        self.outcomes: list[StepOutcome] = []
        self._api = api
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._next = 0
        self._held: dict[int, Step] = {}  # window -> its add step, while the toxic may be in place
        self._lock = threading.Lock()

    def next_due(self) -> float | None:
        """Epoch time of the next step, or None when all are done."""
        with self._lock:
            return self.start + self.steps[self._next].offset if self._next < len(self.steps) else None

    def run_due(self) -> list[StepOutcome]:
        """Carry out every step whose time has come; the outcomes of those steps."""
        done: list[StepOutcome] = []
        with self._lock:
            while self._next < len(self.steps):  # bounded by the number of steps
                step = self.steps[self._next]
                if self.start + step.offset > self._clock():
                    break
                self._next += 1
                done.append(self._carry_out(step))
        return done

    def run(self) -> list[StepOutcome]:
        """Carry out the whole schedule, then `cleanup()`; returns early when stopped.
        Every outcome (cleanup's too) is in `outcomes`."""
        for _ in range(len(self.steps)):  # each pass carries out one step or more
            due = self.next_due()
            if due is None:
                break
            if self._wait_until(due):
                break
            self.run_due()
        self.cleanup()
        return list(self.outcomes)

    def _wait_until(self, due: float) -> bool:
        """Wait until `due`; True if stopped. A wait may end a little early (the wait's
        clock is not the epoch clock), hence a few more."""
        for _ in range(_MAX_WAITS):
            remaining = due - self._clock()
            if remaining <= 0:
                return False
            if self._wait(remaining):
                return True
        return False

    def stop(self) -> None:
        """Ask `run` to stop (it then cleans up). Thread-safe."""
        self._stop.set()

    def cleanup(self) -> list[StepOutcome]:
        """Remove every toxic this runner added and may still hold."""
        with self._lock:
            self._next = len(self.steps)
            held = sorted(self._held.values(), key=lambda s: s.window)
            return [self._carry_out(Step(s.offset, "remove", s.proxy, s.toxic, s.window)) for s in held]

    def _carry_out(self, step: Step) -> StepOutcome:
        due = self.start + step.offset
        unknown = False
        error: str | None = None
        try:
            if step.action == "add":
                self._held[step.window] = step
                self._api.add_toxic(step.proxy, step.toxic)
            else:
                if step.window not in self._held:
                    outcome = StepOutcome(
                        step, due, self._clock(), True, error="not added: nothing to remove"
                    )
                    self.outcomes.append(outcome)
                    return outcome
                with contextlib.suppress(NotFoundError):  # already gone: what the step wanted
                    self._api.remove_toxic(step.proxy, step.toxic.name)
                del self._held[step.window]
        except ToxiproxyRejected as exc:
            error = str(exc)
            if step.action == "add":
                del self._held[step.window]  # refused: it is not there
        except ToxiproxyError as exc:  # no answer: the add may have happened; keep it held
            error, unknown = str(exc), True
        except ValueError as exc:  # refused before any call (e.g. toxicity 0)
            error = str(exc)
            self._held.pop(step.window, None)
        outcome = StepOutcome(step, due, self._clock(), error is None, unknown, error)
        self.outcomes.append(outcome)
        return outcome
