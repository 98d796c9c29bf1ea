"""Settings of the reference server, and their parsing (pure; ValueError with a clear message).

Two ways in, one shape: `lab serve` flags, or `lab serve --config FILE` with a JSON object
whose keys are the field names of `ServerConfig` (docs/targets.md and README.md show it).
Structured data never goes through a joined string: a token subject or an Origin may hold
any character, commas and leading dashes included.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.server.defects import DEFECT_NAMES
from lab.wire.revisions import MODERN_REVISIONS, SUPPORTED_REVISIONS

CURSOR_REJECT_STATUSES = (400, 409, 410, 422)
EVENT_ID_SCHEMES = ("e1", "seq", "uuid")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    ledger_path: str | None = None
    """SQLite ledger file; None keeps no ledger (the server still works)."""
    store: str | None = None
    """SQLite store of sessions, streams and their events (lab/server/store.py), so that a
    restart keeps them; None keeps them in memory only (a restart loses them)."""
    ledger_key: bytes = b"\x00" * 32
    """Per-run HMAC key for session pseudonyms (LAB_LEDGER_KEY; hex in a config file)."""
    event_id_key: bytes = b""
    """Key of the event-ID MAC; random per process when empty (hex in a config file)."""
    tokens: dict[str, str] = field(default_factory=dict)
    """Bearer token -> subject. Empty: no authentication (loopback only)."""
    allowed_origins: tuple[str, ...] = (
        "http://127.0.0.1:*",
        "http://localhost:*",
        "http://127.0.0.1",
        "http://localhost",
    )
    """Origin allow-list; `*` matches a port. A request without Origin is allowed (not a browser)."""
    allowed_hosts: tuple[str, ...] = ("127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost")
    """Host header allow-list (DNS-rebinding protection)."""
    session_ttl: float = 300.0
    """Idle seconds after which a session expires (later requests: 404)."""
    refuse_delete: bool = False
    """Answer DELETE with 405 (a server that does not let clients terminate sessions)."""
    cursor_policy: str = "reject"
    """`reject`: a bad Last-Event-ID gets `cursor_reject_status`; `fresh`: a new standalone stream."""
    cursor_reject_status: int = 400
    max_streams: int = 10_000
    """Concurrent SSE connections; beyond: 503 + Retry-After."""
    max_rps: float = 0.0
    """Requests per second (token bucket); beyond: 429 + Retry-After. 0 = unlimited."""
    retry_after: int = 1
    """Seconds advised in Retry-After when shedding load."""
    resumable_fraction: float = 1.0
    """Rollout: the fraction of sessions whose streams are resumable (carry event IDs)."""
    rollback: bool = False
    """Rollback: new streams are not resumable; cursors of streams opened before stay valid."""
    admin_token: str | None = None
    """Token for /lab-admin/*; None disables the admin control."""
    json_answers: bool = False
    """Answer `tools/call` of every tool but `ticker` with an `application/json` body instead
    of an SSE stream (legal; some servers answer that way, e.g. the SDKs' JSON mode)."""
    heartbeat_ms: int = 0
    """If > 0, a `notifications/message` on each live standalone stream at this period."""
    keepalive_s: float = 10.0
    """An SSE comment on a stream silent this long, so that clients' idle timeouts (and
    proxies') only catch dead connections. 0 disables it."""
    max_body: int = 1 << 20
    """Bytes of a request body; beyond: 413."""
    event_retention: int = 10_000
    """Events kept per stream for replay; an older cursor is rejected."""
    completed_stream_ttl: float = 120.0
    """Seconds a completed stream stays resumable."""
    protocol_versions: tuple[str, ...] = SUPPORTED_REVISIONS + MODERN_REVISIONS
    event_ids: str = "e1"
    """`e1`: structured, MAC'd IDs (lab.wire.event_ids); `seq`: server-wide sequential integers;
    `uuid`: random UUIDs. The last two are opaque, as most servers' IDs are."""
    defects: tuple[str, ...] = ()
    """Deliberate misbehaviours (lab.server.defects), for proving that the checker catches them."""
    max_sessions: int = 10_000
    """Live sessions. At the limit a new `initialize` evicts the least recently used idle
    session (no open connection, no running tool); if every session is busy: 503 + Retry-After."""
    max_session_streams: int = 64
    """Open (not completed) streams per session. At the limit a new stream closes the
    session's oldest abandoned standalone stream (a GET nobody is connected to); if there is
    none: 429 + Retry-After."""
    max_session_event_bytes: int = 1 << 20
    """Bytes of events a session retains for replay (and of unsent backlog per connection).
    Beyond it the oldest are dropped: completed streams first, then the oldest events of
    the stream that grows; a cursor into what was dropped is rejected. A connection whose
    unsent backlog exceeds it is closed (`slow_consumer`); the stream goes on."""
    max_header_bytes: int = 64 * 1024
    """Bytes of a request's start line and headers; beyond: 431 and the connection is closed."""
    header_timeout: float = 10.0
    """Seconds to receive a request's start line and headers (from the connection's start or
    the request's first byte); beyond: 408 and the connection is closed."""
    body_timeout: float = 30.0
    """Seconds to receive a request's body once its headers are in; beyond: 408 (or, if a
    response has started, the connection is closed)."""

    def check(self) -> None:
        """ValueError naming the setting and what was expected."""
        if not self.tokens and not _is_loopback(self.host):
            raise ValueError(
                f"refusing to bind {self.host}: without --tokens the server only binds loopback "
                "(127.0.0.1, ::1, localhost); configure bearer tokens to serve anything else"
            )
        if (
            self.store is not None
            and self.ledger_path is not None
            and _same_file(self.store, self.ledger_path)
        ):
            raise ValueError("store and ledger must be two files: the store holds what the ledger never may")
        if self.cursor_policy not in ("reject", "fresh"):
            raise ValueError(f"cursor_policy must be reject or fresh, got {self.cursor_policy!r}")
        if self.cursor_reject_status not in CURSOR_REJECT_STATUSES:
            raise ValueError(f"cursor_reject_status must be one of {CURSOR_REJECT_STATUSES}")
        if not 0.0 <= self.resumable_fraction <= 1.0:
            raise ValueError("resumable_fraction must be within 0..1")
        if self.session_ttl <= 0 or self.max_streams < 1 or self.max_rps < 0:
            raise ValueError("session_ttl and max_streams must be > 0, max_rps >= 0")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ValueError("admin_token must be at least 8 characters")
        known = SUPPORTED_REVISIONS + MODERN_REVISIONS
        for v in self.protocol_versions:
            if v not in known:
                raise ValueError(f"unsupported protocol version {v!r}; supported: {', '.join(known)}")
        if not self.protocol_versions:
            raise ValueError("protocol_versions must name at least one revision")
        if self.event_ids not in EVENT_ID_SCHEMES:
            raise ValueError(
                f"event_ids must be one of {', '.join(EVENT_ID_SCHEMES)}, got {self.event_ids!r}"
            )
        for d in self.defects:
            if d not in DEFECT_NAMES:
                raise ValueError(f"unknown defect {d!r}; known: {', '.join(DEFECT_NAMES)}")
        for name in (
            "max_sessions",
            "max_session_streams",
            "max_session_event_bytes",
            "max_header_bytes",
            "max_body",
            "event_retention",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


def _same_file(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_tokens(spec: str) -> dict[str, str]:
    """`token=subject,token2=subject2` -> {token: subject} (a subject with a comma needs --config)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        token, sep, subject = part.partition("=")
        if not sep or not token or not subject:
            raise ValueError(f"--tokens expects token=subject pairs separated by commas, got {part!r}")
        out[token] = subject
    return out


def parse_list(spec: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in spec.split(",") if p.strip())


# ---------------------------------------------------------------------- --config FILE

_HINTS = typing.get_type_hints(ServerConfig)
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ServerConfig))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings a `--config` JSON file holds, typed as `ServerConfig` wants them.

    ValueError naming the file, the key and what was expected: an unknown key, a value of
    the wrong type, a file that is not a JSON object. Values are checked for type here and
    for range by `ServerConfig.check`."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{p}: cannot read: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{p}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a JSON object of settings, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _HINTS:
            raise ValueError(f"{p}: unknown key {key!r}; known keys: {', '.join(FIELDS)}")
        try:
            out[key] = _typed(_HINTS[key], value)
        except ValueError as e:
            raise ValueError(f"{p}: key {key!r}: {e}") from None
    return out


def _typed(hint: Any, value: Any) -> Any:
    """`value` (from JSON) as type `hint`, or ValueError saying what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        (inner,) = (a for a in args if a is not type(None))
        return _typed(inner, value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_show(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_show(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {_show(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {_show(value)}")
        return _unicode(value)
    if hint is bytes:
        if not isinstance(value, str):
            raise ValueError(f"expected a hex string, got {_show(value)}")
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise ValueError("expected a hex string (0-9, a-f)") from None
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected a list of strings, got {_show(value)}")
        return tuple(_unicode(v) for v in value)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
            raise ValueError(f"expected an object of string to non-empty string, got {_show(value)}")
        if any(not k for k in value):
            raise ValueError("an empty key is not allowed")
        return {_unicode(k): _unicode(v) for k, v in value.items()}
    raise AssertionError(f"no JSON form for settings of type {hint!r}")  # a new field needs a case


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{_show(text)} is not Unicode text (a lone surrogate)") from None
    return text


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def matches(value: str, patterns: tuple[str, ...]) -> bool:
    """Case-insensitive match against an allow-list; a pattern ending in `:*` matches any port
    (digits only: `http://127.0.0.1:*` does not match `http://127.0.0.1:80.evil.example`)."""
    v = value.lower()
    for p in patterns:
        p = p.lower()
        if p.endswith(":*"):
            head, sep, port = v.rpartition(":")
            if sep and head == p[:-2] and port.isdigit() and port.isascii() and len(port) <= 5:
                return True
        elif v == p:
            return True
    return False
