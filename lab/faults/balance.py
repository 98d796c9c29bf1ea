"""The lab's proxy as a load balancer in front of N replicas: which one gets a request (pure).

The fault addon (addons/mcp_faults.py) is already the reverse proxy in front of the
target; with `mcpfaults_replicas` it routes each HTTP request (not each connection) to
one of N upstreams, the way a balancer in front of a replicated MCP server does. The most
reported failure of such deployments, "Session not found", is a session's next request
reaching a replica that never saw it: `affinity = "none"` makes it happen, `"session"`
is the sticky balancer that prevents it.

No I/O and no mitmproxy here: the addon asks `route` for each request it forwards and
tells `learn` which session a replica's answer assigned.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

Affinity = Literal["none", "session"]
AFFINITIES: Final[tuple[str, ...]] = get_args(Affinity)

MAX_SESSIONS: Final = 100_000
"""How many sessions the balancer remembers; beyond it the least recently used is
forgotten (its next request then goes round-robin, as after a balancer restart)."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One upstream the proxy balances over."""

    host: str
    port: int

    @property
    def authority(self) -> str:
        """`host:port` as a Host header names it (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_replicas(value: str, name: str = "mcpfaults_replicas") -> tuple[Replica, ...]:
    """A comma-separated `host:port` list (`[::1]:8000` for IPv6); "" = none (no balancing).
    A ValueError names the entry that is wrong."""
    replicas: list[Replica] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port_text = entry.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or "/" in entry or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{name}: expected host:port entries like 127.0.0.1:8001, got {entry!r}")
        replica = Replica(host, int(port_text))
        if replica in replicas:  # one index per server: the tap's `replica` must name one
            raise ValueError(f"{name}: {entry!r} is listed twice")
        replicas.append(replica)
    return tuple(replicas)


def parse_affinity(value: str, name: str = "mcpfaults_affinity") -> Affinity:
    text = value.strip() or "none"
    if text == "none":
        return "none"
    if text == "session":
        return "session"
    raise ValueError(f"{name}: expected one of {', '.join(AFFINITIES)}, got {value!r}")


def _session_key(session_id: str) -> bytes:
    # Sessions are held by a digest, not as given: nothing of the balancer's memory, in a
    # dump or a repr, is a session ID that could be replayed against a replica.
    return hashlib.blake2b(session_id.encode("utf-8", "surrogateescape"), digest_size=16).digest()


class Balancer:
    """Routes requests over `replicas` (indexes 0..N-1, the tap's `replica`).

    - `none`: round-robin, request by request (one counter for the whole proxy);
    - `session`: a request naming a session the balancer learnt goes to the replica that
      assigned it; any other request (no session, or one it does not know) round-robin.

    Sessions are learnt in both modes (`learn`): the proxy's own calls (`home`) go to the
    session's replica whatever the affinity.
    """

    __slots__ = ("_max_sessions", "_next", "_sessions", "affinity", "replicas")

    def __init__(
        self, replicas: Sequence[Replica], affinity: Affinity = "none", *, max_sessions: int = MAX_SESSIONS
    ) -> None:
        if not replicas:
            raise ValueError("a balancer needs at least one replica")
        self.replicas: tuple[Replica, ...] = tuple(replicas)
        self.affinity: Affinity = affinity
        self._max_sessions = max_sessions
        self._next = 0
        """The round-robin counter: the next request without a known session gets this index."""
        self._sessions: OrderedDict[bytes, int] = OrderedDict()
        """Session digest -> the replica that assigned it, least recently used first."""

    @property
    def by_session(self) -> bool:
        """Whether routing looks at the request's session at all (the addon reads the
        header only then)."""
        return self.affinity == "session"

    def route(self, session_id: str | None) -> int:
        """The replica for one request carrying `session_id` (its `Mcp-Session-Id` as it
        goes upstream, None without one)."""
        if session_id and self.affinity == "session":
            key = _session_key(session_id)
            replica = self._sessions.get(key)
            if replica is not None:
                self._sessions.move_to_end(key)  # in use: the last to be forgotten
                return replica
        replica = self._next
        self._next = (replica + 1) % len(self.replicas)
        return replica

    def learn(self, session_id: str, replica: int) -> None:
        """A response from `replica` carried `Mcp-Session-Id: session_id` (the answer to
        `initialize`): that replica holds the session."""
        if not 0 <= replica < len(self.replicas):
            raise ValueError(f"no replica {replica} (there are {len(self.replicas)})")
        key = _session_key(session_id)
        self._sessions[key] = replica
        self._sessions.move_to_end(key)
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def replica_of(self, session_id: str | None) -> int | None:
        """The replica that assigned `session_id`, if the balancer knows it (no reordering)."""
        return self._sessions.get(_session_key(session_id)) if session_id else None

    def home(self, session_id: str | None, answered_by: int | None) -> int:
        """Where a call of the proxy's own about a session goes (kill_session's DELETE,
        expiry_race's admin call): the session's replica when known; else the replica that
        answered the request the call races (it just served that session: a balancer that
        forgot the session, past its bound, must not send the call where it is unknown);
        else the first replica."""
        known = self.replica_of(session_id)
        if known is not None:
            return known
        return answered_by if answered_by is not None else 0

    def __len__(self) -> int:
        """How many sessions it remembers."""
        return len(self._sessions)

    def __repr__(self) -> str:  # never the sessions, even as digests
        authorities = ",".join(r.authority for r in self.replicas)
        return f"Balancer({authorities}, affinity={self.affinity}, sessions={len(self._sessions)})"
