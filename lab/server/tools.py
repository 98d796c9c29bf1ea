"""The reference server's tools: read-only, streaming, and a write with idempotency.

    echo           read-only: returns its text
    clock          read-only: the server's time
    ticker         streaming: N progress notifications at an interval on the request's
                   POST stream; with `close_after` the server closes the connection every
                   K events (sending `retry` first) and the client resumes with GET
    ledger.append  write: a business side effect, once per idempotency key
                   (params._meta["mcp-lab/idempotency-key"]); a retry with the same key, even
                   after the first attempt's stream was cut, gets the original receipt;
                   a performed write is announced on the session's standalone stream as
                   a `notifications/message` (logger `mcp-lab/ledger`)

A tool runs as a task of its own: the client's connection dropping does not stop it.
`dispatch` answers every request but initialize: tools/call, tools/list, ping and
logging/setLevel (the server declares `logging`, so it honours the client's level).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Protocol

from lab.server import ledger as L
from lab.server.defects import Defect
from lab.server.model import Stream
from lab.server.state import LOG_LEVELS, ServerState
from lab.wire import jsonrpc
from lab.wire.extensions import IDEMPOTENCY_META


class ToolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


MODERN_PSEUDONYM = "modern"
"""The ledger's session column for a write asked in the modern era (it has no session)."""


class CallSite(Protocol):
    """Where a tool call runs and what it may send: a session's POST stream in the
    handshake era (`SessionSite`), the request's own response in the modern era
    (lab.server.modern)."""

    @property
    def subject(self) -> str | None:
        """The bearer token's subject (None without tokens): whose idempotency keys."""
        ...

    @property
    def pseudonym(self) -> str:
        """The session's pseudonym in the ledger (the modern era has none: `modern`)."""
        ...

    def emit(self, data: str, kind: str) -> None:
        """A message about the call, on its stream (`kind` as in the ledger)."""
        ...

    def progress_sent(self, data: str) -> None:
        """A progress notification, on its stream."""
        ...

    def log(self, level: str, logger: str, data: Any) -> None:
        """A `notifications/message` the server may send unasked (where it can)."""
        ...

    def poll(self, close_after: int, retry_ms: int) -> None:
        """The ticker's `close_after` (where the era has server-initiated closes)."""
        ...


@dataclass(slots=True)
class SessionSite:
    """A call of the handshake era: on its session's POST stream."""

    state: ServerState
    stream: Stream

    @property
    def subject(self) -> str | None:
        return self.stream.session.subject

    @property
    def pseudonym(self) -> str:
        return self.stream.session.pseudonym

    def emit(self, data: str, kind: str) -> None:
        self.state.emit(self.stream, data, kind, None, time.time())

    def progress_sent(self, data: str) -> None:
        now = time.time()
        self.state.emit(self.stream, data, "notification", None, now)
        g = self.stream.session.standalone
        if Defect.BROADCAST in self.state.defects and g is not None and g.closed_at is None:
            # defect: the same message on the standalone GET too (the ledger's kind says so)
            self.state.emit(g, data, "stray_notification", None, now)

    def log(self, level: str, logger: str, data: Any) -> None:
        self.state.log_message(self.stream.session, level, logger, data, time.time())

    def poll(self, close_after: int, retry_ms: int) -> None:
        self.state.set_polling(self.stream, close_after, retry_ms)


@dataclass(slots=True)
class ToolCall:
    state: ServerState
    site: CallSite
    request_id: jsonrpc.JsonRpcId
    arguments: dict[str, Any]
    meta: dict[str, Any]

    def progress(self, n: float, total: float | None = None, message: str | None = None) -> None:
        token = self.meta.get("progressToken")
        if token is None:
            return
        if message is None and type(n) is int and (total is None or type(total) is int):
            data = progress_json(token, n, total)  # a ticker's every event: no encoder
        else:
            params: dict[str, Any] = {"progressToken": token, "progress": n}
            if total is not None:
                params["total"] = total
            if message is not None:
                params["message"] = message
            data = jsonrpc.dumps(jsonrpc.notification(jsonrpc.PROGRESS, params))
        self.site.progress_sent(data)


