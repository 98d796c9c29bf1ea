"""ClientCore against the in-memory model server: each rule of the protocol, one scenario each."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest

from lab.client._commands import (
    CallFinished,
    CallOutcome,
    CloseConnection,
    LeaveFinished,
    LeaveReceipt,
    Purpose,
    SendRequest,
    SessionLost,
)
from lab.client._config import ClientConfig
from lab.client._core import ClientCore
from lab.client._memory_inbox import MemoryInbox
from lab.client._reconnect import BackoffPolicy, ReconnectBudget
from lab.client._states import State
from lab.wire.client_ledger import EventRejected, HttpExchange, ReconnectAttempt, Recovery, SessionEvent
from lab.wire.errors import LocalProtocolError
from lab.wire.redact import Redactor
from tests.client.model_server import Link, ModelServer


def make(
    *,
    budget: float = math.inf,
    server: ModelServer | None = None,
    defer: set[Purpose] | None = None,
    **cfg: object,
) -> tuple[ClientCore, ModelServer, Link, MemoryInbox]:
    server = server or ModelServer()
    inbox = MemoryInbox()
    config = ClientConfig(
        client_id="c1",
        token="alice",
        auth_subject="alice",
        backoff=BackoffPolicy(0.2, 2.0),
        **cfg,  # type: ignore[arg-type]
    )
    core = ClientCore(
        config,
        inbox=inbox,
        budget=ReconnectBudget(budget, now=0.0),
        redactor=Redactor(b"r" * 32),
        rng=random.Random(7),
    )
    link = Link(core, server)
    link.defer_head = defer or set()
    link.run(core.connect(link.now))
    link.settle()
    assert core.state is State.SESSION_ACTIVE
    return core, server, link, inbox


def finished(link: Link) -> list[CallFinished]:
    return [n for n in link.notices if isinstance(n, CallFinished)]


def records[T](link: Link, kind: type[T]) -> list[T]:
    return [r for r in link.records if isinstance(r, kind)]


def post_conn(link: Link) -> int:
    (conn,) = [c for c in link.conns(Purpose.CALL)] or link.conns(Purpose.RESUME)
    return conn


def test_handshake_sends_session_id_and_version_on_every_later_request() -> None:
    core, server, link, _ = make()
    init, *later = link.requests
    assert init.purpose is Purpose.INITIALIZE and init.header("mcp-session-id") is None
    assert init.header("mcp-protocol-version") is None  # the version travels in the body
    sid = core.session_id
    assert sid is not None and sid in server.sessions
    assert [r.purpose for r in later] == [Purpose.INITIALIZED, Purpose.STANDALONE]
    for r in later:
        assert r.header("mcp-session-id") == sid
        assert r.header("mcp-protocol-version") == "2025-11-25"
        assert r.header("origin") == "http://127.0.0.1"
        assert r.header("authorization") == "Bearer alice"
    assert core.structured_ids


def test_a_call_completes_on_its_post_stream() -> None:
    core, server, link, inbox = make()
    handle, cmds = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(cmds)
    link.settle()
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK and done.call == handle
    assert sum(server.effects.values()) == 1
    assert [d.dispatch_key for d in inbox.dispatches if d.dispatch_key.startswith("op:")] == [
        f"op:{handle.operation_key}"
    ]
    call_req = next(r for r in link.requests if r.purpose is Purpose.CALL)
    assert call_req.body is not None and handle.operation_key.encode() in call_req.body


def test_cut_after_the_write_resumes_with_last_event_id_and_writes_once() -> None:
    """The failure the lab exists to catch: the server wrote, the connection dropped before the response."""
    core, server, link, inbox = make()
    handle, cmds = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(cmds)
    conn = post_conn(link)
    link.deliver(conn, 2)  # priming + first progress; the write has happened on the server
    assert sum(server.effects.values()) == 1
    link.cut(conn)
    assert not finished(link)  # a dropped connection is not a cancellation
    wm = inbox.watermark(1, f"post:{request_id(link, conn)}")
    assert wm is not None and wm.sequence == 1
    link.settle()
    resume = [r for r in link.requests if r.purpose is Purpose.RESUME]
    assert len(resume) == 1 and resume[0].method == "GET"
    assert resume[0].header("last-event-id") == wm.event_id
    assert not any(r.purpose is Purpose.CANCEL for r in link.requests)
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK
    assert sum(server.effects.values()) == 1
    (rec,) = [r for r in records(link, Recovery) if r.operation_key == handle.operation_key]
    assert rec.path == "resumed" and rec.recovered_at is not None and rec.recovered_at >= rec.lost_at


def test_resume_uses_the_watermark_of_that_stream_only() -> None:
    core, _server, link, inbox = make()
    a, cmds_a = core.call_tool("echo", {}, link.now)
    b, cmds_b = core.call_tool("echo", {}, link.now)
    link.run(cmds_a + cmds_b)
    ca, cb = link.conns(Purpose.CALL)
    link.deliver(ca, 2)
    link.deliver(cb, 1)
    wm_a = inbox.watermark(1, f"post:{request_id(link, ca)}")
    wm_b = inbox.watermark(1, f"post:{request_id(link, cb)}")
    assert wm_a is not None and wm_b is not None and (wm_a.sequence, wm_b.sequence) == (1, 0)
    link.cut(ca)
    link.cut(cb)
    link.settle()
    resumes = [r.header("last-event-id") for r in link.requests if r.purpose is Purpose.RESUME]
    assert sorted(resumes) == sorted([wm_a.event_id, wm_b.event_id])  # type: ignore[type-var]
    assert {f.outcome for f in finished(link)} == {CallOutcome.OK}
    assert {f.call for f in finished(link)} == {a, b}


def request_id(link: Link, conn: int) -> int:
    req = next(r for r in link.requests if r.conn_id == conn)
    assert req.body is not None
    return int(json.loads(req.body)["id"])


def test_lost_priming_and_cut_before_any_event_resends_with_the_same_key() -> None:
    core, server, link, _ = make()
    handle, cmds = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(cmds)
    conn = post_conn(link)
    link.open[conn].chunks.pop(0)  # the proxy dropped the priming event
    link.cut(conn)  # ... and the connection died before anything else: no cursor at all
    link.settle()
    calls = [r for r in link.requests if r.purpose is Purpose.CALL]
    assert len(calls) == 2
    assert calls[0].body != calls[1].body  # a new JSON-RPC request ID ...
    assert all(handle.operation_key.encode() in c.body for c in calls if c.body)  # ... same key
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK
    assert sum(server.effects.values()) == 1  # the server deduplicated the write


def test_404_reports_unknown_and_reinitializes_without_session_id_next() -> None:
    core, server, link, _ = make()
    handle, cmds = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(cmds)
    conn = post_conn(link)
    link.deliver(conn, 2)
    old_sid = core.session_id
    assert old_sid is not None
    server.expire(old_sid)
    link.cut(conn)
    link.settle()
    lost = [n for n in link.notices if isinstance(n, SessionLost)]
    assert len(lost) == 1 and lost[0].outcome_unknown == (handle,)
    (done,) = finished(link)
    assert done.outcome is CallOutcome.UNKNOWN  # never silently re-sent in the new session
    i404 = next(i for i, r in enumerate(link.requests) if r.purpose is Purpose.RESUME)
    nxt = link.requests[i404 + 1]
    assert nxt.purpose is Purpose.INITIALIZE and nxt.header("mcp-session-id") is None
    assert core.session_id != old_sid and core.generation == 2
    # The application may retry explicitly, with the same idempotency key: no second write.
    link.run(core.retry_call(handle, link.now))
    link.settle()
    assert finished(link)[-1].outcome is CallOutcome.OK
    assert sum(server.effects.values()) == 1
    assert [s.what for s in records(link, SessionEvent)] == ["established", "expired", "established"]


def test_429_storm_waits_at_least_retry_after_and_respects_the_budget() -> None:
    core, server, link, _ = make(budget=1.0)
    server.refuse_next = [(429, "3"), (503, "2"), (503, None)]
    t0 = link.now
    _handle, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    link.settle()
    assert finished(link)[-1].outcome is CallOutcome.OK
    resends = records(link, ReconnectAttempt)
    assert [r.cause for r in resends] == ["http_429", "http_503", "http_503"]
    assert resends[0].advised_delay == 3.0 and resends[0].sent_at - t0 >= 3.0
    assert resends[1].advised_delay == 2.0
    assert all(r.waited >= r.planned_delay for r in resends)
    per_second = Counter(math.floor(r.sent_at) for r in resends)
    assert max(per_second.values()) <= 1


def test_polling_close_waits_the_retry_advice_then_resumes() -> None:
    core, _server, link, _ = make()
    _, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    conn = post_conn(link)
    link.deliver(conn, 1)
    t_close = link.now
    link.polling_close(conn, 1500)
    link.settle()
    (attempt,) = records(link, ReconnectAttempt)
    assert attempt.cause == "server_closed" and attempt.advised_delay == 1.5
    assert attempt.sent_at - t_close >= 1.5
    assert finished(link)[-1].outcome is CallOutcome.OK


def test_replay_after_ack_is_deduplicated() -> None:
    core, _, link, inbox = make()
    _, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    conn = post_conn(link)
    link.deliver(conn, 2)
    link.replay_delivered(conn)
    link.settle()
    dups = [r for r in records(link, EventRejected) if r.reason == "duplicate"]
    assert len(dups) == 1
    assert len({(r.key.stream_key, r.key.event_id) for r in inbox.receipts}) == len(inbox.receipts)


def test_crossed_event_of_the_standalone_stream_is_refused_on_a_post_stream() -> None:
    core, _server, link, inbox = make()
    sid = core.session_id
    assert sid is not None
    link.push(sid)
    link.settle()  # the GET stream delivered a notification
    _, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    conn = post_conn(link)
    chunk = link.foreign_chunk(sid, same_session=True, not_stream=link.stream_of(conn))
    assert chunk is not None and b"notifications/message" in chunk
    link.inject(conn, chunk)
    link.settle()
    reasons = [r.reason for r in records(link, EventRejected)]
    assert reasons == ["crossed_stream"]
    for r in inbox.receipts:
        if r.key.stream_key.startswith("post:"):
            assert "notifications/message" not in r.data


def test_delete_405_is_not_a_deletion_receipt() -> None:
    core, server, link, _ = make()
    server.delete_status = 405
    link.run(core.leave(link.now))
    link.settle()
    leave = [n for n in link.notices if isinstance(n, LeaveFinished)]
    assert [n.receipt for n in leave] == [LeaveReceipt.TERMINATION_UNSUPPORTED]
    assert "terminated" not in [s.what for s in records(link, SessionEvent)]
    assert core.state is State.SESSION_ACTIVE


def test_delete_confirmed() -> None:
    core, _, link, _ = make()
    link.run(core.leave(link.now))
    link.settle()
    assert [n.receipt for n in link.notices if isinstance(n, LeaveFinished)] == [LeaveReceipt.DELETED]
    assert core.state is State.TERMINATED


def test_lost_delete_response_is_retried_and_404_confirms_it_gone() -> None:
    core, server, link, _ = make()
    link.lose_next_response.add(Purpose.DELETE)  # the server deletes, the answer is lost
    link.run(core.leave(link.now))
    assert core.session_id is not None and not server.sessions[core.session_id].alive
    link.settle()
    assert [n.receipt for n in link.notices if isinstance(n, LeaveFinished)] == [LeaveReceipt.ALREADY_GONE]
    assert [r.kind for r in records(link, ReconnectAttempt)] == ["delete"]


def test_cancel_sends_notifications_cancelled() -> None:
    core, _, link, _ = make()
    handle, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    link.run(core.cancel(handle, link.now))
    cancel = [r for r in link.requests if r.purpose is Purpose.CANCEL]
    assert len(cancel) == 1 and cancel[0].body is not None and b"notifications/cancelled" in cancel[0].body
    assert finished(link)[-1].outcome is CallOutcome.CANCELLED


def test_refused_cursor_resends_the_call() -> None:
    core, server, link, _ = make()
    _handle, cmds = core.call_tool("ledger.append", {}, link.now, write=True)
    link.run(cmds)
    conn = post_conn(link)
    link.deliver(conn, 1)
    link.cut(conn)
    server.refuse_next = [(400, None)]  # the server rejects the cursor
    link.settle()
    assert [r.kind for r in records(link, ReconnectAttempt)] == ["resume", "resend"]
    assert finished(link)[-1].outcome is CallOutcome.OK
    assert sum(server.effects.values()) == 1


def test_standalone_stream_is_resumed_after_a_cut() -> None:
    core, _server, link, _ = make()
    (get,) = link.conns(Purpose.STANDALONE)
    assert core.session_id is not None
    link.push(core.session_id)
    link.deliver(get, 5)
    link.cut(get)
    link.push(core.session_id)  # sent while the client was away
    link.settle()
    (resume,) = [r for r in link.requests if r.purpose is Purpose.RESUME]
    assert resume.header("last-event-id") is not None
    (rec,) = records(link, Recovery)
    assert rec.path == "resumed" and rec.stream_key == "get:1"


def test_every_http_exchange_is_recorded_once() -> None:
    core, _, link, _ = make()
    _, cmds = core.call_tool("echo", {}, link.now)
    link.run(cmds)
    link.settle()
    link.run(core.leave(link.now))
    link.settle()
    ex = records(link, HttpExchange)
    assert sorted(e.conn_id for e in ex) == sorted({r.conn_id for r in link.requests})
    assert all(e.session is None or e.session.startswith("s_") for e in ex)
    sid = core.session_id
    assert sid is not None and all(sid not in repr(r) for r in link.records)  # no raw session ID


def test_misuse_is_a_local_protocol_error() -> None:
    core, _, link, _ = make()
    with pytest.raises(LocalProtocolError):
        core.connect(link.now)
    h, _cmds = core.call_tool("echo", {}, link.now, idempotency_key="k")
    with pytest.raises(LocalProtocolError):
        core.call_tool("echo", {}, link.now, idempotency_key="k")
    with pytest.raises(LocalProtocolError):
        core.retry_call(h, link.now)
    link.run(core.leave(link.now))
    with pytest.raises(LocalProtocolError):
        core.call_tool("echo", {}, link.now)


def test_a_send_request_is_self_describing() -> None:
    core, _, link, _ = make()
    _, out = core.call_tool("echo", {"text": "hé"}, link.now)
    (send,) = out.commands
    assert isinstance(send, SendRequest)
    assert send.method == "POST" and send.header("content-type") == "application/json"
    assert send.header("accept") == "application/json, text/event-stream"


def test_a_404_while_leaving_ends_the_leave_without_a_new_handshake() -> None:
    # The DELETE's answer is lost, but the standalone stream's next request meets the
    # deleted session (404): the client takes that as "already gone", sends no other
    # DELETE and no initialize (it is leaving).
    server = ModelServer()
    link_defer = {Purpose.STANDALONE}
    core, server, link, _ = make(server=server, defer=link_defer)
    (get,) = link.deferred  # the standalone GET is in flight: no answer yet
    link.lose_next_response.add(Purpose.DELETE)
    link.run(core.leave(link.now))
    sent_before = len(link.requests)
    assert core.session_id is not None and not server.sessions[core.session_id].alive
    link.deliver_head(get, 404)  # its answer comes now: the session is gone
    link.settle()
    assert [n.receipt for n in link.notices if isinstance(n, LeaveFinished)] == [LeaveReceipt.ALREADY_GONE]
    assert core.state is State.TERMINATED
    assert len(link.requests) == sent_before  # no DELETE retry, no initialize


def test_close_all_records_every_open_exchange() -> None:
    core, _, link, _ = make()
    _, cmds = core.call_tool("ticker", {}, link.now)
    link.run(cmds)
    open_conns = set(link.conns())
    assert open_conns
    out = core.close_all(link.now, "client_stopped")
    link.take(out)
    assert all(isinstance(c, CloseConnection) for c in out.commands)
    assert {c.conn_id for c in out.commands} == open_conns
    stopped = [r for r in records(link, HttpExchange) if r.error == "client_stopped"]
    assert {r.conn_id for r in stopped} == open_conns
    assert core.next_wakeup() is None


# ---------------------------------------------------------------------------- the retry rule


def lost_with_502(tool: str) -> tuple[Link, ModelServer]:
    """A client following the retry rule calls `tool` and the answer is lost (502: the
    call may have run): it re-sends it only if the server said that is safe."""
    core, server, link, _ = make(retry_rule=True)
    assert [r.purpose for r in link.requests[1:]] == [
        Purpose.INITIALIZED,
        Purpose.TOOLS_LIST,
        Purpose.STANDALONE,
    ]
    server.refuse_next.append((502, None))
    _, cmds = core.call_tool(tool, {}, link.now, write=tool == "ledger.append")
    link.run(cmds)
    link.settle(patience=5.0)
    return link, server


@pytest.mark.parametrize("tool", ["echo", "ledger.append"])
def test_the_retry_rule_re_sends_a_tool_the_server_said_is_safe(tool: str) -> None:
    link, _ = lost_with_502(tool)
    calls = [r for r in link.requests if r.purpose is Purpose.CALL]
    assert len(calls) == 2  # read-only, or its key honoured: sent again with the same key
    keys = {json.loads(r.body or b"{}")["params"]["_meta"]["mcp-lab/idempotency-key"] for r in calls}
    assert len(keys) == 1
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK


def test_the_retry_rule_reports_an_unsafe_tool_unknown_instead_of_re_sending_it() -> None:
    link, server = lost_with_502("bare")
    assert len([r for r in link.requests if r.purpose is Purpose.CALL]) == 1
    (done,) = finished(link)
    assert done.outcome is CallOutcome.UNKNOWN and done.reason == "not_resent_http_502"
    # Refused before processing (429), the same tool is sent again: nothing could have run.
    core, server, link, _ = make(retry_rule=True)
    server.refuse_next.append((429, "0"))
    _, cmds = core.call_tool("bare", {}, link.now, write=False)
    link.run(cmds)
    link.settle(patience=5.0)
    assert len([r for r in link.requests if r.purpose is Purpose.CALL]) == 2


def test_without_the_rule_the_core_re_sends_whatever_the_tool() -> None:
    core, server, link, _ = make()
    assert Purpose.TOOLS_LIST not in [r.purpose for r in link.requests]
    server.refuse_next.append((502, None))
    _, cmds = core.call_tool("bare", {}, link.now, write=False)
    link.run(cmds)
    link.settle(patience=5.0)
    assert len([r for r in link.requests if r.purpose is Purpose.CALL]) == 2


def test_the_tools_are_pending_until_their_list_is_answered() -> None:
    # What a Locust user waits for before its first call (lab.load.user: TOOLS_WAIT_S): a
    # call lost while the list is on its way would not be re-sent, nothing being known safe.
    core, _, link, _ = make(retry_rule=True, defer={Purpose.TOOLS_LIST})
    (conn,) = link.deferred  # the list asked, its answer held back
    assert core.tools_pending
    link.deliver_head(conn)
    link.settle()
    assert not core.tools_pending and core.client_state.resend_safe is not None
    # Without the rule no list is asked for, and nothing is ever pending.
    core, _, link, _ = make()
    assert not core.tools_pending and not link.conns(Purpose.TOOLS_LIST)
