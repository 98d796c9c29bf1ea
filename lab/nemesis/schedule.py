"""The toxics schedule: add and remove toxics on time, against any Toxiproxy API.

A schedule is a list of windows, each `(proxy, toxic, at, until)` in seconds after a
start time (`until` None: until the runner stops). `plan_steps` turns it into steps
(pure, validated); `ToxicScheduleRunner` carries them out with plain blocking calls — no
trio — either by itself (`run`, in a thread or the caller's own) or from the caller's
loop (`run_due` + `next_due`). The runner never acts early; when it is late it acts at
once, and each outcome records when the step was due and when it was done.

Every call it makes ends in one of four outcomes (Jepsen's "info": an unanswered call may
or may not have acted), kept in `outcomes`, handed to `on_outcome`, and written to the
nemesis log as a `toxic_outcome` record when the runner has a `log`:
- `ok`: the API confirmed it; a remove that finds no toxic (404) is ok too (it is gone);
- `failed`: the API refused it (4xx/5xx), the client refused it before any call (e.g.
  toxicity 0), or no connection could be made: the change did not happen. A refused add
  is not removed later;
- `timeout`: sent, no answer within the API timeout; `unknown`: sent, the connection broke
  or the answer was unreadable. The change may have happened: an add is still removed at
  its time, and a remove is tried again when the runner stops.
`stop()` (or the end of `run`) removes every toxic this runner added and may still hold.

**API timeout.** A real Toxiproxy answers a DELETE only once the toxic lets go: a
`reset_peer` that has started its wait holds the removal until the reset fires. The
runner's calls therefore wait `api_timeout_for(entries)`: `API_TIMEOUT_BASE_S` (twice
Toxiproxy's own 5 s write timeout) plus the longest wait any toxic of the schedule can
make, so a removal that succeeds is never mistaken for one that hung.

**Logging.** With `log`, the runner writes a `toxic_outcome` per call. With
`log_changes=True` it also writes the `toxic_added` / `toxic_removed` records itself, as
the embedded nemesis does, for a real Toxiproxy that keeps no such log (`lab prepare`).
Never set `log_changes` against the embedded nemesis, nor with a client that logs.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from lab.nemesis.client import (
    NotFoundError,
    ProxyInfo,
    ToxiproxyError,
    ToxiproxyRejected,
    ToxiproxyTimeout,
    ToxiproxyUnreachable,
)
from lab.nemesis.log import NemesisLog, NemesisRecord, OutcomeRecord, toxic_record
from lab.nemesis.toxics import ToxicSpec

_MAX_WAITS: Final = 1000
_OPEN_WAIT_S: Final = 60.0
_MAX_OPEN_WAITS: Final = 100_000
"""How long `run` holds an open-ended toxic before it gives up waiting for `stop()`
(about 69 days: longer than any run's hard timeout)."""
API_TIMEOUT_BASE_S: Final = 10.0
"""The API timeout of a schedule whose toxics never wait: twice Toxiproxy's own 5 s write
timeout, which a removal may spend flushing a toxic's buffer."""

type Outcome = Literal["ok", "failed", "timeout", "unknown"]


class ToxicsApi(Protocol):
    """What the runner needs of a client (`lab.nemesis.client.ToxiproxyClient` has it)."""

    def add_toxic(self, proxy: str, toxic: ToxicSpec, *, timeout: float | None = None) -> None: ...

    def remove_toxic(self, proxy: str, name: str, *, timeout: float | None = None) -> None: ...

    def get_proxy(self, name: str, *, timeout: float | None = None) -> ProxyInfo | None: ...


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
    """What became of a step (module docstring). Times are Unix epoch seconds; `detail`
    says why in words ("" for a plain ok); `called` is False for a remove skipped because
    its add never happened (no API call, no log record)."""

    step: Step
    due_at: float
    done_at: float
    outcome: Outcome
    detail: str = ""
    called: bool = True

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def unknown(self) -> bool:
        """No answer came: the change may or may not have happened."""
        return self.outcome in ("timeout", "unknown")


def longest_wait_s(toxic: ToxicSpec) -> float:
    """The longest a real Toxiproxy may hold an API call on this toxic (seconds): the wait
    its Pipe makes without listening for an interruption, or a delay it flushes through."""
    a = toxic.attributes
    match toxic.kind:
        case "latency":
            return (a.get("latency", 0) + a.get("jitter", 0)) / 1000
        case "timeout" | "reset_peer":
            return a.get("timeout", 0) / 1000
        case "slow_close":
            return a.get("delay", 0) / 1000
        case "slicer":
            return a.get("delay", 0) / 1_000_000
    return 0.0


def api_timeout_for(entries: Sequence[ScheduledToxic]) -> float:
    """The API timeout for a schedule: `API_TIMEOUT_BASE_S` + its toxics' longest wait."""
    return API_TIMEOUT_BASE_S + max((longest_wait_s(e.toxic) for e in entries), default=0.0)


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
    was stopped meanwhile; both default to real time (tests pass fakes). `api_timeout`
    defaults to `api_timeout_for(entries)`. `on_outcome` is called (in the runner's
    thread) after every step, with its outcome.
    """

    def __init__(
        self,
        api: ToxicsApi,
        entries: Sequence[ScheduledToxic],
        start: float,
        *,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], bool] | None = None,
        api_timeout: float | None = None,
        log: NemesisLog | None = None,
        log_changes: bool = False,
        on_outcome: Callable[[StepOutcome], None] | None = None,
    ) -> None:
        self.steps = plan_steps(entries)
        self.start = start
        self.api_timeout = api_timeout_for(entries) if api_timeout is None else api_timeout
        if not self.api_timeout > 0:
            raise ValueError(f"api_timeout must be > 0 seconds, got {self.api_timeout}")
        if log_changes and log is None:
            raise ValueError("log_changes needs a log")
        self.outcomes: list[StepOutcome] = []
        self._api = api
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._log = log
        self._log_changes = log_changes
        self._on_outcome = on_outcome
        self._endpoints: dict[str, tuple[str, str]] = {}  # proxy -> (listen, upstream), for change records
        self._next = 0
        self._held: dict[int, Step] = {}  # window -> its add step, while the toxic may be in place
        self._logged: set[int] = set()  # windows whose toxic_added this runner wrote
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
        A toxic without `until` stays until the runner is stopped. Every outcome
        (cleanup's too) is in `outcomes`."""
        stopped = False
        for _ in range(len(self.steps)):  # each pass carries out one step or more
            due = self.next_due()
            if due is None:
                break
            if self._wait_until(due):
                stopped = True
                break
            self.run_due()
        removed = {s.window for s in self.steps if s.action == "remove"}
        if not stopped and any(s.window not in removed for s in self.steps):
            # A toxic without `until` lasts until the runner is stopped (the run's end).
            for _ in range(_MAX_OPEN_WAITS):
                if self._wait(_OPEN_WAIT_S):
                    break
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
        if step.action == "remove" and step.window not in self._held:
            return self._record(
                StepOutcome(step, due, self._clock(), "ok", "not added: nothing to remove", False)
            )
        if self._log_changes:
            self._learn_endpoints(step.proxy)
        outcome: Outcome = "ok"
        detail = ""
        try:
            if step.action == "add":
                self._held[step.window] = step
                self._api.add_toxic(step.proxy, step.toxic, timeout=self.api_timeout)
            else:
                try:
                    self._api.remove_toxic(step.proxy, step.toxic.name, timeout=self.api_timeout)
                except NotFoundError as exc:  # already gone: what the step wanted
                    detail = f"already gone ({exc})"
                del self._held[step.window]
        except ToxiproxyRejected as exc:
            outcome, detail = "failed", str(exc)
            if step.action == "add":
                del self._held[step.window]  # refused: it is not there
        except ToxiproxyTimeout as exc:  # sent, no answer: it may have happened; keep it held
            outcome, detail = "timeout", str(exc)
        except ToxiproxyUnreachable as exc:
            if exc.maybe_done:
                outcome, detail = "unknown", str(exc)
            else:  # never sent: it did not happen
                outcome, detail = "failed", str(exc)
                if step.action == "add":
                    del self._held[step.window]
        except ToxiproxyError as exc:
            outcome, detail = "unknown", str(exc)
        except ValueError as exc:  # refused before any call (e.g. toxicity 0)
            outcome, detail = "failed", str(exc)
            if step.action == "add":
                self._held.pop(step.window, None)
        done_at = self._clock()
        if outcome == "ok" and self._log_changes:
            self._log_change(step, done_at)
        return self._record(StepOutcome(step, due, done_at, outcome, detail))

    def _record(self, outcome: StepOutcome) -> StepOutcome:
        self.outcomes.append(outcome)
        if outcome.called:
            step = outcome.step
            self._write(
                OutcomeRecord(
                    outcome.done_at,
                    step.proxy,
                    step.toxic.name,
                    step.toxic.kind,
                    step.action,
                    outcome.outcome,
                    outcome.detail,
                )
            )
        if self._on_outcome is not None:
            self._on_outcome(outcome)
        return outcome

    def _log_change(self, step: Step, t: float) -> None:
        """A `toxic_added` for a confirmed add; a `toxic_removed` for a confirmed remove of
        a toxic whose add was logged (an add that timed out has no window to close: its
        outcome records tell what is known)."""
        listen, upstream = self._endpoints.get(step.proxy, ("", ""))
        if step.action == "add":
            self._logged.add(step.window)
            self._write(toxic_record("toxic_added", step.proxy, listen, upstream, step.toxic, t))
        elif step.window in self._logged:
            self._logged.discard(step.window)
            self._write(toxic_record("toxic_removed", step.proxy, listen, upstream, step.toxic, t))

    def _learn_endpoints(self, proxy: str) -> None:
        """The proxy's listen and upstream addresses, for change records (asked once)."""
        if proxy in self._endpoints:
            return
        info: ProxyInfo | None = None
        with contextlib.suppress(ToxiproxyError):
            info = self._api.get_proxy(proxy, timeout=self.api_timeout)
        if info is not None:
            self._endpoints[proxy] = (info.listen, info.upstream)

    def _write(self, record: NemesisRecord | OutcomeRecord) -> None:
        if self._log is not None:
            self._log.write(record)
