"""accept_stream_event: every check refuses what it guards against, and with the check
switched off the same bad event gets in (so the check, not luck, is what stops it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from lab.client._acceptance import (
    ALL_CHECKS,
    Acceptance,
    Check,
    ConnectionView,
    Outcome,
    RejectReason,
    SessionView,
    StreamView,
    accept_stream_event,
)
from lab.client._memory_inbox import MemoryInbox
from lab.wire import jsonrpc
from lab.wire.event_ids import EventIdCodec, post_stream_id, session_tag
from lab.wire.sse import SseEvent

CODEC = EventIdCodec(b"s" * 32)
TAG = session_tag("the-session-id-0123456789abcdef")
OTHER_TAG = session_tag("another-session-id-0123456789")
RID = 7
PSID = post_stream_id(TAG, RID)
V = "2025-11-25"


@dataclass
class World:
    inbox: MemoryInbox
    session: SessionView
    conn: ConnectionView
    post: StreamView
    get: StreamView
    setup: int = 0
    """Events accepted while a case prepared its bad event."""


def world(structured: bool = True) -> World:
    return World(
        inbox=MemoryInbox(),
        session=SessionView(1, True, V, "alice", TAG, structured, server_generation=0),
        conn=ConnectionView(10, 1, V, "alice"),
        post=StreamView("post:7", RID, RID, "op-1", PSID if structured else None),
        get=StreamView("get:1", None, None, None, "g1" if structured else None),
    )


def progress(token: int, n: int) -> str:
    return jsonrpc.dumps(jsonrpc.notification(jsonrpc.PROGRESS, {"progressToken": token, "progress": n}))


def response(rid: int, value: str = "ok") -> str:
    return jsonrpc.dumps(jsonrpc.result(rid, {"content": [{"type": "text", "text": value}]}))


def eid(seq: int, data: str, *, stream: str = PSID, tag: str = TAG, gen: int = 0) -> str:
    return CODEC.mint(tag, gen, stream, seq, data)


def accept(
    w: World,
    data: str,
    event_id: str,
    *,
    stream: StreamView | None = None,
    conn: ConnectionView | None = None,
    session: SessionView | None = None,
    checks: frozenset[Check] = ALL_CHECKS,
) -> Acceptance:
    return accept_stream_event(
        w.inbox,
        client_id="c1",
        session=session or w.session,
        conn=conn or w.conn,
        stream=stream or w.post,
        event=SseEvent(data=data, id=event_id),
        event_id=event_id,
        now=1000.0,
        checks=checks,
    )


def feed_ok(w: World, *events: tuple[str, str]) -> None:
    for data, e in events:
        a = accept(w, data, e)
        assert a.outcome is Outcome.ACCEPTED, a
        w.setup += 1


def test_a_normal_post_stream_is_accepted_in_order() -> None:
    w = world()
    p0, p1, r = "", progress(RID, 1), response(RID)
    results = [accept(w, d, eid(i, d)) for i, d in enumerate((p0, p1, r))]
    assert [a.outcome for a in results] == [Outcome.ACCEPTED] * 3
    assert [a.receipt.kind for a in results if a.receipt] == ["priming", "notification", "response"]
    assert results[0].dispatch is None  # the priming event is a cursor, not a message
    assert results[2].ends_stream and results[2].dispatch is not None
    assert results[2].dispatch.dispatch_key == "op:op-1"
    assert w.inbox.watermark(1, "post:7") is not None
    assert w.inbox.watermark(1, "post:7").sequence == 2  # type: ignore[union-attr]


@dataclass(frozen=True)
class Case:
    """A bad event, the check that stops it, and the reason it gives."""

    name: str
    check: Check
    reason: RejectReason
    run: Callable[[World, frozenset[Check]], Acceptance]


def _stale_session(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d), conn=replace(w.conn, session_generation=0), checks=checks)


def _expired_session(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d), session=replace(w.session, active=False), checks=checks)


def _version_sent(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d), conn=replace(w.conn, protocol_version="2025-06-18"), checks=checks)


def _version_answered(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    conn = replace(w.conn, answered_protocol_version="2025-03-26")
    return accept(w, d, eid(1, d), conn=conn, checks=checks)


def _subject(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d), conn=replace(w.conn, auth_subject="mallory"), checks=checks)


def _foreign_session(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d, tag=OTHER_TAG), checks=checks)


def _crossed_id(w: World, checks: frozenset[Check]) -> Acceptance:
    # A notification of the GET stream, with its own genuine ID, injected into the POST stream.
    d = jsonrpc.dumps(jsonrpc.notification("notifications/resources/updated", {"uri": "x"}))
    return accept(w, d, eid(1, d, stream="g1"), checks=checks)


def _other_generation(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, eid(1, d, gen=5), checks=checks)


def _tampered_content(w: World, checks: frozenset[Check]) -> Acceptance:
    genuine = progress(RID, 1)
    return accept(w, response(RID, "swapped"), eid(1, genuine), checks=checks)


def _malformed_id(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(RID, 1)
    return accept(w, d, "garbage-id", checks=checks)


def _opaque_crossed(w: World, checks: frozenset[Check]) -> Acceptance:
    w.session = replace(w.session, structured_ids=False)
    w.post = replace(w.post, server_stream_id=None)
    note = jsonrpc.dumps(jsonrpc.notification("notifications/message", {"data": "hi"}))
    a = accept(w, note, "opaque-17", stream=w.get)
    assert a.accepted
    w.setup += 1
    return accept(w, note, "opaque-17", checks=checks)  # the same event replayed onto the POST stream


def _regression(w: World, checks: frozenset[Check]) -> Acceptance:
    feed_ok(
        w,
        ("", eid(0, "")),
        (progress(RID, 1), eid(1, progress(RID, 1))),
        (progress(RID, 2), eid(2, progress(RID, 2))),
    )
    older = progress(RID, 9)  # new content under an older sequence number
    return accept(w, older, eid(1, older), checks=checks)


def _gap(w: World, checks: frozenset[Check]) -> Acceptance:
    feed_ok(w, ("", eid(0, "")))
    d = progress(RID, 3)
    return accept(w, d, eid(3, d), checks=checks)


def _response_on_get(w: World, checks: frozenset[Check]) -> Acceptance:
    d = response(RID)
    return accept(w, d, eid(1, d, stream="g1"), stream=w.get, checks=checks)


def _response_other_request(w: World, checks: frozenset[Check]) -> Acceptance:
    d = response(99)
    return accept(w, d, eid(1, d), checks=checks)


def _progress_other_token(w: World, checks: frozenset[Check]) -> Acceptance:
    d = progress(99, 1)
    return accept(w, d, eid(1, d), checks=checks)


def _after_response(w: World, checks: frozenset[Check]) -> Acceptance:
    feed_ok(w, (response(RID), eid(1, response(RID))))
    w.post = replace(w.post, ended=True)
    d = progress(RID, 5)
    return accept(w, d, eid(2, d), checks=checks)


def _opaque_content_mismatch(w: World, checks: frozenset[Check]) -> Acceptance:
    w.session = replace(w.session, structured_ids=False)
    w.post = replace(w.post, server_stream_id=None)
    feed_ok(w, (progress(RID, 1), "opaque-1"))
    return accept(w, progress(RID, 2), "opaque-1", checks=checks)


CASES = [
    Case("stale session generation", Check.SESSION, RejectReason.STALE_SESSION, _stale_session),
    Case("session no longer active", Check.SESSION, RejectReason.STALE_SESSION, _expired_session),
    Case("sent another version", Check.VERSION, RejectReason.PROTOCOL_VERSION_MISMATCH, _version_sent),
    Case(
        "answered another version", Check.VERSION, RejectReason.PROTOCOL_VERSION_MISMATCH, _version_answered
    ),
    Case("token of another subject", Check.SUBJECT, RejectReason.SUBJECT_MISMATCH, _subject),
    Case("event of a foreign session", Check.EVENT_ID, RejectReason.FOREIGN_SESSION, _foreign_session),
    Case("event ID of another stream", Check.EVENT_ID, RejectReason.CROSSED_STREAM, _crossed_id),
    Case("event of another generation", Check.EVENT_ID, RejectReason.OTHER_GENERATION, _other_generation),
    Case("content swapped under an ID", Check.EVENT_ID, RejectReason.CONTENT_TAMPERED, _tampered_content),
    Case("malformed structured ID", Check.EVENT_ID, RejectReason.MALFORMED_EVENT_ID, _malformed_id),
    Case("opaque ID seen on another stream", Check.EVENT_ID, RejectReason.CROSSED_STREAM, _opaque_crossed),
    Case("cursor regression", Check.CURSOR, RejectReason.CURSOR_REGRESSION, _regression),
    Case("cursor gap", Check.CURSOR, RejectReason.CURSOR_GAP, _gap),
    Case(
        "response on the standalone GET",
        Check.CORRELATION,
        RejectReason.RESPONSE_ON_STANDALONE_STREAM,
        _response_on_get,
    ),
    Case(
        "response to another request",
        Check.CORRELATION,
        RejectReason.RESPONSE_ID_MISMATCH,
        _response_other_request,
    ),
    Case(
        "progress of another request",
        Check.CORRELATION,
        RejectReason.PROGRESS_TOKEN_MISMATCH,
        _progress_other_token,
    ),
    Case("message after the response", Check.CORRELATION, RejectReason.STREAM_ALREADY_ENDED, _after_response),
    Case(
        "same opaque ID, other content", Check.DIGEST, RejectReason.CONTENT_MISMATCH, _opaque_content_mismatch
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_check_refuses_the_bad_event(case: Case) -> None:
    w = world()
    a = case.run(w, ALL_CHECKS)
    assert a.outcome is Outcome.REJECTED
    assert a.reason is case.reason
    assert a.receipt is None and a.dispatch is None
    assert len(w.inbox.receipts) == w.setup  # nothing was written


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_without_the_check_the_bad_event_gets_in(case: Case) -> None:
    w = world()
    a = case.run(w, ALL_CHECKS - {case.check})
    assert a.outcome is Outcome.ACCEPTED, f"{case.name}: {a}"
    assert a.receipt is not None and a.receipt in w.inbox.receipts


def test_duplicates_are_not_accepted_twice_and_are_not_errors() -> None:
    w = world()
    d = progress(RID, 1)
    feed_ok(w, ("", eid(0, "")), (d, eid(1, d)))
    again = accept(w, d, eid(1, d))  # replay after ACK
    assert again.outcome is Outcome.DUPLICATE and again.reason is None
    assert len(w.inbox.receipts) == 2 and len(w.inbox.dispatches) == 1


def test_without_the_duplicate_check_a_replay_reaches_the_store() -> None:
    # The in-memory store, like SQLite's primary key, refuses a second commit of the same
    # key; without the check the replay would be committed (and dispatched) again.
    w = world(structured=False)
    d = progress(RID, 1)
    feed_ok(w, (d, "opaque-1"))
    with pytest.raises(ValueError, match="duplicate commit"):
        accept(w, d, "opaque-1", checks=ALL_CHECKS - {Check.DUPLICATE})


def test_a_resumed_post_stream_may_carry_its_response_on_get() -> None:
    # The GET resumption of the POST stream is the same stream (same key and request):
    # its response is accepted even though it arrives on a GET connection.
    w = world()
    feed_ok(w, ("", eid(0, "")))
    resumed_conn = replace(w.conn, conn_id=11)
    d = response(RID)
    a = accept(w, d, eid(1, d), conn=resumed_conn)
    assert a.accepted and a.ends_stream


def test_late_response_is_received_but_not_dispatched_twice() -> None:
    w = world()
    first = response(RID)
    feed_ok(w, (first, eid(1, first)))
    # A retry of the same operation (new request 8, same idempotency key) gets its response too.
    retry = StreamView("post:8", 8, 8, "op-1", post_stream_id(TAG, 8))
    d = response(8)
    late = accept(w, d, CODEC.mint(TAG, 0, retry.server_stream_id or "", 1, d), stream=retry)
    assert late.accepted and late.dispatch is None and late.detail == "operation already dispatched"
    assert [x.dispatch_key for x in w.inbox.dispatches] == ["op:op-1"]


def test_a_response_to_a_request_that_already_completed_is_refused_wherever_it_comes() -> None:
    w = world(structured=False)  # opaque IDs: a fresh ID says nothing
    first = response(RID)
    feed_ok(w, (first, "a-1"))
    done = replace(w.post, ended=True)
    again = accept(w, first, "a-2", stream=done)
    assert again.reason is RejectReason.STREAM_ALREADY_ENDED
    other = StreamView("post:8", 8, 8, "op-2", None)
    elsewhere = accept(w, first, "a-3", stream=other)
    assert elsewhere.reason is RejectReason.RESPONSE_ID_MISMATCH
    assert [x.dispatch_key for x in w.inbox.dispatches] == ["op:op-1"]


def test_events_without_ids_get_synthetic_ones_that_are_not_cursors() -> None:
    w = world(structured=False)
    d = response(RID)
    a = accept(w, d, "~10.1")
    assert a.accepted
    assert w.inbox.watermark(1, "post:7") is None


def test_malformed_message_is_rejected() -> None:
    w = world()
    a = accept(w, "{not json", eid(1, "{not json"))
    assert a.reason is RejectReason.MALFORMED_MESSAGE
