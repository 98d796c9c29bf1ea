"""Settings of the reference server, and their parsing (pure; ValueError with a clear message)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from lab.wire.revisions import SUPPORTED_REVISIONS

CURSOR_REJECT_STATUSES = (400, 409, 410, 422)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    ledger_path: str | None = None
    """SQLite ledger file; None keeps no ledger (the server still works)."""
    ledger_key: bytes = b"\x00" * 32
    """Per-run HMAC key for session pseudonyms (LAB_LEDGER_KEY)."""
    event_id_key: bytes = b""
    """Key of the event-ID MAC; random per process when empty."""
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
    heartbeat_ms: int = 0
    """If > 0, a `notifications/message` on each live standalone stream at this period."""
    keepalive_s: float = 10.0
    """An SSE comment on a stream silent this long, so that clients' idle timeouts (and
    proxies') only catch dead connections. 0 disables it."""
    max_body: int = 1 << 20
    event_retention: int = 10_000
    """Events kept per stream for replay; an older cursor is rejected."""
    completed_stream_ttl: float = 120.0
    """Seconds a completed stream stays resumable."""
    protocol_versions: tuple[str, ...] = SUPPORTED_REVISIONS

    def check(self) -> None:
        """ValueError naming the setting and what was expected."""
        if not self.tokens and not _is_loopback(self.host):
            raise ValueError(
                f"refusing to bind {self.host}: without --tokens the server only binds loopback "
                "(127.0.0.1, ::1, localhost); configure bearer tokens to serve anything else"
            )
        if self.cursor_policy not in ("reject", "fresh"):
            raise ValueError(f"--cursor-policy must be reject or fresh, got {self.cursor_policy!r}")
        if self.cursor_reject_status not in CURSOR_REJECT_STATUSES:
            raise ValueError(f"--cursor-reject-status must be one of {CURSOR_REJECT_STATUSES}")
        if not 0.0 <= self.resumable_fraction <= 1.0:
            raise ValueError("--resumable-fraction must be within 0..1")
        if self.session_ttl <= 0 or self.max_streams < 1 or self.max_rps < 0:
            raise ValueError("--session-ttl and --max-streams must be > 0, --max-rps >= 0")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ValueError("--admin-token must be at least 8 characters")
        for v in self.protocol_versions:
            if v not in SUPPORTED_REVISIONS:
                raise ValueError(
                    f"unsupported protocol version {v!r}; supported: {', '.join(SUPPORTED_REVISIONS)}"
                )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_tokens(spec: str) -> dict[str, str]:
    """`token=subject,token2=subject2` -> {token: subject}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        token, sep, subject = part.partition("=")
        if not sep or not token or not subject:
            raise ValueError(f"--tokens expects token=subject pairs separated by commas, got {part!r}")
        out[token] = subject
    return out


def parse_list(spec: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in spec.split(",") if p.strip())


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
