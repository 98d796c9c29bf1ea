"""When and whether a rule fires: time windows and seed-derived decisions (pure).

Decisions are derived, not drawn from a shared generator: for rule R and a stable key K
of what is decided (the flow's `x-lab-conn`, plus `#<event index>` for an event),
BLAKE2b keyed with the seed over `R.id + NUL + K` gives the decision ID (`d_` + 16 hex)
written to the tap and, for a flow-level rule, a uniform number: the rule fires if it
is below the rule's probability at that moment (so lowering a rate during a run only
removes firings). Event-level rules, which are asked on every SSE event, draw their
firing indexes per flow from a generator seeded the same way (`EventSampler`: the same
distribution, far cheaper). The same seed and the same traffic therefore make the same
decisions, whatever order flows arrive in.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Window:
    """`[start, end)` in seconds since the run start; `end` None = until the run ends."""

    start: float = 0.0
    end: float | None = None

    def contains(self, t: float) -> bool:
        return t >= self.start and (self.end is None or t < self.end)

    def overlaps(self, other: Window) -> bool:
        a_end = math.inf if self.end is None else self.end
        b_end = math.inf if other.end is None else other.end
        return self.start < b_end and other.start < a_end

    def to_dict(self) -> dict[str, float | None]:
        return {"start": self.start, "end": self.end}


@dataclass(frozen=True, slots=True)
class Decision:
    """A seed-derived decision: `id` goes to the tap; `draw` in [0, 1) was compared to the rate."""

    rule: str
    id: str
    draw: float
    bits: int
    """64 more pseudo-random bits, for choices made once the fault fires (`pick`)."""

    def pick(self, n: int) -> int:
        """A deterministic index in range(n) (n >= 1)."""
        return self.bits % n


class Decider:
    """Decisions of one seed. `draw` always answers; `decide` answers only when a rule fires.

    The hash is BLAKE2b keyed with the seed (a MAC, like HMAC, at about half the cost: it
    runs for every flow-level rule on every request that passes the proxy).
    """

    __slots__ = ("_key", "_prefixes")

    _SCALE: Final = 2.0**64

    def __init__(self, seed: int) -> None:
        self._key = hashlib.blake2b(
            b"mcp-lab/fault-decision\x00" + str(seed).encode(), digest_size=32
        ).digest()
        self._prefixes: dict[str, bytes] = {}

    def _digest(self, rule_id: str, key: str) -> bytes:
        prefix = self._prefixes.get(rule_id)
        if prefix is None:
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            prefix = self._prefixes[rule_id] = rule_id.encode() + b"\x00"
        return hashlib.blake2b(prefix + key.encode(), key=self._key, digest_size=24).digest()

    @staticmethod
    def _decision(rule_id: str, d: bytes) -> Decision:
        return Decision(
            rule=rule_id,
            id="d_" + d[:8].hex(),
            draw=int.from_bytes(d[8:16]) / Decider._SCALE,
            bits=int.from_bytes(d[16:24]),
        )

    def draw(self, rule_id: str, key: str) -> Decision:
        return self._decision(rule_id, self._digest(rule_id, key))

    def sampler(self, rule_id: str, rate: float, flow_key: str) -> EventSampler:
        """Which event indexes of one flow a rule fires on (for event-level rules)."""
        return EventSampler(rate, self._digest(rule_id, "events\x00" + flow_key))

    def decide(self, rule_id: str, probability: float, key: str) -> Decision | None:
        """The decision for `key` if a rule with this `probability` now fires, else None."""
        if probability <= 0.0:
            return None
        d = self._digest(rule_id, key)
        if int.from_bytes(d[8:16]) >= probability * self._SCALE:
            return None
        return self._decision(rule_id, d)


class EventSampler:
    """The event indexes of one flow that one event-level rule fires on.

    Equivalent to an independent draw with probability `rate` per index, but drawn as
    geometric gaps between firings from a generator seeded by (seed, rule, flow key), so
    the cost per event is a comparison, not a hash. Deterministic per flow: other flows,
    and the order flows arrive in, do not change it. Indexes must be asked in increasing
    order (each at most once; skipping some changes nothing for the others); a rule's
    window is applied by the caller.
    """

    __slots__ = ("_log_q", "_next", "_rng")

    def __init__(self, rate: float, seed: bytes) -> None:
        self._rng = random.Random(int.from_bytes(seed))
        self._log_q = math.log1p(-rate) if 0.0 < rate < 1.0 else (0.0 if rate >= 1.0 else -math.inf)
        self._next = self._after(-1)

    def _after(self, index: int) -> int:
        """The next firing index after `index`."""
        if self._log_q == 0.0:
            return index + 1
        if self._log_q == -math.inf:
            return 1 << 62
        u = 1.0 - self._rng.random()  # in (0, 1]
        return index + 1 + int(math.log(u) / self._log_q)

    @property
    def next(self) -> int:
        """The next index it may fire on (no index before it will)."""
        return self._next

    def hits(self, index: int) -> bool:
        while self._next < index:
            self._next = self._after(self._next)
        if self._next == index:
            self._next = self._after(index)
            return True
        return False
