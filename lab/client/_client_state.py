"""What one client knows about its session, which every part of the core reads.

`ClientState` is a plain record, owned by `ClientCore` and handed to each part when the
core is made (as h11 hands its state to the code that moves it, not the connection): a
part reads and moves these facts, and calls the other parts it was given, never the core.
It is the lowest layer of the core, with `_model` (a call, a stream, a connection); the
rules that move these facts live in the parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.client._commands import Effects
from lab.client._model import Call, Stream
from lab.client._states import Machine, Role, State
from lab.wire.client_ledger import SessionEvent
from lab.wire.redact import Redactor


@dataclass(eq=False, slots=True)
class ClientState:
    """One client's session, its calls and streams, its flags, and the effects sink."""

    client_id: str
    redactor: Redactor
    """The run key's pseudonyms: a raw session ID never goes into a record."""
    protocol_version: str
    """The version asked for until a handshake negotiates one; then the negotiated one."""
    session: Machine = field(default_factory=lambda: Machine(Role.SESSION))
    session_id: str | None = None
    generation: int = 0
    """Client-side session generation: +1 for every handshake that succeeds."""
    structured_ids: bool = False
    """The server announced `e1` event IDs (and there is a session tag to check them by)."""
    server_generation: int | None = None
    """The server's cursor generation, bound by the first structured event ID accepted."""
    tag: str | None = None
    """`session_tag(session_id)`; None without a session ID."""
    calls: dict[str, Call] = field(default_factory=dict)
    """Every logical operation, by operation (idempotency) key."""
    streams: dict[str, Stream] = field(default_factory=dict)
    leave_requested: bool = False
    stopped: bool = False
    fx: Effects = field(default_factory=Effects)
    """Where every part puts its commands, records and notices during one public call."""
    next_request: int = 1
    """The next JSON-RPC request ID (a per-client counter, as real clients use)."""
    resend_safe: frozenset[str] | None = None
    """The tools the server said may be re-sent after an unknown outcome (`_tools.py`);
    None until its `tools/list` answer came."""

    @property
    def session_pseudonym(self) -> str | None:
        return self.redactor.session(self.session_id)

    def session_usable(self) -> bool:
        """May requests of the session go out (and its streams deliver)?"""
        return self.session.state in (State.SESSION_ACTIVE, State.DELETE_REQUESTED)

    def new_request_id(self) -> int:
        rid = self.next_request
        self.next_request += 1
        return rid

    def session_event(self, what: str, now: float, *, version: str | None = None) -> None:
        """A `SessionEvent` row of the current session (handshake and leaving both write
        them, so it lives below both)."""
        self.fx.records.append(
            SessionEvent(self.client_id, self.session_pseudonym, self.generation, what, version, now)
        )
