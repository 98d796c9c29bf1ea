"""No silent hang: a loss that never ends is a recovery that never recovered, and every
event the client drops is said so.

ClientCore against the in-memory model server, as in test_client.py.
"""

from __future__ import annotations

from lab.client import Output
from lab.client._commands import CallFinished, CallOutcome, Purpose
from lab.client._core import ClientCore
from lab.wire.client_ledger import EventRejected, HttpExchange, ReconnectAttempt, Recovery
from tests.client.model_server import Link, ModelServer
from tests.client.test_client import make, post_conn, request_id


def finished(link: Link) -> list[CallFinished]:
    return [n for n in link.notices if isinstance(n, CallFinished)]


def records[T](link: Link, kind: type[T]) -> list[T]:
    return [r for r in link.records if isinstance(r, kind)]


def start_write(core: ClientCore, link: Link, delivered: int = 2) -> int:
    """A write whose stream delivered `delivered` events (priming first); its connection."""
    _, out = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(out)
    conn = post_conn(link)
    link.deliver(conn, delivered)
    return conn


# -- silent streams ------------------------------------------------------------------------


def test_a_resumed_stream_that_stays_silent_is_lost_and_resumed_again() -> None:
    core, server, link, _ = make(resume_silence_s=4.0)
    conn = start_write(core, link)
    server.silent_resumes = 1  # the cursor is answered 200, and then nothing ever comes
    link.cut(conn)
    link.settle()
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK
    first, second = records(link, ReconnectAttempt)
    assert (first.kind, second.kind) == ("resume", "resume")
    assert second.cause == "resume_silent" and second.sent_at - first.sent_at >= 4.0
    silent = [e for e in records(link, HttpExchange) if e.error == "resume_silent"]
    assert [e.conn_id for e in silent] == [first.conn_id]
    (rec,) = records(link, Recovery)
    assert rec.path == "resumed" and rec.attempts == 2 and rec.cause == "connection_lost"
    assert rec.recovered_at is not None and rec.recovered_at - rec.lost_at >= 4.0
    assert sum(server.effects.values()) == 1


def test_a_stream_silent_after_every_resumption_ends_in_a_resend_with_the_same_key() -> None:
    core, server, link, _ = make(resume_silence_s=2.0, max_attempts=3)
    conn = start_write(core, link)
    server.silent_resumes = 3  # as many as the policy allows: resumption never works
    link.cut(conn)
    link.settle()
    assert [r.kind for r in records(link, ReconnectAttempt)] == ["resume"] * 3 + ["resend"]
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK  # the re-sent call, same idempotency key
    assert sum(server.effects.values()) == 1  # the server deduplicated the write
    (rec,) = records(link, Recovery)
    assert rec.path == "retried" and rec.attempts == 4 and rec.recovered_at is not None


def test_a_call_stream_kept_alive_without_messages_is_lost_after_the_idle_bound() -> None:
    core, server, link, _ = make(stream_idle_s=5.0)
    server.stalled_calls = 1  # priming only, then the stream stays open and says nothing
    _, out = core.call_tool("ticker", {}, link.now)
    t0 = link.now
    link.run(out)
    link.settle()
    (done,) = finished(link)
    assert done.outcome is CallOutcome.OK
    (attempt,) = records(link, ReconnectAttempt)
    assert attempt.kind == "resume" and attempt.cause == "stream_idle" and attempt.lost_at >= t0 + 5.0


def test_without_a_bound_the_stalled_stream_would_hang_forever() -> None:
    # The same stall with a bound longer than the test: nothing happens by itself, which
    # is exactly what the bound exists to end.
    core, server, link, _ = make(stream_idle_s=1e9)
    server.stalled_calls = 1
    _, out = core.call_tool("ticker", {}, link.now)
    link.run(out)
    link.advance_to(link.now + 3600)
    assert not finished(link) and not records(link, ReconnectAttempt)


# -- nothing stays open when the client goes -------------------------------------------------


