"""Faults pinned to logical triggers: "cut after event 3 of the 2nd `ticker` call of w0-u4".

A rule of the plan normally fires by chance (its rate, drawn from the seed and the flow's
key). A rule with pins (`at` in a scenario's `[[faults]]`) fires exactly where its pins
say, and nowhere else: on the request of one client, of one kind, with one ordinal among
that client's requests of that kind, in the order the proxy sees them; for an event-level
fault, at one event index of that request's stream. These are the terms in which the
checker names every firing of a run (`lab.checker.truth.triggers`), so a later run can
meet the same triggers again (`lab replay`, `lab shrink`): they depend on what the clients
do, not on when.

A re-send of a call (the same idempotency key, `params._meta`, as the lab's client sends
after an ambiguous loss) is not a new ordinal but the next **attempt** of its call: how
many re-sends a client makes depends on the faults it met before, so counting them as
new calls would move every later pin when `lab shrink` takes an earlier fault away.

Pure: the addon counts the ordinals (`Ordinals`) and asks the plan (`lab.faults.plan`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lab.faults.facts import RequestFacts


@dataclass(frozen=True, slots=True)
class Pin:
    client: str
    """The client ID (the `x-lab-conn` header before its last `:`)."""
    request: str
    """The request's kind (`request_kind`): `POST tools/call ticker`, `GET resume`..."""
    ordinal: int
    """1-based, among the client's requests of that kind."""
    event: int | None = None
    """The event's index in the request's stream (event-level faults only)."""
    attempt: int = 1
    """1 for the call's first send, 2 for its first re-send (same idempotency key)..."""

    @property
    def place(self) -> Place:
        return (self.client, self.request, self.ordinal, self.attempt)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"client": self.client, "request": self.request, "ordinal": self.ordinal}
        if self.attempt != 1:
            out["attempt"] = self.attempt
        if self.event is not None:
            out["event"] = self.event
        return out


type Place = tuple[str, str, int, int]
"""(client, request kind, ordinal, attempt): where a request stands among its client's
requests."""


def request_kind(http_method: str | None, rpc_method: str | None, tool: str | None, resumes: bool) -> str:
    """A request's kind as triggers name it: `POST <JSON-RPC method> [<tool>]` (`POST` alone
    for a body that is not a JSON-RPC message), `GET`, `GET resume` (with a
    `Last-Event-ID`), `DELETE`; `?` when the method is not known."""
    method = http_method or "?"
    if method == "POST":
        return " ".join([method, *(v for v in (rpc_method, tool) if v)])
    if method == "GET":
        return "GET resume" if resumes else "GET"
    return method


def client_of(conn: str | None) -> str | None:
    """The client ID of an `x-lab-conn` value (`<client>:<connection>`); None without one."""
    if not conn:
        return None
    client, sep, _ = conn.rpartition(":")
    return client if sep else None  # (the checker's `split_conn`, the same way)


class Ordinals:
    """Each lab client's requests counted by kind, in the order they are seen, a re-send
    (an idempotency key seen before) counted as its call's next attempt (module
    docstring). The proxy keeps one (only while the plan has pins, so an ordinary run pays
    nothing); the checker counts a tap's flows with another."""

    __slots__ = ("_attempts", "_counts")

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._attempts: dict[tuple[str, str, str], list[int]] = {}
        """(client, kind, idempotency key) -> [ordinal, attempts so far]."""

    def count(self, client: str, kind: str, key: str | None) -> tuple[int, int]:
        """The (ordinal, attempt) of the next request of `client` of this kind."""
        if key is not None:
            seen = self._attempts.get((client, kind, key))
            if seen is not None:
                seen[1] += 1
                return seen[0], seen[1]
        self._counts[client, kind] += 1
        ordinal = self._counts[client, kind]
        if key is not None:
            self._attempts[client, kind, key] = [ordinal, 1]
        return ordinal, 1

    def place(self, facts: RequestFacts) -> Place | None:
        """The request's place, counting it; None for a request of no lab client."""
        client = client_of(facts.conn)
        if client is None:
            return None
        kind = request_kind(
            facts.http_method, facts.rpc.method, facts.rpc.tool, facts.last_event_id is not None
        )
        return (client, kind, *self.count(client, kind, facts.rpc.idempotency_key))


class FixedIndexes:
    """A pinned event-level rule's firing indexes on one flow, asked as an `EventSampler`
    is (`next`, `hits`, in increasing order)."""

    __slots__ = ("_i", "_indexes")

    NEVER = 1 << 62

    def __init__(self, indexes: tuple[int, ...]) -> None:
        self._indexes = tuple(sorted(set(indexes)))
        self._i = 0

    @property
    def next(self) -> int:
        return self._indexes[self._i] if self._i < len(self._indexes) else self.NEVER

    def hits(self, index: int) -> bool:
        while self._i < len(self._indexes) and self._indexes[self._i] < index:
            self._i += 1
        if self._i < len(self._indexes) and self._indexes[self._i] == index:
            self._i += 1
            return True
        return False
