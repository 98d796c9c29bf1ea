"""The run's phases as the scenario planned them, read from run.json (`scenario.phases`,
on the run's clock): the timeline measures them, the lab's health and the rules read them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

IMPLICIT = "run"
"""Name and kind of the one implicit phase of a run without [[phases]]."""


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One phase as the scenario planned it, on the run's clock (epoch s)."""

    name: str
    kind: str
    start: float
    end: float
    """The planned end, cut at the run's stop."""
    users: int | None
    """Clients the load shape reaches by the phase's end."""
    reached: bool = True
    """False: the run stopped before the phase began."""
    knobs: Mapping[str, Any] = field(default_factory=dict)
    """Server knobs the phase sets (`[phases.server]`, docs/scenarios.md)."""
    planned_end: float | None = None
    """Its end as planned (None: as `end`); later than `end` when the run stopped in it."""

    @property
    def complete(self) -> bool:
        """It ran to its planned end."""
        return self.reached and (self.planned_end is None or self.end >= self.planned_end - 1e-6)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def last_half(self) -> tuple[float, float]:
        return self.start + self.seconds / 2.0, self.end


def number(value: object) -> float | None:
    """A finite number from run.json, else None (a bool is not a number)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def phase_specs(run: Mapping[str, Any] | None) -> list[PhaseSpec]:
    """The run's phases from run.json; one implicit phase (`run`) without [[phases]];
    none without a start time."""
    run = run or {}
    started = number(run.get("started_at"))
    if started is None:
        return []
    stopped = number(run.get("stopped_at"))
    scenario = run.get("scenario")
    scenario = scenario if isinstance(scenario, Mapping) else {}
    raw = scenario.get("phases")
    load_raw = scenario.get("load")
    load: Mapping[str, Any] = load_raw if isinstance(load_raw, Mapping) else {}
    if not isinstance(raw, list) or not raw:
        end = stopped if stopped is not None else started + (number(load.get("duration")) or 0.0)
        users = load.get("users")
        return [PhaseSpec(IMPLICIT, IMPLICIT, started, end, users if isinstance(users, int) else None)]
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping):
            continue
        offset, duration = number(p.get("start")), number(p.get("duration"))
        if offset is None or duration is None:
            continue
        start, end = started + offset, started + offset + duration
        reached = stopped is None or start < stopped
        if stopped is not None:
            end = min(end, stopped)
        users = p.get("users")
        knobs = p.get("server")
        out.append(
            PhaseSpec(
                str(p.get("name") or f"phase-{i}"),
                str(p.get("kind") or "steady"),
                start,
                end if reached else start,
                users if isinstance(users, int) and not isinstance(users, bool) else None,
                reached,
                dict(knobs) if isinstance(knobs, Mapping) else {},
                started + offset + duration,
            )
        )
    return out


def capacity_check(run: Mapping[str, Any] | None) -> bool:
    """run.json says the scenario is a capacity check (`scenario.check`, docs/scenarios.md):
    judged on rule 16, the rules fed only by faults not applicable."""
    scenario = (run or {}).get("scenario")
    return isinstance(scenario, Mapping) and scenario.get("check") == "capacity"
