"""The core's own bookkeeping: a tool call, a stream, a connection (plain mutable records;
the rules that move them live in the modules that use them, the states in `_states`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.client._acceptance import ConnectionView
from lab.client._commands import CallHandle, Purpose
from lab.client._states import Machine, State
from lab.wire import jsonrpc
from lab.wire.sse import SseDecoder


@dataclass(eq=False, slots=True)
class Call:
    """A logical operation (one idempotency key) and its attempts."""

    handle: CallHandle
    arguments: jsonrpc.JsonObject
    write: bool
    started_at: float
    attempts: int = 0
    request_id: int | None = None
    """JSON-RPC ID of the latest attempt (a per-client counter, as real clients do)."""
    stream_key: str | None = None
    queued: bool = True
    """Waiting for an active session to be sent."""
    done: bool = False
    progress_at: float = 0.0
    """The last time the call moved: started, sent, queued, or a message accepted."""


@dataclass(eq=False, slots=True)
class Stream:
    """A stream of the session: `post:<request-id>` of a call, or `get:<n>` standalone."""

    key: str
    machine: Machine
    generation: int
    request_id: int | None
    call: Call | None
    server_stream_id: str | None
    conn_id: int | None
    ended: bool = False
    """Its response was accepted."""
    retry_ms: int | None = None

    @property
    def state(self) -> State:
        return self.machine.state


@dataclass(eq=False, slots=True)
class Conn:
    """One HTTP request and its response, from the command to its exchange record."""

    conn_id: int
    purpose: Purpose
    method: str
    view: ConnectionView
    started_at: float
    stream_key: str | None
    call: Call | None
    carried_session: bool
    last_event_id: str | None
    status: int | None = None
    sse: bool = False
    decoder: SseDecoder | None = None
    body: bytearray = field(default_factory=bytearray)
    synthetic: int = 0
    retry_after: float | None = None
    session: str | None = None
    """Pseudonym of the session ID the request carried (None if it carried none)."""
