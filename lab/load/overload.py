"""A Locust worker that cannot keep up with its target, told apart from one that is only
busy: its event loop runs late while the process is at a full core, second after second.

A target that sends 10,000 events/s starved a worker until it missed the master's
heartbeats; the run then "completed" and gate 5 failed the target for the resumptions the
starved clients were too late to make. The worker's flush loop (lab/load/locustfile.py)
looks after each of its 0.2 s sleeps, at most once a second: how late the sleeps woke
(the loop's lag) and how much CPU the process used meanwhile. `LATE_S` late at
`BUSY_CORES` or more for `OVERLOAD_S` seconds in a row (wall time: a starved loop looks
seldom, each look covering seconds), the worker says it is overloaded (its `overloaded`
counter, sent at once), and `lab run` ends the run as limited by the lab, with the events
per second the worker was accepting. (Locust's master declares a worker missing after a
few seconds of late heartbeats: the guard must speak before that.)

A loop held by something that does not use the CPU (a blocking sleep: the lab-latency
test's stall) is late but not busy: not an overload. Pure: the caller gives the times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

LATE_S: Final = 0.5
"""How late the loop's wake-ups must run (the worst in the second), in seconds."""
BUSY_CORES: Final = 0.9
"""The process's CPU over the second, in cores."""
OVERLOAD_S: Final = 4.0
"""Seconds (wall time) in a row both must hold."""


@dataclass
class OverloadWatch:
    late_s: float = 0.0
    """Wall seconds in a row the loop has been late and busy."""
    overloaded: bool = False
    events_per_s: float = 0.0
    """The events the worker accepted per second over its last look."""
    _last: tuple[float, float, int] | None = field(default=None, repr=False)

    def look(self, wall: float, cpu: float, accepted: int, worst_lag_s: float) -> bool:
        """One look (about a second apart, or longer when the loop is starved): wall and
        process CPU time (s), events accepted so far, the worst lateness of the loop's
        wake-ups since the last look. True once overloaded (it stays so: the run ends)."""
        if self._last is not None:
            wall0, cpu0, accepted0 = self._last
            span = wall - wall0
            if span > 0:
                busy = (cpu - cpu0) / span
                self.events_per_s = (accepted - accepted0) / span
                self.late_s = self.late_s + span if busy >= BUSY_CORES and worst_lag_s >= LATE_S else 0.0
        self._last = (wall, cpu, accepted)
        if self.late_s >= OVERLOAD_S:
            self.overloaded = True
        return self.overloaded
