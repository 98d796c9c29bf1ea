"""The phases of a run that act while it goes on: the server's knobs, the rollout probe,
and a ramp that stops itself one step past its knee.

- **Knobs.** A phase's `[phases.server]` knobs (docs/scenarios.md) are set through the
  reference server's admin control (`POST /lab-admin/knobs`) when the phase begins; the
  first phase's are in the server's settings from its start (`initial_knobs`).
- **The rollout probe** (`lab.run.probe`), when a phase sets `rollback`: a few sessions
  opened before it that come back to their old cursors after it, and again once their
  sessions have been idle past the TTL.
- **Until the knee** (`load.until_knee`): at the end of each ramp step the step's
  budget criteria are measured from the live client ledgers with the checker's own pure
  functions (`lab.checker.measure_frames`, `lab.checker.step_misses`);
  the first step that breaks one ends the run (complete, `end_reason` "past the knee:
  ..."). Gates 1–4 are not evaluated live (the report still judges them per step).

Everything it does is written to `phases.jsonl` (`mcpLabPhases.v1`, docs/ledgers.md).
A failure here (an admin call refused, a probe that cannot connect) is logged and never
stops the run: the checker then finds the evidence missing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx

from lab.run.probe import Probe
from lab.scenario import Scenario

if TYPE_CHECKING:
    from lab.checker import CapacityStep, RunData

# The checker (and pandas) are imported where a phase needs them, not by `lab run` itself:
# a second at every start otherwise, before the first part starts.

SCHEMA = "mcpLabPhases.v1"
FILE = "phases.jsonl"
PROBE_SESSIONS = 3
PROBE_LEAD_S = 8.0
"""The probe opens its sessions this long before the rollback phase begins (at most 40 %
of the session TTL: it must come back before its sessions expire)."""
PROBE_BACK_S = 3.0
"""... and comes back this long after it began (at most 30 % of the TTL, at least 1.5 s:
a request answered within a second of the rollback may have been served before it)."""
PROBE_LATE_MARGIN_S = 4.0
"""... and again this long after their sessions' TTL has passed (the sweeper runs every second)."""
LIVE_TABLES = ("operations", "recoveries", "reconnects")
ADMIN_TIMEOUT = 5.0


def initial_knobs(sc: Scenario) -> dict[str, Any]:
    """The first phase's knobs as reference-server settings (ServerConfig fields)."""
    if not sc.phases:
        return {}
    first = sc.phases[0].server
    out: dict[str, Any] = {}
    if "resumable_fraction" in first:
        out["resumable_fraction"] = first["resumable_fraction"]
    if "max_rps" in first:
        out["max_rps"] = first["max_rps"]
    if "rollback" in first:
        out["rollback"] = True  # from the start there is no older generation to keep or drop
    return out


def refusal(sc: Scenario, target: str) -> str | None:
    """Why the run cannot be made with these phases against `target` (None: it can)."""
    if target != "reference" and any(p.server for p in sc.phases):
        names = ", ".join(p.name for p in sc.phases if p.server)
        return f"{sc.path}: phases {names} set server knobs, which need the reference server's admin control"
    return None


@dataclass(frozen=True, slots=True)
class Action:
    at: float
    """Seconds after the run's start."""
    name: str
    run: Callable[[], None]


def read_client_tables(run_dir: Path, tables: tuple[str, ...] = LIVE_TABLES) -> RunData:
    """The client ledgers' `tables` of a running run (read-only: the workers keep writing)."""
    import pandas as pd

    from lab.checker import RunData

    frames: dict[str, list[pd.DataFrame]] = {t: [] for t in tables}
    for path in sorted((run_dir / "clients").glob("*.sqlite")):
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
        except sqlite3.Error:
            continue
        try:
            for table in tables:
                with contextlib.suppress(sqlite3.Error, pd.errors.DatabaseError):
                    frames[table].append(pd.read_sql_query(f"SELECT * FROM {table}", db))
        finally:
            db.close()
    client = {t: pd.concat(f, ignore_index=True) for t, f in frames.items() if f}
    absent = {t for t in tables if t not in client}
    return RunData(run_dir=run_dir, client=client or None, client_tables_absent=absent)


