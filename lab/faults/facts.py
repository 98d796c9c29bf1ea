"""Facts about one request, read from its headers and body, and small pure rewrites.

The addon turns a mitmproxy request into a `RequestFacts` here (no mitmproxy types, so
it is tested on its own): the decision key, the matching `Target`, and what the tap
records (JSON-RPC id and method, tool, idempotency key).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Final

from lab.wire.event_ids import parse_event_id
from lab.wire.extensions import IDEMPOTENCY_META, LAB_CONN_HEADER
from lab.wire.frozen import frozen_record
from lab.wire.redact import Redactor
from lab.wire.revisions import LAST_EVENT_ID_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from lab.wire.sse import SseDecoder

MAX_BODY_PARSED: Final = 1 << 20
"""Bodies above this are not parsed for JSON-RPC facts (the server refuses them anyway)."""

type JsonRpcId = str | int


@frozen_record
class Target:
    """What a rule can be matched against: the facts of one request."""

    http_method: str
    stream: str | None
    """post, get, resume (GET with Last-Event-ID), or None for others (DELETE...)."""
    method: str | None = None
    tool: str | None = None
    session: str | None = None
    """Pseudonym of the session ID the request carried."""


@frozen_record
class RpcFacts:
    """What the POST body says (all None when it is not a JSON-RPC message)."""

    id: JsonRpcId | None = None
    method: str | None = None
    tool: str | None = None
    idempotency_key: str | None = None

    @property
    def is_request(self) -> bool:
        return self.id is not None and self.method is not None

    @property
    def is_write(self) -> bool:
        """A tool call carrying the lab's idempotency key: its answer is a write receipt."""
        return self.is_request and self.tool is not None and self.idempotency_key is not None


NO_RPC: Final = RpcFacts()


def rpc_facts(body: bytes | None) -> RpcFacts:
    """The JSON-RPC facts of a POST body; a batch yields its first request (or message)."""
    if not body or len(body) > MAX_BODY_PARSED:
        return NO_RPC
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return NO_RPC
    if isinstance(obj, list):
        msgs = [m for m in obj if isinstance(m, dict)]
        obj = next((m for m in msgs if "method" in m and "id" in m), msgs[0] if msgs else None)
    if not isinstance(obj, dict):
        return NO_RPC
    rid = obj.get("id")
    if not (isinstance(rid, str | int) and not isinstance(rid, bool)):
        rid = None
    method = obj.get("method") if isinstance(obj.get("method"), str) else None
    raw_params = obj.get("params")
    params: dict[str, object] = raw_params if isinstance(raw_params, dict) else {}
    name = params.get("name")
    tool = name if method == "tools/call" and isinstance(name, str) else None
    meta = params.get("_meta")
    key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
    return RpcFacts(rid, method, tool, key if isinstance(key, str) else None)


def stream_kind(http_method: str, last_event_id: str | None) -> str | None:
    """post, get, resume (GET with Last-Event-ID); None for anything else (DELETE...)."""
    if http_method == "POST":
        return "post"
    if http_method == "GET":
        return "resume" if last_event_id is not None else "get"
    return None


def decision_key(
    conn: str | None, http_method: str, path: str, rpc: RpcFacts, last_event_id: str | None
) -> str:
    """The stable key of a flow that decisions hash: the client's `x-lab-conn` when present.

    Without it (not a lab client), a digest of what identifies the request; identical
    requests then get identical decisions, which is still independent of arrival order.
    """
    if conn:
        return conn
    ident = json.dumps(
        [http_method, path, rpc.method, rpc.id, rpc.idempotency_key, last_event_id], default=str
    )
    return "anon:" + hashlib.sha256(ident.encode()).hexdigest()[:20]


@frozen_record
class RequestFacts:
    """Everything the addon and the tap need to know about one request."""

    flow: str
    key: str
    conn: str | None
    http_method: str
    path: str
    session_id: str | None
    """The raw session ID: kept in memory only (the admin control needs it), never written."""
    session: str | None
    """Its pseudonym."""
    rpc: RpcFacts
    origin: str | None
    last_event_id: str | None
    protocol_version: str | None
    token: str | None
    """The raw bearer token (memory only)."""

    @property
    def stream(self) -> str | None:
        return stream_kind(self.http_method, self.last_event_id)

    @property
    def target(self) -> Target:
        return Target(self.http_method, self.stream, self.rpc.method, self.rpc.tool, self.session)


def read_request(
    flow: str, method: str, path: str, headers: Mapping[str, str], body: bytes | None, redactor: Redactor
) -> RequestFacts:
    """The facts of a request from its method, path, headers and body (raw IDs kept in memory)."""
    method = method.upper()
    rpc = rpc_facts(body if method == "POST" else None)
    conn, lei, sid = (
        headers.get(LAB_CONN_HEADER),
        headers.get(LAST_EVENT_ID_HEADER),
        headers.get(SESSION_HEADER),
    )
    return RequestFacts(
        flow=flow,
        key=decision_key(conn, method, path, rpc, lei),
        conn=conn,
        http_method=method,
        path=path,
        session_id=sid,
        session=redactor.session(sid),
        rpc=rpc,
        origin=headers.get("origin"),
        last_event_id=lei,
        protocol_version=headers.get(PROTOCOL_VERSION_HEADER),
        token=bearer_token(headers.get("authorization")),
    )


def bearer_token(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def origin_allowed(origin: str, patterns: tuple[str, ...]) -> bool:
    """Whether an allow-list admits `origin`: exact (case-insensitive), or a pattern ending in
    `:*` for any numeric port — the reference server's rule, so `http://127.0.0.1:*` does not
    admit `http://127.0.0.1:80.evil.example`."""
    v = origin.lower()
    for p in patterns:
        p = p.lower()
        if p.endswith(":*"):
            head, sep, port = v.rpartition(":")
            if sep and head == p[:-2] and port.isascii() and port.isdigit() and len(port) <= 5:
                return True
        elif v == p:
            return True
    return False


def tampered_id(event_id: str) -> str:
    """The same ID with its last character changed: an `e1` ID then fails its MAC check."""
    if not event_id:
        return "x"
    last = event_id[-1]
    return event_id[:-1] + ("A" if last != "A" else "B")


def garbage_id(decision_id: str) -> str:
    return f"garbage-{decision_id}"


def stream_of(event_id: str | None) -> str | None:
    """The stream ID an `e1` event ID names (None for other IDs)."""
    if not event_id:
        return None
    p = parse_event_id(event_id)
    return None if p is None else p.stream_id


def response_to(data: str, rid: JsonRpcId | None) -> dict[str, object] | None:
    """The JSON-RPC response in `data` (one SSE event's data, or a JSON body) whose id is
    `rid` (of the same JSON type); None when it is something else. A batch answers with
    its matching member."""
    if rid is None or ('"result"' not in data and '"error"' not in data):
        return None
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    for m in obj if isinstance(obj, list) else [obj]:
        if (
            isinstance(m, dict)
            and ("result" in m or "error" in m)
            and m.get("id") == rid
            and type(m.get("id")) is type(rid)
        ):
            return m
    return None


def answers_request(body: bytes, sse: bool, rid: JsonRpcId | None) -> bool:
    """Whether a complete response body (SSE or JSON) carries the JSON-RPC response to `rid`."""
    text = body.decode("utf-8", errors="replace")
    if not sse:
        return response_to(text, rid) is not None
    decoder = SseDecoder()
    events = decoder.feed(body)
    decoder.end_of_stream()
    return any(ev.is_message and response_to(ev.data, rid) is not None for ev in events)
