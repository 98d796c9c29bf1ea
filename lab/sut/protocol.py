"""The adapter protocol's vocabulary: commands in, application-log records out (no I/O).

An adapter process hosts many client instances of one MCP implementation. It reads
commands as JSON lines on stdin and writes the application log (`mcpLabAppLog.v1`) as
JSON lines. `docs/clients.md` documents every command and record field with its unit;
this module is the one place that parses the commands and shapes the records, so the
shipped Python adapters, the host and (later) the checker agree on them.

Raw session IDs and tokens never appear in a record: sessions are named by the same
HMAC pseudonym every other ledger of the run uses (`lab.wire.redact.Redactor`), and
free text an implementation produced (exception messages, its log lines) goes through
`Scrubber` first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from lab.wire.jsonrpc import JsonRpcId

SCHEMA: Final = "mcpLabAppLog.v1"

COMMANDS: Final = ("start", "call", "cancel", "leave", "stop")

RECORD_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "ready": ("schema", "adapter", "implementation", "pid"),
    "started": ("client", "session", "protocolVersion", "elapsed_s"),
    "start_failed": ("client", "error"),
    "deliver": ("client", "session", "kind", "id", "method", "call", "digest"),
    "outcome": ("client", "session", "call", "id", "status", "error", "code", "elapsed_s"),
    "reconnect": ("client", "session", "kind"),
    "notice": ("client", "session", "text"),
    "client_failed": ("client", "session", "error"),
    "left": ("client", "session"),
    "rejected": ("line", "error"),
    "stopped": ("clients",),
    "crashed": ("error",),
}
"""Every application-log record (`ev`) and its fields besides `ev` and `t` (docs/clients.md)."""

CallStatus = Literal["ok", "error", "exception", "cancelled"]
DeliveryKind = Literal["response", "error", "notification", "request"]
ReconnectKind = Literal["resume", "reopen", "reinitialize"]


class CommandError(ValueError):
    """A command line the adapter cannot carry out; the text names the field and what was expected."""


@dataclass(frozen=True, slots=True)
class Start:
    client: str
    url: str
    protocol_version: str | None
    headers: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Call:
    client: str
    call: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class Cancel:
    call: str


@dataclass(frozen=True, slots=True)
class Leave:
    client: str


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Start | Call | Cancel | Leave | Stop


def _str(obj: dict[str, Any], key: str, cmd: str, *, optional: bool = False) -> str | None:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v:
        raise CommandError(f"{cmd}: {key!r} must be a non-empty string, got {v!r}")
    return v


def _req(obj: dict[str, Any], key: str, cmd: str) -> str:
    v = _str(obj, key, cmd)
    assert v is not None
    return v


def _obj(obj: dict[str, Any], key: str, cmd: str) -> dict[str, Any]:
    v = obj.get(key, {})
    if not isinstance(v, dict):
        raise CommandError(f"{cmd}: {key!r} must be a JSON object, got {type(v).__name__}")
    return v


def parse_command(line: str | bytes) -> Command:
    """One stdin line -> a command; CommandError says what is wrong with it."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise CommandError(f"not a JSON line: {e}") from None
    if not isinstance(obj, dict):
        raise CommandError(f"a command is a JSON object, got {type(obj).__name__}")
    cmd = obj.get("cmd")
    if cmd == "start":
        url = _req(obj, "url", cmd)
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"start: 'url' must be an http(s) URL, got {url!r}")
        headers = _obj(obj, "headers", cmd)
        if not all(isinstance(v, str) for v in headers.values()):
            raise CommandError("start: every value of 'headers' must be a string")
        return Start(
            _req(obj, "client", cmd),
            url,
            _str(obj, "protocolVersion", cmd, optional=True),
            dict(headers),
            _obj(obj, "options", cmd),
        )
    if cmd == "call":
        return Call(
            _req(obj, "client", cmd),
            _req(obj, "call", cmd),
            _req(obj, "tool", cmd),
            _obj(obj, "arguments", cmd),
            _req(obj, "idempotencyKey", cmd),
        )
    if cmd == "cancel":
        return Cancel(_req(obj, "call", cmd))
    if cmd == "leave":
        return Leave(_req(obj, "client", cmd))
    if cmd == "stop":
        return Stop()
    raise CommandError(f"'cmd' must be one of {', '.join(COMMANDS)}; got {cmd!r}")


