"""What a client is told when it is made (`ClientConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.client._acceptance import ALL_CHECKS, Check
from lab.client._reconnect import BackoffPolicy
from lab.wire.errors import LocalProtocolError
from lab.wire.revisions import revision


@dataclass(frozen=True, slots=True)
class ClientConfig:
    client_id: str
    protocol_version: str = "2025-11-25"
    origin: str | None = "http://127.0.0.1"
    token: str | None = None
    auth_subject: str | None = None
    """Who the token belongs to (the client knows its own identity)."""
    open_standalone_stream: bool = True
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    max_attempts: int = 12
    """Attempts of each kind (resume, re-send, reopen) per loss before giving up: a call
    whose resumptions are used up is re-sent (same idempotency key); one whose re-sends
    are used up ends with outcome UNKNOWN."""
    max_delete_attempts: int = 3
    """DELETE requests in all (the first and its repetitions) before leaving unconfirmed."""
    resume_silence_s: float = 10.0
    """A resumed call stream must deliver a message within this many seconds of its
    resumption being answered; otherwise it counts as lost (cause `resume_silent`) and
    the recovery goes on: a server that answers a cursor with a stream that never
    carries anything must not make the client wait forever."""
    stream_idle_s: float = 30.0
    """A call stream on which no message arrives for this long counts as lost (cause
    `stream_idle`). Keep-alives (comments, priming events, duplicates) are not messages:
    they keep the driver's read timeout from firing but prove nothing about the call."""
    max_message_bytes: int = 16 * 1024 * 1024
    """The most one message may take: an SSE event still unfinished past this many
    characters, or a JSON body past this many bytes, closes its connection (cause
    `message_too_large`, the target's doing) before it is held in memory; the stream is
    then resumed like any lost one, within its attempts. (A target that sends a 100 MB
    event must not take the worker's memory, nor read as mere timeouts.)"""
    checks: frozenset[Check] = ALL_CHECKS
    """Acceptance checks; only tests switch some off to show what they stop."""
    client_name: str = "mcp-lab-client"
    retry_rule: bool = False
    """Re-send a call whose outcome is unknown only if the server said it is safe (the
    tool annotated read-only or idempotent, or the server honouring its idempotency key:
    `_tools.py`, which lists the tools once); else end it UNKNOWN. Off, every such call is
    re-sent with its key (the core alone, as its unit tests drive it); the lab's load
    turns it on."""

    def __post_init__(self) -> None:
        revision(self.protocol_version)  # KeyError naming what is supported
        if self.max_attempts < 1 or self.max_delete_attempts < 1:
            raise LocalProtocolError("max_attempts and max_delete_attempts must be >= 1")
        if not (self.resume_silence_s > 0 and self.stream_idle_s > 0):
            raise LocalProtocolError("resume_silence_s and stream_idle_s must be > 0")
        if self.max_message_bytes < 1024:
            raise LocalProtocolError("max_message_bytes must be >= 1024")
