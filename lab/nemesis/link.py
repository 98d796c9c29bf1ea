"""One connection through a nemesis proxy (`Link`): which toxics act on it (the toxicity
roll, once per toxic version), each toxic's state on it, and how it ended."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import trio

from lab.nemesis.chain import ToxicEntry
from lab.nemesis.framing import HeaderHold
from lab.nemesis.toxics import ToxicSpec


@dataclass(slots=True)
class ToxicState:
    """Per-connection state of one toxic."""

    paced_until: float = -math.inf  # bandwidth: when the last paced piece may leave
    sent: int = 0  # limit_data: bytes passed so far
    triggered: bool = False  # reset_peer: the reset is under way
    held: bytearray = field(default_factory=bytearray)  # buffer: bytes not passed on yet
    held_since: float = math.inf  # buffer: when its first held byte was read (trio clock)
    unbuffered: bool = False  # buffer: the server said `X-Accel-Buffering: no`
    framing: HeaderHold | None = None  # header_hold, buffer: the connection's responses so far

    def take_held(self) -> bytes:
        """buffer: the bytes it holds, which it then no longer does."""
        piece = bytes(self.held)
        self.held.clear()
        self.held_since = math.inf
        return piece

    def flush_at(self, spec: ToxicSpec) -> float:
        """buffer: when what it holds must go on (its `flush` after the first held byte;
        never without one, nor for a header_hold)."""
        flush_ms = spec.attributes.get("flush", 0)
        return self.held_since + flush_ms / 1000 if flush_ms > 0 else math.inf


@dataclass(eq=False, slots=True)
class Link:
    """One proxied connection: its toxicity rolls, per-toxic state, and how it ended."""

    number: int
    rng: random.Random
    rolls: dict[int, bool] = field(default_factory=dict)
    state: dict[int, ToxicState] = field(default_factory=dict)
    scope: trio.CancelScope | None = None
    end_reason: str | None = None
    reset_side: str | None = None  # "client" | "upstream": the socket to close with RST
    ended_directions: set[str] = field(default_factory=set)
    buffers: dict[str, dict[int, ToxicEntry]] = field(default_factory=dict)
    """Per direction, the buffer toxics that hold bytes of it (by added_id)."""
    last_data: dict[str, float] = field(default_factory=dict)
    """Per direction, when its last chunk was written through the toxics (trio clock):
    what an idle_timeout toxic measures silence from (the fast path does not stamp: a
    direction an idle_timeout acts on takes the toxics' path)."""
    toxic_spells: dict[str, int] = field(default_factory=dict)
    """Per direction, how many times its bytes left the fast path for the toxics' queued
    one (each spell ends when no toxic acts on the direction any more)."""

    def applies(self, entry: ToxicEntry) -> bool:
        """Whether the toxic acts on this connection (toxicity, rolled once per version)."""
        roll = self.rolls.get(entry.version_id)
        if roll is None:
            roll = self.rolls[entry.version_id] = self.rng.random() < entry.spec.toxicity
        return roll

    def state_for(self, entry: ToxicEntry) -> ToxicState:
        return self.state.setdefault(entry.added_id, ToxicState())

    def finish(self, reason: str, reset_side: str | None = None) -> None:
        """End the connection (the first reason wins); its sockets close once its tasks stop."""
        if self.end_reason is None:
            self.end_reason = reason
            self.reset_side = reset_side
        if self.scope is not None:
            self.scope.cancel()

    def direction_ended(self, direction: str) -> None:
        self.ended_directions.add(direction)
        if len(self.ended_directions) == 2:
            self.finish("closed")