def command_line(cmd: Command) -> str:
    """The JSON line for a command (what a host writes to an adapter's stdin)."""
    obj: dict[str, Any]
    match cmd:
        case Start():
            obj = {"cmd": "start", "client": cmd.client, "url": cmd.url, "headers": cmd.headers}
            if cmd.protocol_version is not None:
                obj["protocolVersion"] = cmd.protocol_version
            if cmd.options:
                obj["options"] = cmd.options
        case Call():
            obj = {
                "cmd": "call",
                "client": cmd.client,
                "call": cmd.call,
                "tool": cmd.tool,
                "arguments": cmd.arguments,
                "idempotencyKey": cmd.idempotency_key,
            }
        case Cancel():
            obj = {"cmd": "cancel", "call": cmd.call}
        case Leave():
            obj = {"cmd": "leave", "client": cmd.client}
        case Stop():
            obj = {"cmd": "stop"}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def canonical_json(message: object) -> str:
    """Keys sorted, no whitespace, non-ASCII as is: the reference server's own encoding, so
    the digest of a delivered message equals the digest of the SSE event that carried it."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def message_digest(message: object) -> str:
    """SHA-256 (64 hex digits) of the canonical JSON of a JSON-RPC message."""
    return hashlib.sha256(canonical_json(message).encode("utf-8")).hexdigest()


def describe(message: dict[str, Any]) -> tuple[DeliveryKind, JsonRpcId | None, str | None]:
    """(kind, JSON-RPC id, method) of a message as a JSON object."""
    mid = message.get("id")
    rid = mid if isinstance(mid, str | int) and not isinstance(mid, bool) else None
    method = message.get("method")
    if isinstance(method, str):
        return ("request" if rid is not None else "notification"), rid, method
    return ("error" if "error" in message else "response"), rid, None


class Scrubber:
    """Replaces every secret it was told about (raw session IDs, tokens) in free text."""

    __slots__ = ("_secrets",)

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}

    def add(self, secret: str, stand_in: str) -> None:
        if len(secret) >= 8:  # shorter strings would mangle ordinary words and never be secret
            self._secrets[secret] = stand_in

    def __call__(self, text: str) -> str:
        for secret, stand_in in self._secrets.items():
            if secret in text:
                text = text.replace(secret, stand_in)
        return text


def secrets_of_headers(headers: dict[str, str]) -> list[str]:
    """The credential values among start headers (a bearer token and the whole header value)."""
    out = []
    for name, value in headers.items():
        if name.lower() in ("authorization", "proxy-authorization", "cookie", "x-api-key"):
            out.append(value)
            _, _, rest = value.partition(" ")
            if rest:
                out.append(rest)
    return out


def parse_record(line: str) -> dict[str, Any]:
    """One application-log line -> its record; ValueError names what is missing or wrong."""
    try:
        rec = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not a JSON line: {e}") from None
    if not isinstance(rec, dict):
        raise ValueError("a record is a JSON object")
    ev = rec.get("ev")
    fields = RECORD_FIELDS.get(ev) if isinstance(ev, str) else None
    if fields is None:
        raise ValueError(f"'ev' must be one of {', '.join(RECORD_FIELDS)}; got {ev!r}")
    if not isinstance(rec.get("t"), int | float):
        raise ValueError(f"{ev}: 't' must be a number (Unix seconds)")
    missing = [f for f in fields if f not in rec]
    if missing:
        raise ValueError(f"{ev}: missing {', '.join(missing)}")
    if ev == "ready" and rec["schema"] != SCHEMA:
        raise ValueError(f"ready: schema {rec['schema']!r} is not {SCHEMA}")
    return rec