def test_leave_ends_a_waiting_call_and_its_recovery_as_never_recovered() -> None:
    core, _server, link, _ = make()
    _, out = core.call_tool("ticker", {}, link.now)
    sent_at = link.now
    link.run(out)
    conn = post_conn(link)
    link.deliver(conn, 1)  # priming: not a message, the call has not moved since it was sent
    link.advance_to(link.now + 10)
    link.run(core.leave(link.now))
    (done,) = finished(link)
    assert done.outcome is CallOutcome.UNKNOWN and done.reason == "left"
    (rec,) = records(link, Recovery)
    assert rec.path == "left" and rec.recovered_at is None and rec.lost_at == sent_at
    assert [e.error for e in records(link, HttpExchange) if e.conn_id == conn] == ["left"]
    assert [r.purpose for r in link.requests][-1] is Purpose.DELETE
    link.settle()
    assert core.next_wakeup() is None


def test_close_all_ends_a_recovery_in_progress_as_client_stopped() -> None:
    core, _server, link, _ = make()
    conn = start_write(core, link)
    lost_at = link.now
    link.cut(conn)  # the resumption waits for its backoff
    assert core.next_wakeup() is not None
    out = core.close_all(link.now)
    link.take(out)
    (done,) = finished(link)
    assert done.outcome is CallOutcome.UNKNOWN and done.reason == "client_stopped"
    (rec,) = records(link, Recovery)
    assert (rec.path, rec.recovered_at, rec.lost_at, rec.cause) == (
        "client_stopped",
        None,
        lost_at,
        "connection_lost",
    )
    assert core.next_wakeup() is None and not records(link, ReconnectAttempt)


def test_a_session_lost_during_a_resumption_ends_its_recovery() -> None:
    # Before the one reconnector, a resumption pending when the session expired was
    # dropped without a row: a loss that never ended, and no one knew.
    core, server, link, _ = make()
    conn = start_write(core, link)
    assert core.session_id is not None
    server.expire(core.session_id)
    link.cut(conn)
    link.settle()
    (rec,) = records(link, Recovery)
    assert rec.path == "session_lost" and rec.recovered_at is None
    assert finished(link)[0].outcome is CallOutcome.UNKNOWN


def test_a_standalone_stream_lost_with_its_session_comes_back_with_the_next_one() -> None:
    # It owes nothing a cursor could replay: the new session's stream brings it back.
    core, server, link, _ = make()
    (get,) = link.conns(Purpose.STANDALONE)
    assert core.session_id is not None
    link.push(core.session_id)
    link.deliver(get, 2)
    server.expire(core.session_id)
    link.cut(get)
    link.settle()
    (rec,) = records(link, Recovery)
    assert (rec.stream_key, rec.path, rec.reinitialized) == ("get:1", "reopened", True)
    assert rec.recovered_at is not None and core.generation == 2
    assert link.conns(Purpose.STANDALONE)  # the new session's stream is open


def test_a_resumption_that_fails_before_its_answer_is_tried_again() -> None:
    core, _server, link, _ = make()
    conn = start_write(core, link)
    link.lose_next_response.add(Purpose.RESUME)  # the GET's connection breaks before any head
    link.cut(conn)
    link.settle()
    assert [r.kind for r in records(link, ReconnectAttempt)] == ["resume", "resume"]
    assert finished(link)[0].outcome is CallOutcome.OK


# -- every dropped event has a row ------------------------------------------------------------


def _misordered_tail(link: Link, conn: int) -> bytes:
    """The rest of the call's stream in one chunk, the response before the last progress."""
    *progress, response = link.open[conn].chunks
    link.open[conn].chunks = []
    return response + b"".join(progress)


