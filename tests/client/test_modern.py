"""The sans-IO core in the modern era (2026-07-28), fed by hand: no session, every request
names its revision and method in headers and `_meta`, a broken stream is re-issued as a
new request (never resumed), cancelling is closing the stream, leaving sends nothing.

The handshake era's behaviour of the same core is tests/client/test_client.py's; these
tests show the same parts following the modern era's rules (docs/eras.md)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping

import pytest

from lab.client import (
    CallFinished,
    CallOutcome,
    ClientConfig,
    ClientCore,
    CloseConnection,
    LeaveFinished,
    MemoryInbox,
    Output,
    Purpose,
    ReconnectBudget,
    SendRequest,
    State,
)
from lab.client._commands import LeaveReceipt
from lab.client._reconnect import BackoffPolicy
from lab.wire.client_ledger import Recovery
from lab.wire.redact import Redactor

MODERN = "2026-07-28"
SSE = [("content-type", "text/event-stream")]
JSON = [("content-type", "application/json")]


class Wire:
    """One modern client and what it asked for, in order."""

    def __init__(self, **cfg: object) -> None:
        config = ClientConfig(
            client_id="m1",
            protocol_version=MODERN,
            token="alice",
            auth_subject="alice",
            backoff=BackoffPolicy(0.2, 2.0),
            **cfg,  # type: ignore[arg-type]
        )
        self.core = ClientCore(
            config,
            inbox=MemoryInbox(),
            budget=ReconnectBudget(math.inf, now=0.0),
            redactor=Redactor(b"r" * 32),
            rng=random.Random(7),
        )
        self.now = 100.0
        self.sent: list[SendRequest] = []
        self.closed: list[int] = []
        self.out: list[Output] = []

    def take(self, out: Output) -> Output:
        self.out.append(out)
        for cmd in out.commands:
            if isinstance(cmd, SendRequest):
                self.sent.append(cmd)
            elif isinstance(cmd, CloseConnection):
                self.closed.append(cmd.conn_id)
        return out

    def last(self, purpose: Purpose) -> SendRequest:
        return [s for s in self.sent if s.purpose is purpose][-1]

    def json_answer(self, send: SendRequest, result: dict[str, object], status: int = 200) -> None:
        body = json.loads(send.body or b"{}")
        msg = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        self.take(self.core.response_head(send.conn_id, status, JSON, self.now))
        self.take(self.core.response_data(send.conn_id, json.dumps(msg).encode(), self.now))
        self.take(self.core.response_end(send.conn_id, self.now))

    def sse(self, send: SendRequest, *messages: Mapping[str, object]) -> None:
        self.take(self.core.response_head(send.conn_id, 200, SSE, self.now))
        data = b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages)
        self.take(self.core.response_data(send.conn_id, data, self.now))

    def connect(self, tools: list[dict[str, object]] | None = None) -> None:
        self.take(self.core.connect(self.now))
        self.json_answer(
            self.last(Purpose.DISCOVER), {"resultType": "complete", "supportedVersions": [MODERN]}
        )
        if tools is not None:
            self.json_answer(self.last(Purpose.TOOLS_LIST), {"resultType": "complete", "tools": tools})

    def finished(self) -> list[CallFinished]:
        return [n for o in self.out for n in o.notices if isinstance(n, CallFinished)]


def progress_of(rid: object) -> dict[str, object]:
    """The first progress notification of request `rid`."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": rid, "progress": 1},
    }


def body(send: SendRequest) -> dict[str, object]:
    return json.loads(send.body or b"{}")  # type: ignore[no-any-return]


def test_the_first_request_is_server_discover_and_no_session_follows() -> None:
    w = Wire()
    w.connect()
    (discover,) = w.sent
    assert discover.purpose is Purpose.DISCOVER and body(discover)["method"] == "server/discover"
    assert w.core.state is State.SESSION_ACTIVE and w.core.session_id is None
    # No initialized notification, no standalone GET stream: the era has neither.
    assert [s.purpose for s in w.sent] == [Purpose.DISCOVER]


def test_every_request_names_its_revision_and_method_in_headers_and_meta() -> None:
    w = Wire()
    w.connect()
    handle, out = w.core.call_tool("echo", {"text": "hi"}, w.now)
    w.take(out)
    for send in w.sent:
        meta = body(send)["params"]["_meta"]  # type: ignore[index]
        assert send.header("mcp-protocol-version") == MODERN
        assert meta["io.modelcontextprotocol/protocolVersion"] == MODERN
        assert "io.modelcontextprotocol/clientCapabilities" in meta
        assert send.header("mcp-method") == body(send)["method"]
        assert send.header("mcp-session-id") is None
    call = w.last(Purpose.CALL)
    assert call.header("mcp-name") == "echo"
    assert body(call)["params"]["_meta"]["mcp-lab/idempotency-key"] == handle.operation_key  # type: ignore[index]


def test_a_discover_that_does_not_list_the_revision_is_a_failed_handshake() -> None:
    w = Wire()
    w.take(w.core.connect(w.now))
    w.json_answer(w.last(Purpose.DISCOVER), {"resultType": "complete", "supportedVersions": ["2099-01-01"]})
    assert w.core.state is State.REINITIALIZE_REQUIRED


