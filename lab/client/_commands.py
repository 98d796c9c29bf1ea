"""What the client core asks its driver to do (commands), what it writes to its ledger
(records) and what it tells its user (notices): together, its one `Output`.

Events in, output out: the driver calls `ClientCore.response_head / response_data /
response_end / connection_failed / tick` (and the application `connect / call_tool /
cancel / leave / close_all`) with what happened; every one of them returns an `Output`.
The driver carries out its commands in order, writes its records and hands its notices
to the application. The core keeps nothing of it afterwards: there is no other channel.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from lab.wire.client_ledger import Record
from lab.wire.frozen import frozen_record
from lab.wire.jsonrpc import JsonObject


class Purpose(enum.StrEnum):
    """Why an HTTP request is made (written to the client ledger)."""

    INITIALIZE = "initialize"
    DISCOVER = "discover"
    """The modern era's first request (`server/discover`): it stands where initialize did."""
    INITIALIZED = "initialized"
    CALL = "call"
    STANDALONE = "standalone"
    RESUME = "resume"
    CANCEL = "cancel"
    DELETE = "delete"
    TOOLS_LIST = "tools_list"


HANDSHAKES = frozenset({Purpose.INITIALIZE, Purpose.DISCOVER})
"""The first request of a client (and of a new session), by era."""

type Headers = tuple[tuple[str, str], ...]


@frozen_record
class SendRequest:
    """Open connection `conn_id` with this request and stream its response back."""

    conn_id: int
    purpose: Purpose
    method: str
    headers: Headers
    body: bytes | None

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None


@frozen_record
class CloseConnection:
    """Abort connection `conn_id` (the core needs nothing more from it).

    `finished`: the response is complete for the core (a call's answer ended its stream):
    the driver may read what is left of the body, the end of the HTTP message the server
    sends right after, and keep the connection for the next request, rather than close
    it. (Closing it made every tools/call and initialize cost a new TCP connection through
    the nemesis and mitmdump, bench/bench_chain_cost.py.) Nothing read then reaches the
    core."""

    conn_id: int
    finished: bool = False


type Command = SendRequest | CloseConnection


class CallOutcome(enum.StrEnum):
    OK = "ok"
    ERROR = "error"
    """The server answered with a JSON-RPC error or refused the request (4xx)."""
    UNKNOWN = "unknown"
    """May or may not have happened (Jepsen's `info`): e.g. the session expired while the
    call was in flight. Retry only with the same idempotency key."""
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class CallHandle:
    operation_key: str
    """The logical operation; also the idempotency key sent to the server."""
    tool: str


@dataclass(frozen=True, slots=True)
class SessionEstablished:
    generation: int
    protocol_version: str
    at: float


@dataclass(frozen=True, slots=True)
class SessionLost:
    generation: int
    at: float
    reason: str
    outcome_unknown: tuple[CallHandle, ...]


@frozen_record
class CallFinished:
    call: CallHandle
    outcome: CallOutcome
    at: float
    result: JsonObject | None = None
    error: Any = None
    reason: str = ""


@frozen_record
class Progress:
    call: CallHandle
    progress: float | None
    at: float


class LeaveReceipt(enum.StrEnum):
    """How leaving ended. Only DELETED is a deletion receipt."""

    DELETED = "deleted"
    ALREADY_GONE = "already_gone"
    TERMINATION_UNSUPPORTED = "termination_unsupported"
    UNCONFIRMED = "unconfirmed"
    NO_SESSION = "no_session"


@dataclass(frozen=True, slots=True)
class LeaveFinished:
    receipt: LeaveReceipt
    at: float


type Notice = SessionEstablished | SessionLost | CallFinished | Progress | LeaveFinished


@frozen_record
class Output:
    """Everything one call into the core produced, in the order it happened."""

    commands: tuple[Command, ...] = ()
    """For the driver: carry out in order."""
    records: tuple[Record, ...] = ()
    """For the client ledger (`lab.wire.client_ledger`)."""
    notices: tuple[Notice, ...] = ()
    """For the application."""

    def __bool__(self) -> bool:
        return bool(self.commands or self.records or self.notices)

    def __add__(self, other: Output) -> Output:
        """This output, then `other` (in that order)."""
        return Output(
            self.commands + other.commands, self.records + other.records, self.notices + other.notices
        )


NOTHING: Final = Output()
"""The output of a call that produced nothing (immutable, so one serves every such call)."""


class Effects:
    """Where the core's private parts put what they produce during one public call; the
    public method hands it over with `take()` (so nothing is kept between calls)."""

    __slots__ = ("commands", "notices", "records")

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.records: list[Record] = []
        self.notices: list[Notice] = []

    def take(self) -> Output:
        if not (self.commands or self.records or self.notices):
            return NOTHING  # most events of a stream produce nothing: no tuples to build
        out = Output(tuple(self.commands), tuple(self.records), tuple(self.notices))
        self.commands.clear()
        self.records.clear()
        self.notices.clear()
        return out
