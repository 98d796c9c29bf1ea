"""What a run keeps an eye on while the load goes: its nemesis and its traffic.

- **Toxic outcomes.** Every add and remove of a scheduled toxic ends `ok`, `failed`
  (the API refused it), `timeout` or `unknown` (no answer: it may or may not have
  happened). They are read from `nemesis.jsonl` (`toxic_outcome` records) or, where the
  log has none, taken from the schedule runner itself; all go into run.json
  (`toxic_outcomes`). A removal that did not end `ok` leaves a toxic in place that the
  scenario meant to end: the run is then incomplete ("toxic removal failed").
- **Real fault windows.** `fault_windows` says when each toxic was really added and
  removed, or that it never was removed (`ended: false`, `end` = the end of the run).
- **Stalls.** No event sent by the server (tap) and no call completed OK for
  `stall_after` seconds while clients are active ends the run as incomplete
  ("traffic stalled"), naming what was in place then and which of the lab's own processes
  were at their limits meanwhile (CPU, file descriptors: `processes.jsonl`, when `lab run`
  wrote one), so a chain that choked on itself is not taken for a target that stopped.
  Failed or timed-out calls are not progress: a target that stopped answering fails calls
  until the clients give up. Scripted clients waiting for their next `at` are not
  active: a script's pause is not a stall.
- **Scripts done.** A scenario of scripted clients (`[[load.clients]]`) ends, complete,
  once progress.json says every one of them played its script to the end and left
  (`scripted_done`, counted by the workers: lab/load/scripted.py): end reason
  `scripts_done`. A run whose duration runs out first ends incomplete, saying how many
  finished (`shape_not_reached`).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lab.load.overload import LATE_S, OVERLOAD_S
from lab.run.progress import JsonLines, NemesisCounter, ProgressLine, TapCounter, read_progress
from lab.scenario import Scenario
from lab.scenario.size import peak_clients

if TYPE_CHECKING:  # prometheus_client loads only for a run that serves metrics
    from lab.run.metrics import Snapshot

OUTCOMES: Final = ("ok", "failed", "timeout", "unknown")
SCRIPTS_DONE: Final = "scripts_done"
"""The end reason of a run whose scripted clients all played their scripts to the end."""


def outcome_record(
    *, t: float, proxy: str, toxic: str, kind: str, action: str, ok: bool, unknown: bool, error: str | None
) -> dict[str, Any]:
    """A `toxic_outcome` record (the nemesis log's shape) from a schedule step's outcome."""
    if ok:
        outcome = "ok"
    elif unknown:
        outcome = "timeout" if error and "timed out" in error.lower() else "unknown"
    else:
        outcome = "failed"
    return {
        "type": "toxic_outcome",
        "t": t,
        "proxy": proxy,
        "toxic": toxic,
        "kind": kind,
        "action": action,
        "outcome": outcome,
        "detail": error or "",
    }


def runner_outcomes(runner: Any) -> list[dict[str, Any]]:
    """`toxic_outcome` records of a `lab.nemesis.schedule.ToxicScheduleRunner`'s outcomes
    (a runner whose outcomes name themselves, `outcome` and `detail`, or older ones that
    say `ok`, `unknown` and `error`)."""
    out = []
    for o in list(runner.outcomes):
        if not getattr(o, "called", True):
            continue  # a remove skipped because its add never happened: no call, no outcome
        detail = getattr(o, "detail", None) or getattr(o, "error", None) or None
        rec = outcome_record(
            t=o.done_at,
            proxy=o.step.proxy,
            toxic=o.step.toxic.name,
            kind=o.step.toxic.kind,
            action=o.step.action,
            ok=o.ok,
            unknown=o.unknown,
            error=detail,
        )
        named = getattr(o, "outcome", None)
        if named in OUTCOMES:
            rec["outcome"] = named
        out.append(rec)
    return out


@dataclass
class ToxicOutcomes:
    """The outcomes seen so far, from the nemesis log and (where it has none) the runner."""

    log: JsonLines
    from_log: list[dict[str, Any]] = field(default_factory=list)
    runner: Any = None

    def update(self) -> None:
        self.from_log += [r for r in self.log.new_records() if r.get("type") == "toxic_outcome"]

    @property
    def records(self) -> list[dict[str, Any]]:
        if self.from_log or self.runner is None:
            return list(self.from_log)
        return runner_outcomes(self.runner)

    def failed_removal(self) -> dict[str, Any] | None:
        """The first removal that did not end ok (a toxic the scenario ended is still there)."""
        return next(
            (r for r in self.records if r.get("action") == "remove" and r.get("outcome") != "ok"), None
        )

    def in_place(self) -> list[str]:
        """Toxics added (or maybe added) and not removed OK since: `name (kind)`."""
        held: dict[str, str] = {}
        for r in self.records:
            name = str(r.get("toxic"))
            if r.get("action") == "add" and r.get("outcome") != "failed":
                held[name] = str(r.get("kind"))
            elif r.get("action") == "remove" and r.get("outcome") == "ok":
                held.pop(name, None)
        return [f"{n} ({k})" for n, k in sorted(held.items())]


def describe_outcome(r: dict[str, Any]) -> str:
    detail = f": {r['detail']}" if r.get("detail") else ""
    return f"{r.get('action')} of toxic {r.get('toxic')} ({r.get('kind')}) on proxy {r.get('proxy')} {r.get('outcome')}{detail}"


def real_fault_windows(
    planned: list[dict[str, Any]], outcomes: list[dict[str, Any]], stopped_at: float | None
) -> list[dict[str, Any]]:
    """run.json `fault_windows`: the planned windows, each toxic's with when it was really
    added and removed. A toxic whose removal never succeeded has `ended: false` and
    `end` = the end of the run (it was in place until then, at least)."""
    out = []
    for w in planned:
        if not str(w.get("fault", "")).startswith("toxic:"):
            out.append(w)
            continue
        mine = [r for r in outcomes if r.get("toxic") == w.get("rule")]
        added = next((r for r in mine if r.get("action") == "add"), None)
        removed = next((r for r in mine if r.get("action") == "remove"), None)
        entry = {**w, "planned_start": w["start"], "planned_end": w["end"]}
        if added is None:
            entry.update(added="never", ended=True)  # nothing was put in place
        else:
            entry.update(start=added["t"], added=added.get("outcome"))
            if removed is not None and removed.get("outcome") == "ok":
                entry.update(end=removed["t"], removal="ok", ended=True)
            else:
                end = stopped_at if stopped_at is not None else w["end"]
                entry.update(
                    end=max(end, added["t"]),
                    removal=removed.get("outcome") if removed else "never attempted",
                    ended=False,
                )
        out.append(entry)
    return out


@dataclass
class StallDetector:
    """Traffic has stalled when neither the events the server sent nor the calls completed
    OK moved for `after` seconds while clients were active."""

    after: float
    _events: int = -1
    _calls: int = -1
    _since: float | None = None

    def observe(self, now: float, *, events: int, calls_ok: int, clients: int) -> float | None:
        """Seconds without progress when that reaches the bound (a stall), else None."""
        moved = events != self._events or calls_ok != self._calls
        self._events, self._calls = events, calls_ok
        if clients <= 0 or moved or self._since is None:
            self._since = now
            return None
        idle = now - self._since
        return idle if idle >= self.after else None


def active_windows(windows: list[dict[str, Any]], now: float) -> list[str]:
    """The faults whose planned window holds `now`: `kind (rule)`."""
    return [
        f"{w.get('fault')} ({w.get('rule')})"
        for w in windows
        if isinstance(w.get("start"), int | float) and w["start"] <= now <= w.get("end", now)
    ]


STALL_LOOKBACK_S: Final = 30.0
"""A stall's quiet seconds and this many before them are searched for the lab's limits: a
proxy that ran out of descriptors just before the traffic stopped is the likely cause."""


def lab_limits(run_dir: Path, start: float, end: float) -> list[str]:
    """What the checker would call saturated among the lab's processes (and the box) in
    [start, end), from the run's `processes.jsonl`, one phrase each; [] without the file
    (compose) or when nothing was."""
    from lab.checker import saturation_phrases  # pandas: loaded only when a run stalls

    return saturation_phrases(run_dir, start, end)


class Watcher:
    """One look a second at a running run's files: prints the progress line and says when
    the run must end on its own account (event target reached, a toxic removal failed,
    traffic stalled). `lab run` adds what only it knows (its processes, signals); compose's
    `lab watch` uses it as it is."""

    def __init__(self, run_dir: Path, scenario: Scenario, run_start: float, outcomes: ToxicOutcomes) -> None:
        self.run_dir = run_dir
        self.sc = scenario
        self.outcomes = outcomes
        self.tap = TapCounter(run_dir / "proxy" / "tap.jsonl")
        self.nemesis = NemesisCounter(run_dir / "nemesis.jsonl")
        self.line = ProgressLine(
            scenario.reconnect.budget_qps,
            scenario.horizon,
            scenario.load.event_target,
            phases=tuple((p.name, p.kind, p.start, p.end) for p in scenario.phases),
        )
        self.stall = StallDetector(scenario.load.stall_timeout)
        self.windows = scenario.fault_windows(run_start)
        self.run_start = run_start
        self.progress: dict[str, Any] = {}
        """progress.json as last read (the Locust master's sums)."""
        self.peak_users = 0
        """The most clients running at once, as progress.json said them."""
        self.planned_users = peak_clients(scenario)
        """The most the load shape asks for (load.users, or a phase's)."""
        self.users_seen = False
        """Whether progress.json ever said how many clients ran (it may never, e.g. when a
        watcher runs without the Locust master's sums): unknown is not "not reached"."""
        self.scripted = len(scenario.load.clients)
        """Scripted clients the scenario lists (0: the task mix)."""

    def snapshot(self, now: float) -> Snapshot:
        """The counters of the last `tick`, for `lab run --metrics-port`."""
        from lab.run.metrics import snapshot

        faults = dict(self.tap.faults)
        if self.nemesis.toxics:
            faults["toxic"] = self.nemesis.toxics
        return snapshot(
            self.run_dir.name,
            now - self.run_start,
            self.progress,
            events=self.tap.events,
            reconnects=self.line.reconnects,
            reconnect_peak=self.line.reconnect_peak,
            faults=faults,
        )

    def shape_not_reached(self) -> str | None:
        """For a run whose duration is over: why it is not complete when its load shape never
        ran (fewer clients than it asks for ever ran at once: the box could not start them,
        e.g. 21,000 of 50,000), else None. A run that ends on its event target, or a ramp
        stopped at its knee, is complete whatever it reached: it ended by design.

        Scripted clients come and go when their scripts say, so how many ran at once says
        nothing of them: their load ran whole when every script was played to the end."""
        if self.scripted:
            done = int(self.progress.get("scripted_done", 0))
            if not self.users_seen or done >= self.scripted:
                return None
            started = int(self.progress.get("scripted_started", 0))
            return (
                f"scripts not finished: {done:,} of the {self.scripted:,} scripted clients played their "
                f"script to the end ({started:,} started) before the run's duration ran out"
            )
        if not self.users_seen or self.peak_users >= self.planned_users:
            return None
        return (
            f"load shape not reached: at most {self.peak_users:,} of the {self.planned_users:,} clients "
            "it asks for ran at once (the box could not start them in time: see the lab's processes)"
        )

    def scripts_done(self, progress: dict[str, Any] | None = None) -> bool:
        """Whether every scripted client has played its script (progress.json, read
        afresh unless given)."""
        if not self.scripted:
            return False
        if progress is None:
            progress = read_progress(self.run_dir / "progress.json")
        return int(progress.get("scripted_done", 0)) >= self.scripted

    def tick(self, now: float) -> tuple[str, str | None, bool]:
        """(progress line, end reason or None, complete)."""
        self.tap.update()
        self.nemesis.update()
        self.outcomes.update()
        progress = self.progress = read_progress(self.run_dir / "progress.json")
        text = self.line.render(now - self.run_start, now, progress, self.tap, self.nemesis.toxics)
        failed = self.outcomes.failed_removal()
        if failed is not None:
            return text, f"toxic removal failed: {describe_outcome(failed)}", False
        overloaded = int(progress.get("overloaded", 0))
        if overloaded:
            rate = int(progress.get("overload_events_per_s", 0))
            return (
                text,
                f"limited by the lab: {overloaded} Locust worker(s) could not keep up with the target "
                f"(their loop {LATE_S:g} s late or more at a full core for {OVERLOAD_S:g} s, accepting "
                f"{rate:,} events/s): the target sends faster than the lab's workers can read; "
                "give the run more workers (--workers) or fewer clients",
                False,
            )
        users = int(progress.get("users", 0))
        if "users" in progress:
            self.users_seen = True
        self.peak_users = max(self.peak_users, users)
        # A scripted client waiting for its next `at` is doing what its script says.
        working = users - int(progress.get("scripted_idle", 0))
        idle = self.stall.observe(
            now, events=self.tap.events, calls_ok=int(progress.get("calls_ok", 0)), clients=working
        )
        if idle is not None:
            active = self.outcomes.in_place() + [
                w for w in active_windows(self.windows, now) if not w.startswith("toxic:")
            ]
            limits = lab_limits(self.run_dir, now - idle - STALL_LOOKBACK_S, now)
            return (
                text,
                f"traffic stalled: no event sent and no call completed for {idle:.0f}s with {working} clients "
                f"active; in place then: {', '.join(active) or 'no toxic, no fault window'}"
                + (
                    f"; the lab's own processes at their limits meanwhile: {'; '.join(limits)}"
                    if limits
                    else ""
                ),
                False,
            )
        target = self.sc.load.event_target
        if target is not None and self.tap.events >= target:
            return text, "event_target", True
        if self.scripts_done(progress):
            return text, SCRIPTS_DONE, True
        return text, None, False


@dataclass
class RunningSchedule:
    """A toxics schedule carried out by a `ToxicScheduleRunner` in a thread of its own."""

    runner: Any
    thread: threading.Thread

    def stop(self) -> None:
        """Stop it; its thread removes every toxic it put in place (each removal waits at
        most the runner's API timeout, a step in flight one more), then ends."""
        self.runner.stop()
        api_timeout = float(getattr(self.runner, "api_timeout", 5.0))
        self.thread.join(timeout=2 * api_timeout + 5)


def start_schedule(
    scenario: Scenario, api: Any, proxy: str, run_start: float, log: Path
) -> RunningSchedule | None:
    """Start the scenario's toxics schedule on `proxy` through `api` (a Toxiproxy client);
    None when the scenario has no toxics. A runner that can log writes its outcomes into
    `log` (the run's nemesis.jsonl) as `toxic_outcome` records."""
    schedule = scenario.toxics_schedule()
    if not schedule:
        return None
    from lab.nemesis.log import NemesisLog
    from lab.nemesis.schedule import ScheduledToxic, ToxicScheduleRunner
    from lab.nemesis.toxics import make_toxic

    entries = [
        ScheduledToxic(
            proxy,
            make_toxic(
                t["kind"], stream=t["stream"], name=t["name"], toxicity=t["toxicity"], **t["attributes"]
            ),
            float(t["at"]),
            None if t["until"] is None else float(t["until"]),
        )
        for t in schedule
    ]
    extra: dict[str, Any] = {}
    if "log" in inspect.signature(ToxicScheduleRunner).parameters:
        # Outcomes only: the toxics themselves are logged by the embedded nemesis, or by
        # the client that drives a real Toxiproxy.
        extra["log"] = NemesisLog(log)
    runner = ToxicScheduleRunner(api, entries, run_start, **extra)
    thread = threading.Thread(target=runner.run, name="toxics", daemon=True)
    thread.start()
    return RunningSchedule(runner, thread)


@dataclass
class LoadStopped:
    """The load was stopped without Locust quitting (the web UI's STOP, or the end of the
    load shape with the UI open): clients were active, and none has been for `after`
    seconds while the master still runs."""

    after: float = 3.0
    _seen: bool = False
    _since: float | None = None

    def observe(self, now: float, clients: int) -> bool:
        if clients > 0:
            self._seen, self._since = True, None
            return False
        if not self._seen:
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= self.after
