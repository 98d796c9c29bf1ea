"""The reference server's HTTP vocabulary: the request as it parsed it, its body read
within a bound, a refusal, the responses it sends (plain ASGI), and the check that JSON
text is Unicode."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from lab.server.model import Session
from lab.wire import jsonrpc

type Scope = MutableMapping[str, Any]
type Message = MutableMapping[str, Any]
type Receive = Callable[[], Awaitable[Message]]
type Send = Callable[[Message], Awaitable[None]]
type Headers = list[tuple[bytes, bytes]]


class Refused(Exception):
    """A request answered with an error status (reason goes to the ledger)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str = "",
        headers: Headers | None = None,
        *,
        code: int | None = None,
        mid: jsonrpc.JsonRpcId | None = None,
        data: object = None,
    ):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.message = message or reason.replace("_", " ")
        self.headers = headers or []
        self.code = code
        """The JSON-RPC error code of the answer (None: parse error or invalid request)."""
        self.mid = mid
        """The request's ID, where it was read (the modern era answers it)."""
        self.data = data


class Request:
    __slots__ = ("conn", "headers", "method", "origin_allowed", "path", "scope", "session")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            if name in self.headers:
                # A repeated header we care about is ambiguous: make it unusable.
                self.headers[name] = self.headers[name] + "," + v.decode("latin-1")
            else:
                self.headers[name] = v.decode("latin-1")
        self.conn = self.headers.get("x-lab-conn")
        self.session: Session | None = None
        self.origin_allowed: bool | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


async def read_body(receive: Receive, max_body: int) -> bytes:
    """The request's whole body; Refused 413 once it passes `max_body` bytes, 400 if the
    client goes away before its end."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise Refused(400, "client_gone", "client went away")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise Refused(413, "body_too_large", f"body larger than {max_body} bytes")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def until_disconnect(receive: Receive) -> None:
    """Wait for the client to go away (after the request's whole body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_whole(send: Send, status: int, ctype: bytes, body: bytes, headers: Headers | None) -> None:
    """A complete response with its length (no chunked encoding for a body known whole)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", ctype), (b"content-length", b"%d" % len(body)), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_plain(send: Send, status: int, text: str, headers: Headers | None = None) -> None:
    await _send_whole(send, status, b"text/plain; charset=utf-8", text.encode(), headers)


async def send_json(send: Send, status: int, obj: object, headers: Headers | None = None) -> None:
    await send_json_text(send, status, jsonrpc.dumps(obj), headers)


async def send_json_text(send: Send, status: int, text: str, headers: Headers | None = None) -> None:
    """JSON already serialized (the bytes digested are the bytes sent)."""
    await _send_whole(send, status, b"application/json", text.encode(), headers)


async def send_empty(send: Send, status: int, headers: Headers | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", b"0"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def send_refusal(send: Send, r: Refused, mid: jsonrpc.JsonRpcId | None = None) -> None:
    code = r.code
    if code is None:
        code = jsonrpc.PARSE_ERROR if r.reason == "parse_error" else jsonrpc.INVALID_REQUEST
    await send_json(
        send, r.status, jsonrpc.error(mid if r.mid is None else r.mid, code, r.message, r.data), r.headers
    )


_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: a pair is fine, a lone one is not Unicode."""


def lone_surrogate(raw: bytes, value: object) -> str | None:
    """Where in the decoded JSON `value` (of the body `raw`) a string holds a lone
    surrogate (`$.params.arguments.text`), or None. Such text cannot be encoded as UTF-8,
    so it can be neither answered nor recorded: the request is refused before it is
    performed. Bodies without a surrogate escape are not walked."""
    if _MAYBE_SURROGATE.search(raw) is None:
        return None
    return _find(value, "$")


def _find(value: object, root: str) -> str | None:
    stack: list[tuple[object, str]] = [(value, root)]  # no recursion: bodies may nest deeply
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not _is_unicode(v):
                return path
        elif isinstance(v, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(v))))
        elif isinstance(v, dict):
            for k in reversed(list(v)):
                name = k.encode("utf-8", "backslashreplace").decode()
                if name != k:
                    return f"{path}.{name} (a key)"
                stack.append((v[k], f"{path}.{k}"))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def read_json_post(req: Request, receive: Receive, max_body: int) -> tuple[bytes, object]:
    """A POST's JSON body, as both protocol eras take it: its bytes and their value.
    Refused: Content-Type not JSON 415, Accept without JSON and SSE 406, too large 413
    (read_body), not JSON 400 (parse error), a string that is not Unicode 400."""
    ctype = (req.header("content-type") or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise Refused(415, "bad_content_type", "Content-Type must be application/json")
    accept = (req.header("accept") or "").lower()
    if "application/json" not in accept or "text/event-stream" not in accept:
        raise Refused(406, "bad_accept", "Accept must list application/json and text/event-stream")
    raw = await read_body(receive, max_body)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise Refused(400, "parse_error", f"parse error: {e}") from None
    where = lone_surrogate(raw, body)
    if where is not None:
        raise Refused(
            400,
            "not_unicode",
            f"invalid request: the string at {where} holds a lone surrogate (not Unicode)",
        )
    return raw, body