def progress_json(token: jsonrpc.JsonRpcId, n: int, total: int | None) -> str:
    """`jsonrpc.dumps` of a progress notification with whole numbers and no message, the
    same text, written from a template: json's encoder, set up anew per call, was a
    seventh to a quarter of the server's CPU on a ticker's stream (py-spy, a gate run and
    bench/bench_server.py). Only the token goes through the encoder."""
    if isinstance(token, str):
        tok = encode_basestring(token)
    elif type(token) is int:  # not bool, whose JSON is true/false
        tok = str(token)
    else:
        tok = jsonrpc.dumps(token)
    tail = "}}" if total is None else f',"total":{total}}}}}'
    return f'{{"jsonrpc":"2.0","method":"{jsonrpc.PROGRESS}","params":{{"progress":{n},"progressToken":{tok}{tail}'


def _text(text: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if extra:
        out["structuredContent"] = extra
    return out


def _int_arg(args: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = args.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ToolError(jsonrpc.INVALID_PARAMS, f"{name} must be an integer within {lo}..{hi}")
    return v


async def echo(call: ToolCall) -> dict[str, Any]:
    text = call.arguments.get("text", "")
    if not isinstance(text, str):
        raise ToolError(jsonrpc.INVALID_PARAMS, "text must be a string")
    return _text(text)


async def clock(call: ToolCall) -> dict[str, Any]:
    now = time.time()
    return _text(f"{now:.6f}", epoch=now)


async def ticker(call: ToolCall) -> dict[str, Any]:
    count = _int_arg(call.arguments, "count", 5, 0, 100_000)
    interval = _int_arg(call.arguments, "interval_ms", 100, 0, 60_000) / 1000.0
    close_after = call.arguments.get("close_after")
    if close_after is not None:
        call.site.poll(
            _int_arg(call.arguments, "close_after", 0, 1, 100_000),
            _int_arg(call.arguments, "retry_ms", 500, 0, 60_000),
        )
    for i in range(count):
        if interval > 0 or i % 64 == 63:
            await asyncio.sleep(interval)  # also yields now and then when interval is 0
        call.progress(i + 1, count)
    return _text(f"ticked {count}", count=count)


async def ledger_append(call: ToolCall) -> dict[str, Any]:
    key = call.meta.get(IDEMPOTENCY_META)
    if not isinstance(key, str) or not key:
        raise ToolError(jsonrpc.INVALID_PARAMS, f"a write needs params._meta[{IDEMPOTENCY_META!r}]")
    entry = call.arguments.get("entry", "")
    if not isinstance(entry, str):
        raise ToolError(jsonrpc.INVALID_PARAMS, "entry must be a string")
    state, site = call.state, call.site
    now = time.time()
    ikey = (site.subject, key)
    receipt = state.receipts.get(ikey)
    if Defect.NO_IDEMPOTENCY in state.defects:  # defect: a repeated key performs the write again
        receipt = None
    elif Defect.MODERN_NO_IDEMPOTENCY in state.defects and site.pseudonym == MODERN_PSEUDONYM:
        receipt = None  # defect: the same, on the modern era's path only
    effect = "replayed" if receipt is not None else "performed"
    if receipt is None:
        # Check-and-set without an await in between: two concurrent retries cannot both perform.
        receipt = f"r-{secrets.token_hex(8)}"
        state.receipts[ikey] = receipt
    # The digest of what was asked lets the checker see one write performed twice under two
    # keys (a client that re-ran it as a new operation): the key alone cannot show that.
    asked = jsonrpc.dumps({"tool": "ledger.append", "arguments": call.arguments})
    state.ledger.write(
        L.INSERT_DISPATCH,
        (
            key,
            site.pseudonym,
            site.subject,
            str(call.request_id),
            "ledger.append",
            effect,
            receipt,
            now,
            hashlib.sha256(asked.encode()).hexdigest(),
        ),
    )
    if effect == "performed":
        # The side effect is durable before anyone is told it happened.
        try:
            await asyncio.wrap_future(state.ledger.barrier())
        except L.LedgerFailed:
            raise ToolError(
                jsonrpc.INTERNAL_ERROR, "the server's ledger failed: this write's outcome is unknown"
            ) from None
        # A log message, which the server declares (capability `logging`) and may send
        # unasked; `notifications/resources/updated` would need `resources` and a subscription.
        site.log("info", "mcp-lab/ledger", {"receipt": receipt, "uri": f"lab://ledger/{receipt}"})
        if Defect.UNDECLARED_CAPABILITY in state.defects:  # defect: a capability never declared
            note = jsonrpc.notification("notifications/resources/updated", {"uri": f"lab://ledger/{receipt}"})
            site.emit(jsonrpc.dumps(note), "notification")
    # A retry is answered with the original receipt, byte for byte: whether this call
    # performed or replayed the write is the ledger's business (`dispatches.effect`), not
    # the answer's, so the wire shows one result per key unless a write really ran twice.
    return _text(receipt, receipt=receipt, entry=entry)


TOOLS: dict[str, Callable[[ToolCall], Awaitable[dict[str, Any]]]] = {
    "echo": echo,
    "clock": clock,
    "ticker": ticker,
    "ledger.append": ledger_append,
}


async def dispatch(state: ServerState, st: Stream, msg: jsonrpc.Message) -> jsonrpc.JsonObject:
    """The result of a request other than initialize (ToolError for a JSON-RPC error)."""
    assert msg.id is not None
    params = msg.params
    if msg.method == "tools/call":
        name = params.get("name")
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            raise ToolError(jsonrpc.INVALID_PARAMS, f"unknown tool {name!r}")
        args = params.get("arguments") or {}
        meta = params.get("_meta") or {}
        if not isinstance(args, dict) or not isinstance(meta, dict):
            raise ToolError(jsonrpc.INVALID_PARAMS, "arguments and _meta must be objects")
        return await tool(ToolCall(state, SessionSite(state, st), msg.id, args, meta))
    if msg.method == "tools/list":
        return {"tools": TOOL_LIST}
    if msg.method == "ping":
        return {}
    if msg.method == "logging/setLevel":
        level = params.get("level")
        if level not in LOG_LEVELS:
            raise ToolError(jsonrpc.INVALID_PARAMS, f"level must be one of {', '.join(LOG_LEVELS)}")
        state.set_log_level(st.session, level)
        return {}
    raise ToolError(jsonrpc.METHOD_NOT_FOUND, f"method not found: {msg.method}")


TOOL_LIST = [
    {
        "name": "echo",
        "description": "Return the text (read-only).",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "clock",
        "description": "The server's time, epoch seconds (read-only).",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "ticker",
        "description": "N progress notifications at an interval; optional server-initiated close every K events.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 0},
                "interval_ms": {"type": "integer", "minimum": 0},
                "close_after": {"type": ["integer", "null"], "minimum": 1},
                "retry_ms": {"type": ["integer", "null"], "minimum": 0},
            },
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "ledger.append",
        "description": f"Append an entry: a business side effect, once per params._meta[{IDEMPOTENCY_META!r}].",
        "inputSchema": {"type": "object", "properties": {"entry": {"type": "string"}}},
        # Truthful for the retry rule: called again with the same arguments it appends
        # again; only the same idempotency key (params._meta, the lab's convention) makes a
        # repetition a no-op, and the tool says it honours that key (`_meta`).
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
        "_meta": {IDEMPOTENCY_META: True},
    },
]