def test_a_call_completes_on_a_stream_of_events_without_ids() -> None:
    w = Wire()
    w.connect()
    handle, out = w.core.call_tool("ticker", {"count": 2}, w.now)
    w.take(out)
    call = w.last(Purpose.CALL)
    rid = body(call)["id"]
    progress = progress_of(rid)
    w.sse(call, progress, {"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete", "content": []}})
    (done,) = w.finished()
    assert done.call == handle and done.outcome is CallOutcome.OK


def test_a_broken_stream_is_re_issued_with_a_new_request_id_and_the_same_key() -> None:
    w = Wire()
    w.connect()
    _, out = w.core.call_tool("ledger.append", {"entry": "x"}, w.now, write=True)
    w.take(out)
    first = w.last(Purpose.CALL)
    rid = body(first)["id"]
    progress = progress_of(rid)
    w.sse(first, progress)
    w.take(w.core.connection_failed(first.conn_id, w.now, "connection_lost"))
    # Never a GET with Last-Event-ID: the era has no resumption.
    assert not [s for s in w.sent if s.purpose is Purpose.RESUME or s.method == "GET"]
    w.now += 5.0
    w.take(w.core.tick(w.now))
    again = w.last(Purpose.CALL)
    assert again.conn_id != first.conn_id and body(again)["id"] != rid
    key = "mcp-lab/idempotency-key"
    assert body(again)["params"]["_meta"][key] == body(first)["params"]["_meta"][key]  # type: ignore[index]
    w.sse(
        again,
        {"jsonrpc": "2.0", "id": body(again)["id"], "result": {"resultType": "complete", "content": []}},
    )
    (done,) = w.finished()
    assert done.outcome is CallOutcome.OK
    (recovery,) = [r for o in w.out for r in o.records if isinstance(r, Recovery)]
    assert recovery.path == "retried" and recovery.recovered_at is not None


def test_the_retry_rule_holds_in_the_modern_era_too() -> None:
    w = Wire(retry_rule=True)
    w.connect(tools=[{"name": "ledger.append"}])  # not said to be safe to repeat
    _, out = w.core.call_tool("ledger.append", {"entry": "x"}, w.now, write=True)
    w.take(out)
    first = w.last(Purpose.CALL)
    w.take(w.core.response_head(first.conn_id, 200, SSE, w.now))
    w.take(w.core.connection_failed(first.conn_id, w.now, "connection_lost"))
    w.now += 5.0
    w.take(w.core.tick(w.now))
    assert len([s for s in w.sent if s.purpose is Purpose.CALL]) == 1
    (done,) = w.finished()
    assert done.outcome is CallOutcome.UNKNOWN and done.reason.startswith("not_resent_")


def test_cancelling_closes_the_stream_and_posts_nothing() -> None:
    w = Wire()
    w.connect()
    handle, out = w.core.call_tool("ticker", {"count": 100}, w.now)
    w.take(out)
    call = w.last(Purpose.CALL)
    w.take(w.core.response_head(call.conn_id, 200, SSE, w.now))
    w.take(w.core.cancel(handle, w.now))
    assert call.conn_id in w.closed
    assert not [s for s in w.sent if s.purpose is Purpose.CANCEL]
    assert w.finished()[-1].outcome is CallOutcome.CANCELLED


@pytest.mark.parametrize("head_came", [True, False])
def test_cancelling_before_or_after_the_answer_head_closes_the_request(head_came: bool) -> None:
    w = Wire()
    w.connect()
    handle, out = w.core.call_tool("ticker", {"count": 100}, w.now)
    w.take(out)
    call = w.last(Purpose.CALL)
    if head_came:
        w.take(w.core.response_head(call.conn_id, 200, SSE, w.now))
    w.take(w.core.cancel(handle, w.now))
    assert w.closed.count(call.conn_id) == 1


def test_leaving_sends_no_delete() -> None:
    w = Wire()
    w.connect()
    w.take(w.core.leave(w.now))
    assert not [s for s in w.sent if s.purpose is Purpose.DELETE]
    (left,) = [n for o in w.out for n in o.notices if isinstance(n, LeaveFinished)]
    assert left.receipt is LeaveReceipt.NO_SESSION


def test_event_ids_from_a_modern_server_do_not_make_the_client_resume() -> None:
    """A server that still sends IDs in the modern era gives the client a cursor; the
    client does not use it (no GET, no Last-Event-ID): the break cancelled the request."""
    w = Wire()
    w.connect()
    _, out = w.core.call_tool("ticker", {"count": 5}, w.now)
    w.take(out)
    call = w.last(Purpose.CALL)
    rid = body(call)["id"]
    w.take(w.core.response_head(call.conn_id, 200, SSE, w.now))
    progress = progress_of(rid)
    event = b"id: s1-7\nevent: message\ndata: " + json.dumps(progress).encode() + b"\n\n"
    w.take(w.core.response_data(call.conn_id, event, w.now))
    w.take(w.core.connection_failed(call.conn_id, w.now, "connection_lost"))
    w.now += 5.0
    w.take(w.core.tick(w.now))
    assert not [s for s in w.sent if s.method == "GET" or s.header("last-event-id")]
    assert [s.purpose for s in w.sent].count(Purpose.CALL) == 2