class PhaseDriver:
    def __init__(
        self,
        sc: Scenario,
        run_dir: Path,
        run_start: float,
        *,
        admin_url: str | None,
        admin_token: str,
        client_url: str,
        origin: str | None,
        token: str | None,
    ) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.run_start = run_start
        self.admin_url = admin_url
        self.admin_token = admin_token
        self.stop_reason: str | None = None
        """Set when the run should end now (complete): the ramp passed its knee."""
        self.probe = Probe(client_url, sc.target.protocol_version, origin=origin, token=token, log=self.log)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rolled_back = threading.Event()
        self._rolled_back_at: float | None = None
        """When the server answered the rollback knob (epoch s): the probe comes back after it."""
        self._came_back_at: float | None = None
        """When the probe's return ended (epoch s): it last used the old sessions then."""
        self._out: IO[str] | None = None
        self.actions = self.plan()
        # The probe's moves wait on the network: they run apart, so they never delay a knob.
        probe = [a for a in self.actions if a.name.startswith("probe:")]
        rest = [a for a in self.actions if not a.name.startswith("probe:")]
        self._threads = [
            threading.Thread(target=self._run, args=(acts,), name=f"lab-phases-{i}", daemon=True)
            for i, acts in enumerate((rest, probe))
            if acts
        ]

    # ------------------------------------------------------------------ the plan

    def plan(self) -> list[Action]:
        sc, out = self.sc, []
        for p in sc.phases[1:]:
            if p.server:
                out.append(Action(p.start, f"knobs:{p.name}", partial(self.set_knobs, p.name, p.server)))
        rollback = next((i for i, p in enumerate(sc.phases) if "rollback" in p.server), None)
        if rollback is not None and rollback > 0 and self.admin_url is not None:
            r, ttl = sc.phases[rollback], sc.target.session_ttl
            opened = max(sc.phases[rollback - 1].start + 1.0, r.start - min(PROBE_LEAD_S, 0.4 * ttl))
            back = r.start + max(1.5, min(PROBE_BACK_S, 0.3 * ttl))
            late = back + ttl + PROBE_LATE_MARGIN_S
            rollback_at = self.run_start + r.start
            out.append(
                Action(opened, "probe:open", lambda: self.probe.open(PROBE_SESSIONS, before=rollback_at))
            )
            out.append(
                # Right after the open: it keeps the sessions alive until the return is due.
                Action(
                    opened,
                    "probe:come_back",
                    partial(self.come_back_after_rollback, back - r.start, rollback_at),
                )
            )
            if late < sc.horizon - 1.0:
                out.append(Action(late, "probe:come_back_late", partial(self.come_back_late_after, ttl)))
        if sc.load.until_knee:
            from lab.checker import PhaseSpec, capacity_steps

            specs = [PhaseSpec(p.name, p.kind, p.start, p.end, p.users) for p in sc.phases]
            found = capacity_steps(specs)
            for st in found[:-1]:  # past the last step, the run ends anyway
                out.append(Action(st.judged_end, f"knee:{st.name}", partial(self.judge_step, st)))
        return sorted(out, key=lambda a: a.at)

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        try:
            self._out = (self.run_dir / FILE).open("a", encoding="utf-8")
        except OSError:
            self._out = None
        phases = [
            {"name": p.name, "kind": p.kind, "start": self.run_start + p.start, "end": self.run_start + p.end}
            for p in self.sc.phases
        ]
        self.log(
            {
                "type": "timeline",
                "t": time.time(),
                "schema": SCHEMA,
                "run_start": self.run_start,
                "phases": phases,
            }
        )
        if self.sc.phases and self.sc.phases[0].server:
            first = self.sc.phases[0]
            self.log(
                {
                    "type": "knobs",
                    "t": time.time(),
                    "phase": first.name,
                    "knobs": dict(first.server),
                    "via": "settings",
                    "status": None,
                    "answer": None,
                    "error": None,
                }
            )
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=15)
        self.probe.close()
        with self._lock:
            if self._out is not None:
                with contextlib.suppress(OSError):
                    self._out.close()
                self._out = None

    def log(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._out is None:
                return
            with contextlib.suppress(OSError):
                self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
                self._out.flush()

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            wait = self.run_start + action.at - time.time()
            if wait > 0 and self._stop.wait(wait):
                return
            if self._stop.is_set() or self.stop_reason is not None:
                return
            try:
                action.run()
            except Exception as e:  # logged, never fatal: the checker finds the evidence missing
                self.log(
                    {
                        "type": "error",
                        "t": time.time(),
                        "action": action.name,
                        "error": f"{type(e).__name__}: {e}",
                    }
                )

    # ------------------------------------------------------------------ the actions

    def set_knobs(self, phase: str, knobs: dict[str, Any]) -> None:
        record: dict[str, Any] = {"type": "knobs", "phase": phase, "knobs": dict(knobs), "via": "admin"}
        if self.admin_url is None:
            record.update(
                t=time.time(), status=None, answer=None, error="no admin control (not the reference server)"
            )
            self.log(record)
            return
        try:
            r = httpx.post(
                self.admin_url,
                json=knobs,
                headers={"x-lab-admin-token": self.admin_token},
                timeout=ADMIN_TIMEOUT,
            )
            answer = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
            record.update(
                t=time.time(),
                status=r.status_code,
                answer=answer,
                error=None if r.is_success else r.text[:300],
            )
        except (httpx.HTTPError, ValueError) as e:
            record.update(t=time.time(), status=-1, answer=None, error=f"{type(e).__name__}: {e}")
        self.log(record)
        if "rollback" in knobs:
            self._rolled_back_at = record["t"]
            self._rolled_back.set()

    def come_back_after_rollback(self, after_s: float, rollback_at: float | None = None) -> None:
        """The probe's return, `after_s` after the rollback knob was *answered* (a busy box
        can answer it late; the checker counts a request within a second of the knob as
        possibly served before it). Waits for the knob, planned at the epoch time
        `rollback_at` (now if None), at most ADMIN_TIMEOUT + 1 s past it, and keeps the
        probe's sessions alive meanwhile (a ping in each every TTL/3 at most)."""
        knob_by = max(time.time(), rollback_at or 0.0) + ADMIN_TIMEOUT + 1.0
        rolled_back = self._keep_alive_until(knob_by, self._rolled_back)
        back_at = self._rolled_back_at + after_s if rolled_back and self._rolled_back_at is not None else None
        if back_at is not None and self._keep_alive_until(back_at, self._stop):
            return  # the run is stopping
        self.probe.come_back()
        self._came_back_at = time.time()

    def _keep_alive_until(self, until: float, event: threading.Event) -> bool:
        """The probe's sessions pinged (every TTL/3 at most: well within it) until the epoch
        time `until` or until `event` is set; whether it was set."""
        every = max(0.5, self.sc.target.session_ttl / 3)
        while not event.is_set() and time.time() < until:
            self.probe.keep_alive()
            if event.wait(min(every, max(0.0, until - time.time()))):
                return True
        return event.is_set()

    def come_back_late_after(self, ttl: float) -> None:
        """The probe's late return, once the old sessions have been idle past their TTL
        counted from when the probe last used them (its return, which a busy box can make
        later than planned; the sessions' TTL runs from there), plus the margin."""
        if self._came_back_at is not None:
            wait = self._came_back_at + ttl + PROBE_LATE_MARGIN_S - time.time()
            if wait > 0 and self._stop.wait(wait):
                return
        self.probe.come_back_late()

    def judge_step(self, st: CapacityStep) -> None:
        from lab.checker import measure_frames, step_misses

        start, end = self.run_start + st.judged_start, self.run_start + st.judged_end
        data = read_client_tables(self.run_dir)
        m = measure_frames(data, start, end, budget_s=self.sc.budget.resume_p99_s, stopped_at=None)
        missed = step_misses(
            m,
            resume_p99_s=self.sc.budget.resume_p99_s,
            call_error_rate_max=self.sc.budget.call_error_rate_max,
            reconnect_qps=self.sc.budget.reconnect_qps,
        )
        self.log(
            {
                "type": "knee",
                "t": time.time(),
                "step": st.name,
                "users": st.users,
                "resume_p99_s": m.resume_p99_s,
                "resume_p99_unbounded": m.resume_p99_unbounded,
                "call_error_rate": m.call_error_rate,
                "reconnect_qps_peak": m.reconnect_qps_peak,
                "missed": missed,
                "stop": bool(missed),
            }
        )
        if missed:
            self.stop_reason = f"past the knee: step {st.name} ({st.users} clients) broke {', '.join(missed)}"
