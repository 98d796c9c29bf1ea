"""How big a scenario is, in the words `lab scenarios` prints: how long it lasts, how many
clients at its peak, how many events it aims at, and whether it is heavy or long on an
ordinary machine, so that nobody starts `clients-10k` expecting `smoke`."""

from __future__ import annotations

from dataclasses import dataclass

from lab.scenario.parts import Scenario

HEAVY_CLIENTS = 500
"""From this many clients at once, a run keeps more than one core busy (a 2-core machine
holds ~6,000 mostly idle clients, docs/architecture.md)."""
HEAVY_EVENTS = 50_000
"""An event target from which the run is CPU-bound on every part of the chain (the release
gate's 100,000 events take both cores of a 2-core machine for about a minute)."""
LONG_S = 180.0
"""From this planned length a run is long (a run with an event target is not called long:
it ends at its target, its bound is only a bound)."""


@dataclass(frozen=True)
class Size:
    length: str
    peak_clients: int
    workers: int
    events: int | None
    faults: int
    toxics: int
    heavy: bool
    long: bool

    def line(self) -> str:
        """One line: length, clients, workers, events, faults, and the warnings."""
        parts = [
            self.length,
            f"{self.peak_clients:,} client{'s' if self.peak_clients != 1 else ''} at most",
            f"{self.workers} worker{'s' if self.workers != 1 else ''}",
            f"{self.faults} fault rule{'s' if self.faults != 1 else ''}"
            + (f" + {self.toxics} TCP toxic{'s' if self.toxics != 1 else ''}" if self.toxics else ""),
        ]
        warnings = [w for w, on in (("HEAVY: more than one core", self.heavy), ("LONG", self.long)) if on]
        return ", ".join(parts) + ("; " + ", ".join(warnings) if warnings else "")


def peak_clients(sc: Scenario) -> int:
    """The most clients the load shape asks for at once: load.users, or a phase's (for
    scripted clients, all of them: at most that many are at once)."""
    return max([sc.load.users, *(p.users for p in sc.phases)])


def size_of(sc: Scenario) -> Size:
    lo = sc.load
    peak = peak_clients(sc)
    if lo.event_target is not None:
        bound = lo.duration if lo.duration is not None else lo.hard_timeout
        length = f"until {lo.event_target:,} events (at most {_span(bound)})"
    elif lo.clients:
        n = len(lo.clients)
        done = f"{n:,} scripted clients are" if n != 1 else "1 scripted client is"
        length = f"until its {done} done (at most {_span(sc.horizon)})"
    elif lo.until_knee:
        length = f"until one step past the knee (at most {_span(sc.horizon)})"
    else:
        length = _span(sc.horizon)
    heavy = lo.workers >= 2 or peak >= HEAVY_CLIENTS or (lo.event_target or 0) >= HEAVY_EVENTS
    long = lo.event_target is None and sc.horizon >= LONG_S
    return Size(length, peak, lo.workers, lo.event_target, len(sc.faults), len(sc.toxics), heavy, long)


def _span(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    minutes, rest = divmod(s, 60)
    return f"{minutes} min" + (f" {rest} s" if rest else "")