def test_late_progress_after_the_response_in_the_same_chunk_is_rejected_with_a_row() -> None:
    server = ModelServer(announce_ids=False)  # opaque IDs: no cursor tells the order
    core, server, link, _ = make(server=server)
    _, out = core.call_tool("ticker", {}, link.now)
    link.run(out)
    conn = post_conn(link)
    link.deliver(conn, 2)
    link.run(core.response_data(conn, _misordered_tail(link, conn), link.now))
    assert finished(link)[0].outcome is CallOutcome.OK
    (late,) = records(link, EventRejected)
    assert late.reason == "stream_already_ended" and late.stream_key == f"post:{request_id(link, conn)}"


def test_with_structured_ids_a_misordered_tail_is_refused_then_replayed_in_order() -> None:
    core, _server, link, inbox = make()
    _, out = core.call_tool("ticker", {}, link.now)
    link.run(out)
    conn = post_conn(link)
    link.deliver(conn, 2)
    link.run(core.response_data(conn, _misordered_tail(link, conn), link.now))
    assert [r.reason for r in records(link, EventRejected)] == ["cursor_gap", "connection_abandoned"]
    link.settle()
    assert finished(link)[0].outcome is CallOutcome.OK
    key = f"post:{request_id(link, conn)}"
    assert [r.sequence for r in inbox.receipts if r.key.stream_key == key] == [0, 1, 2, 3]


def test_an_output_is_the_only_channel() -> None:
    # Whatever a public method produced is in what it returned, and nowhere else.
    core, _server, link, _ = make()
    before = len(link.records)
    _, out = core.call_tool("echo", {}, link.now)
    assert isinstance(out, Output) and out.commands and not out.records
    link.run(out)
    link.settle()
    assert len(link.records) > before and core.fx.take() == Output()


def test_a_completed_operation_run_again_completes_and_is_dispatched_once() -> None:
    # Its new request's response is that attempt's answer: taken, never dispatched twice.
    # (Refusing it would leave the attempt waiting for a response that cannot come.)
    core, server, link, inbox = make()
    handle, out = core.call_tool("ledger.append", {"x": 1}, link.now, write=True)
    link.run(out)
    link.settle()
    link.run(core.retry_call(handle, link.now))
    link.settle()
    assert [f.outcome for f in finished(link)] == [CallOutcome.OK, CallOutcome.OK]
    assert [d.dispatch_key for d in inbox.dispatches if d.dispatch_key.startswith("op:")] == [
        f"op:{handle.operation_key}"
    ]
    assert sum(server.effects.values()) == 1 and core.next_wakeup() is None


# -- no message without bound ------------------------------------------------------------------


def _flood(link: Link, core: ClientCore, conn: int, chars: int) -> None:
    """`chars` characters of one event that never ends, in 64 KiB chunks (as a socket
    gives them), until the core stops reading it."""
    chunk = b"data: " + b"x" * 65536
    sent = 0
    while sent < chars and conn in link.open:
        link.run(core.response_data(conn, chunk if sent else b"id: big\n" + chunk, link.now))
        sent += len(chunk)


def test_an_event_past_the_message_bound_closes_its_connection_and_the_call_resumes() -> None:
    core, _server, link, _ = make(max_message_bytes=256 * 1024)
    conn = start_write(core, link)
    _flood(link, core, conn, 10 * 1024 * 1024)
    assert conn not in link.open  # closed at the bound, not after 10 MiB
    (ex,) = [e for e in records(link, HttpExchange) if e.conn_id == conn]
    assert ex.error == "message_too_large"
    link.settle()
    (attempt, *_) = records(link, ReconnectAttempt)
    assert attempt.kind == "resume" and attempt.cause == "message_too_large"
    assert finished(link)[0].outcome is CallOutcome.OK


def test_an_event_within_the_bound_is_read_on() -> None:
    # The control: the same flood under a bound larger than it is only ever read.
    core, _server, link, _ = make(max_message_bytes=64 * 1024 * 1024)
    conn = start_write(core, link)
    _flood(link, core, conn, 1024 * 1024)
    assert conn in link.open
    assert not [e for e in records(link, HttpExchange) if e.conn_id == conn]
