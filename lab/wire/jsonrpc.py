"""JSON-RPC 2.0 messages as MCP uses them: parse, classify, build. No I/O."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any

from lab.wire.errors import RemoteProtocolError
from lab.wire.frozen import frozen_record

type JsonRpcId = str | int
type JsonObject = dict[str, Any]

PROGRESS = "notifications/progress"
CANCELLED = "notifications/cancelled"
INITIALIZED = "notifications/initialized"
INITIALIZE = "initialize"
DISCOVER = "server/discover"
"""The modern era's first request (2026-07-28): what the server serves, without a session."""

# JSON-RPC / MCP error codes the lab uses.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class MessageKind(enum.StrEnum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"
    ERROR = "error"

    @property
    def is_response(self) -> bool:
        return self in (MessageKind.RESPONSE, MessageKind.ERROR)


@frozen_record
class Message:
    """One classified JSON-RPC message."""

    kind: MessageKind
    id: JsonRpcId | None
    method: str | None
    body: JsonObject

    @property
    def params(self) -> JsonObject:
        p = self.body.get("params")
        return p if isinstance(p, dict) else {}

    @property
    def progress_token(self) -> JsonRpcId | None:
        """The progress token of a progress notification (or of a request's `_meta`)."""
        if self.kind is MessageKind.NOTIFICATION:
            tok = self.params.get("progressToken")
        else:
            meta = self.params.get("_meta")
            tok = meta.get("progressToken") if isinstance(meta, dict) else None
        return tok if _is_id(tok) else None


def _is_id(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


def classify(obj: object) -> Message:
    """Classify one decoded JSON value; RemoteProtocolError if it is not a JSON-RPC message."""
    if not isinstance(obj, dict):
        raise RemoteProtocolError("a JSON-RPC message must be an object")
    if obj.get("jsonrpc") != "2.0":
        raise RemoteProtocolError('missing or wrong "jsonrpc": "2.0"')
    has_id = "id" in obj
    mid = obj.get("id")
    if has_id and mid is not None and not _is_id(mid):
        raise RemoteProtocolError("id must be a string or an integer")
    method = obj.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise RemoteProtocolError("method must be a string")
        if "params" in obj and not isinstance(obj["params"], dict | list):
            raise RemoteProtocolError("params must be an object or an array")
        if has_id:
            if mid is None:
                raise RemoteProtocolError("a request id must not be null")
            return Message(MessageKind.REQUEST, mid, method, obj)
        return Message(MessageKind.NOTIFICATION, None, method, obj)
    if "result" in obj and "error" not in obj and has_id and mid is not None:
        return Message(MessageKind.RESPONSE, mid, None, obj)
    if "error" in obj and "result" not in obj and has_id:
        err = obj["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int):
            raise RemoteProtocolError("error must be an object with an integer code")
        return Message(MessageKind.ERROR, mid, None, obj)
    raise RemoteProtocolError("neither a request, a notification nor a response")


_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""json's own scanner (the C one where it is built), as `json.loads` ends up calling it."""


def loads(data: str | bytes) -> Any:
    """`json.loads`, the same value or the same error. A text that is one JSON value with
    nothing around it (a message as it comes) goes straight to json's scanner: the Python
    wrapper around it (whitespace regexes, a decoder call) was half of `json.loads`'s time
    for a progress notification (5.2 -> 2.8 µs). Anything else (bytes, whitespace around,
    trailing data, an error) is handed to `json.loads` itself, for its exact answer."""
    if type(data) is str:
        try:
            obj, end = _scan_once(data, 0)
        except StopIteration:
            pass
        else:
            if end == len(data):
                return obj
    return json.loads(data)


def parse_message(data: str | bytes) -> Message:
    """Decode and classify one message; RemoteProtocolError on bad JSON or shape."""
    try:
        obj = loads(data)
    except (ValueError, RecursionError) as e:
        raise RemoteProtocolError(f"not JSON: {e}") from None
    return classify(obj)


def dumps(obj: object) -> str:
    """Compact, deterministic JSON (the bytes we digest are the bytes we send)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def request(mid: JsonRpcId, method: str, params: JsonObject | None = None) -> JsonObject:
    msg: JsonObject = {"jsonrpc": "2.0", "id": mid, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification(method: str, params: JsonObject | None = None) -> JsonObject:
    msg: JsonObject = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def result(mid: JsonRpcId, value: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": mid, "result": value}


def error(mid: JsonRpcId | None, code: int, message: str, data: object = None) -> JsonObject:
    err: JsonObject = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": mid, "error": err}
