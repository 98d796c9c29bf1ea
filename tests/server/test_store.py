"""`lab serve --store FILE`: a restart keeps sessions, streams and their events.

Unit tests restore `DurableState` from the store file another one wrote (round trip,
an interrupted call's error, trims, the event-ID key, the opaque index, a crash that
lost the last batch, the ledger across a restart); live tests stop a real `lab serve`
mid-call with SIGTERM or SIGKILL and start it again on the same port with the same files,
and show the contrast without a store (the session is gone: 404)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from lab.server import ledger as L
from lab.server.cli import config_from_args, register
from lab.server.config import ServerConfig, read_config_file
from lab.server.durable import INTERRUPTED, LOST_EVENTS_GAP, LOST_STREAMS_GAP, DurableState
from lab.server.model import Session, Stream
from lab.server.state import Resumption
from lab.server.store import Store
from lab.server.store import read as read_store
from lab.wire import jsonrpc
from lab.wire.event_ids import parse_event_id
from lab.wire.sse import SseEvent
from tests.livesrv import LAB, LEDGER_KEY, ROOT, LiveProcess, stop, wait_for_line
from tests.server.mcp_http import Mcp, messages

V = "2025-11-25"


# -- unit: DurableState restored from a store file ------------------------------------


def _state(tmp: Path, now: float, *, store: str = "store.sqlite", **settings: Any) -> DurableState:
    config = ServerConfig(
        store=str(tmp / store),
        ledger_path=str(tmp / "ledger.sqlite"),
        ledger_key=bytes.fromhex(LEDGER_KEY),
        **settings,
    )
    assert config.ledger_path is not None and config.store is not None
    return DurableState(config, L.Ledger(config.ledger_path), Store(config.store), now)


def _stop(state: DurableState, now: float) -> None:
    state.shutdown(now)
    state.ledger.close()


def _progress(state: DurableState, st: Stream, n: int, now: float) -> str:
    """Emit progress `n` on `st`; its event ID."""
    data = jsonrpc.dumps(jsonrpc.notification(jsonrpc.PROGRESS, {"progressToken": "t", "progress": n}))
    event_id = state.emit(st, data, "notification", None, now).event_id
    assert event_id is not None
    return event_id


def _answer(state: DurableState, st: Stream, now: float) -> None:
    assert st.request_id is not None
    data = jsonrpc.dumps(jsonrpc.result(st.request_id, {"content": []}))
    state.emit(st, data, "response", str(st.request_id), now)


def _events(st: Stream) -> list[tuple[Any, ...]]:
    return [(e.seq, e.order, e.event_id, e.wire, e.digest, e.kind, e.jsonrpc_id) for e in st.events]


def _resume(state: DurableState, s: Session, cursor: str) -> Resumption:
    found = state.resolve_cursor(s, cursor)
    assert isinstance(found, Resumption), found
    return found


def _ledger(tmp: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(tmp / "ledger.sqlite")) as db:
        return db.execute(sql, args).fetchall()


def test_a_restart_restores_sessions_streams_events_and_counters(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)
    alice = a.create_session("alice", V, "{}", 100.0)
    anon = a.create_session(None, V, "{}", 100.5)
    a.set_log_level(alice, "warning")
    done = a.open_post_stream(alice, 7, "d7", None, 101.0)
    _progress(a, done, 1, 101.1)
    _answer(a, done, 101.2)
    running = a.open_post_stream(alice, "x", "dx", None, 102.0)
    a.set_polling(running, 5, 250)
    sent = [_progress(a, running, n, 102.0 + n / 10) for n in (1, 2, 3)]
    a.open_standalone(anon, None, 103.0)  # g1
    a.log_message(anon, "info", "mcp-lab/ledger", {"receipt": "r-1"}, 103.5)
    a.touch(alice, 105.0)  # alice is now the most recently used
    before = {st.stream_id: _events(st) for s in (alice, anon) for st in s.streams.values()}
    retained = {s.sid: s.retained for s in (alice, anon)}
    emitted = a.emitted
    _stop(a, 110.0)

    b = _state(tmp_path, 120.0)
    assert b.restored is not None and b.restored.clean
    assert (b.restored.sessions, b.restored.streams, b.restored.interrupted) == (2, 3, 1)
    assert list(b.sessions) == [anon.sid, alice.sid]  # least recently used first
    al, an = b.sessions[alice.sid], b.sessions[anon.sid]
    assert (al.subject, al.version, al.log_level, al.created_at) == ("alice", V, "warning", 100.0)
    assert (an.subject, an.version, an.gets, an.pseudonym) == (None, V, 1, anon.pseudonym)
    assert al.request_ids == {7, "x"}  # an integer and a string ID stay two IDs
    assert al.last_seen == 105.0 + 10.0  # idle 5 s at the stop: the 10 s down do not count
    # Every stream with its events, byte for byte; the running call's stream with one more.
    assert _events(al.streams[done.stream_id]) == before[done.stream_id]
    assert al.streams[done.stream_id].close_reason == "completed"
    assert _events(an.streams["g1"]) == before["g1"] and an.standalone is an.streams["g1"]
    resumed = al.streams[running.stream_id]
    assert _events(resumed)[:-1] == before[running.stream_id]
    assert (resumed.close_after, resumed.retry_ms) == (5, 250)
    # The interrupted call's answer: an error for its request, the stream complete.
    last = resumed.events[-1]
    assert (last.kind, last.jsonrpc_id, last.seq, last.order) == ("error", "x", 4, emitted + 1)
    answer = json.loads(last.wire.decode().split("data: ", 1)[1])
    assert answer["id"] == "x" and answer["error"] == {"code": jsonrpc.INTERNAL_ERROR, "message": INTERRUPTED}
    assert resumed.complete and resumed.close_reason == "completed"
    assert b.emitted == emitted + 1
    assert (al.open_streams, an.open_streams) == (0, 1)
    assert an.retained == retained[anon.sid] and al.retained == retained[alice.sid] + last.cost
    # A cursor minted before the restart resumes after it: what was missed, then the error.
    backlog = _resume(b, al, sent[0]).backlog
    assert [e.event_id for e in backlog[:-1]] == sent[1:] and backlog[-1] is last
    # The standalone stream stays open and resumable; new events follow on.
    g2 = an.streams["g1"]
    assert g2.closed_at is None and not g2.complete
    assert _resume(b, an, before["g1"][0][2]).backlog == list(g2.events)[1:]
    assert b.emit(g2, "{}", "notification", None, 121.0).seq == 2
    _stop(b, 130.0)


def test_an_interrupted_call_completes_once_and_a_second_restart_keeps_it(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)
    s = a.create_session(None, V, "{}", 100.0)
    st = a.open_post_stream(s, 3, "d", None, 100.0)
    seen = _progress(a, st, 1, 100.1)
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0)
    assert b.restored is not None and b.restored.interrupted == 1
    _stop(b, 103.0)
    c = _state(tmp_path, 104.0)
    assert c.restored is not None and c.restored.interrupted == 0  # answered once, not again
    again = c.sessions[s.sid].streams[st.stream_id]
    assert [e.kind for e in again.events] == ["priming", "notification", "error"]
    assert [e.kind for e in _resume(c, c.sessions[s.sid], seen).backlog] == ["error"]
    _stop(c, 105.0)


def test_trimmed_forgotten_and_ended_are_not_restored(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0, event_retention=3, completed_stream_ttl=5.0)
    s = a.create_session(None, V, "{}", 100.0)
    gone = a.create_session(None, V, "{}", 100.0)
    st = a.open_post_stream(s, 1, "d", None, 100.0)
    ids = [_progress(a, st, n, 100.0) for n in range(1, 7)]  # 7 events, 3 kept: seq 4, 5, 6
    done = a.open_post_stream(s, 2, "d", None, 100.0)
    _answer(a, done, 100.0)
    a.end_session(gone, "deleted", 100.0)
    a.sweep(106.0)  # the completed stream is past its grace period: forgotten
    assert done.stream_id not in s.streams
    _stop(a, 106.0)
    b = _state(tmp_path, 107.0, event_retention=3, completed_stream_ttl=5.0)
    r = b.sessions[s.sid]
    assert list(b.sessions) == [s.sid] and list(r.streams) == [st.stream_id]
    assert b.restored is not None and b.restored.events == 3  # seq 4, 5, 6 of that stream only
    kept = r.streams[st.stream_id]  # then its interrupted error (seq 7) pushed seq 4 out
    assert [e.seq for e in kept.events] == [5, 6, 7] and kept.events[-1].kind == "error"
    assert b.resolve_cursor(r, ids[0]) == "evicted"
    assert [e.seq for e in _resume(b, r, ids[3]).backlog] == [5, 6, 7]
    _stop(b, 108.0)
    # Nothing else is in the file: no chunk wholly trimmed, no other stream or session.
    snap = read_store(tmp_path / "store.sqlite")
    assert [(r.sid, r.stream_id) for r in snap.streams] == [(s.sid, st.stream_id)]
    assert [e.seq for e in snap.events] == [5, 6, 7] and [r.sid for r in snap.sessions] == [s.sid]
    with closing(sqlite3.connect(tmp_path / "store.sqlite")) as db:
        assert db.execute("SELECT COUNT(*) FROM events WHERE last_seq < 5").fetchone() == (0,)


def test_the_event_id_key_is_the_stores(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)  # no key configured: a random one, written to the store
    s = a.create_session(None, V, "{}", 100.0)
    st = a.open_post_stream(s, 1, "d", None, 100.0)
    cursor = _progress(a, st, 1, 100.0)
    _stop(a, 101.0)
    # Another key configured now: the store's wins, so IDs minted before still verify.
    b = _state(tmp_path, 102.0, event_id_key=b"k" * 32)
    assert [e.kind for e in _resume(b, b.sessions[s.sid], cursor).backlog] == ["error"]
    _stop(b, 103.0)
    # A fresh store takes the configured key.
    c = _state(tmp_path, 104.0, store="other.sqlite", event_id_key=b"k" * 32)
    _stop(c, 105.0)
    with closing(sqlite3.connect(tmp_path / "other.sqlite")) as db:
        assert db.execute("SELECT value FROM meta WHERE name='event_id_key'").fetchone() == (
            (b"k" * 32).hex(),
        )


def test_the_opaque_index_is_built_again_and_the_counter_goes_on(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0, event_ids="seq")
    s = a.create_session(None, V, "{}", 100.0)
    one = a.open_post_stream(s, 1, "d", None, 100.0)
    two = a.open_post_stream(s, 2, "d", None, 100.0)
    for n in (1, 2):
        _progress(a, one, n, 100.0)
        _progress(a, two, n, 100.0)
    index = {k: (st.stream_id, seq) for k, (st, seq) in s.cursors.items()}
    emitted = a.emitted
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0, event_ids="seq")
    r = b.sessions[s.sid]
    # Two more entries: each call's interrupted error has an ID of its own.
    assert {k: (st.stream_id, seq) for k, (st, seq) in r.cursors.items()} == {
        **index,
        str(emitted + 1): (one.stream_id, 3),
        str(emitted + 2): (two.stream_id, 3),
    }
    found = _resume(b, r, "3")  # the first progress of stream one (IDs 1, 2: the primings)
    assert found.stream is r.streams[one.stream_id]
    assert [e.event_id for e in found.backlog] == ["5", str(emitted + 1)]
    assert b.resolve_cursor(r, str(emitted + 3)) == "unknown_cursor"
    _stop(b, 103.0)


def test_streams_nobody_can_resume_end_at_the_restart(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0, resumable_fraction=0.0)  # rollout: a session without event IDs
    s = a.create_session(None, V, "{}", 100.0)
    g = a.open_standalone(s, None, 100.0)
    call = a.open_post_stream(s, 1, "d", None, 100.0)
    a.emit(call, "{}", "notification", None, 100.0)
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0, resumable_fraction=0.0)
    r = b.sessions[s.sid]
    closed = r.streams[g.stream_id]
    assert (closed.closed_at, closed.close_reason, r.open_streams) == (102.0, "client_gone", 0)
    answered = r.streams[call.stream_id].events[-1]  # answered all the same: the call has an outcome
    assert (answered.kind, answered.event_id, answered.jsonrpc_id) == ("error", None, "1")
    _stop(b, 103.0)


def test_the_counter_goes_on_when_no_session_is_left(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0, event_ids="seq")
    s = a.create_session(None, V, "{}", 100.0)
    _progress(a, a.open_post_stream(s, 1, "d", None, 100.0), 1, 100.0)
    a.end_session(s, "deleted", 100.0)
    emitted = a.emitted
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0, event_ids="seq")
    assert not b.sessions and b.emitted == emitted  # an ID of before is never minted again
    fresh = b.open_post_stream(b.create_session(None, V, "{}", 102.0), 1, "d", None, 102.0)
    assert [e.event_id for e in fresh.events] == [str(emitted + 1)]
    _stop(b, 103.0)


def _crash_copy(state: DurableState, tmp: Path) -> Path:
    """What the disk holds if the server is killed now: everything committed so far (the
    copy is the store's state at this moment; the server goes on writing the original)."""
    state.store.sync()
    copy = tmp / "crashed.sqlite"
    with closing(sqlite3.connect(state.store.path)) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
    return copy


def test_a_crash_that_lost_the_last_batch_refuses_the_lost_cursors(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)
    s = a.create_session(None, V, "{}", 100.0)
    g = a.open_standalone(s, None, 100.0)
    st = a.open_post_stream(s, 1, "d", None, 100.0)
    kept = _progress(a, st, 1, 100.0)
    crashed = _crash_copy(a, tmp_path)
    lost = [_progress(a, st, n, 100.0) for n in (2, 3)]  # sent, never committed
    emitted = a.emitted
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0, store=crashed.name)
    assert b.restored is not None and not b.restored.clean
    r = b.sessions[s.sid]
    # The place of the first lost event now holds the error: same place, other content.
    assert [e.kind for e in _resume(b, r, kept).backlog] == ["error"]
    assert b.resolve_cursor(r, lost[0]) == "tampered"
    assert b.resolve_cursor(r, lost[1]) == "tampered"
    assert r.streams[g.stream_id].closed_at is None  # the standalone stream goes on
    # Counters jump past whatever the lost batch may have handed out.
    assert b.emitted == emitted - 2 + LOST_EVENTS_GAP + 1
    assert b.open_standalone(r, None, 103.0).stream_id == f"g{1 + LOST_STREAMS_GAP + 1}"
    _stop(b, 104.0)


def test_a_crash_with_opaque_ids_never_mints_a_lost_id_again(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0, event_ids="seq")
    s = a.create_session(None, V, "{}", 100.0)
    st = a.open_post_stream(s, 1, "d", None, 100.0)
    other = a.open_post_stream(s, 2, "d", None, 100.0)
    kept = _progress(a, st, 1, 100.0)
    crashed = _crash_copy(a, tmp_path)
    lost = _progress(a, st, 2, 100.0)
    _stop(a, 101.0)
    b = _state(tmp_path, 102.0, store=crashed.name, event_ids="seq")
    r = b.sessions[s.sid]
    assert b.resolve_cursor(r, lost) == "unknown_cursor"
    assert [e.kind for e in _resume(b, r, kept).backlog] == ["error"]
    fresh = [ev.event_id for x in (st, other) for ev in r.streams[x.stream_id].events if ev.kind == "error"]
    assert all(int(i or 0) > LOST_EVENTS_GAP for i in fresh) and lost not in fresh
    _stop(b, 103.0)


def test_the_ledger_opens_and_goes_on_after_a_restart(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)
    s = a.create_session("alice", V, '{"result": 1}', 100.0)
    st = a.open_post_stream(s, 1, "digest-1", "c:1", 100.0)
    g = a.open_standalone(s, "c:2", 100.0)
    _progress(a, st, 1, 100.0)
    _stop(a, 101.0)
    # A stop is a pause: open streams are recorded `paused`, the store keeps them open.
    rows = _ledger(tmp_path, "SELECT stream_id, close_reason, closed_at FROM streams ORDER BY stream_id")
    assert rows == [(g.stream_id, "paused", 101.0), (st.stream_id, "paused", 101.0)]
    b = _state(tmp_path, 102.0)
    _stop(b, 103.0)
    # The rows of before are updated, never inserted again (what the ledger knew stays).
    receipt = hashlib.sha256(b'{"result": 1}').hexdigest()
    assert _ledger(tmp_path, "SELECT COUNT(*), created_at, handshake_receipt FROM sessions") == [
        (1, 100.0, receipt)
    ]
    streams = _ledger(tmp_path, "SELECT stream_id, payload_digest, conn, close_reason FROM streams")
    assert sorted(streams) == sorted(
        [(st.stream_id, "digest-1", "c:1", "completed"), (g.stream_id, None, "c:2", "paused")]
    )
    kinds = _ledger(tmp_path, "SELECT kind, jsonrpc_id FROM events_sent WHERE stream_id=?", st.stream_id)
    assert kinds == [("priming", None), ("notification", None), ("error", "1")]
    meta = dict(_ledger(tmp_path, "SELECT name, value FROM meta"))
    assert meta["restores"] == "1" and meta["restored_at"] == "102.0"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.sqlite*"))
    assert s.sid.encode() not in raw  # the raw ID is in the store, never the ledger


def test_a_store_is_private_and_checked_against_the_settings(tmp_path: Path) -> None:
    a = _state(tmp_path, 100.0)
    a.create_session(None, V, "{}", 100.0)
    _stop(a, 101.0)
    assert stat.S_IMODE(os.stat(tmp_path / "store.sqlite").st_mode) == 0o600
    with pytest.raises(ValueError, match="event IDs of scheme e1, this server mints seq"):
        _state(tmp_path, 102.0, event_ids="seq")
    with pytest.raises(ValueError, match="not a server store"):
        Store(tmp_path / "ledger.sqlite")
    with pytest.raises(ValueError, match="two files"):
        ServerConfig(store=str(tmp_path / "x.sqlite"), ledger_path=str(tmp_path / "x.sqlite")).check()


def test_store_comes_from_the_flag_or_the_config_file(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    assert config_from_args(p.parse_args(["serve", "--store", "s.sqlite"])).store == "s.sqlite"
    assert config_from_args(p.parse_args(["serve"])).store is None
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"store": "t.sqlite"}), encoding="utf-8")
    assert read_config_file(cfg) == {"store": "t.sqlite"}
    cfg.write_text(json.dumps({"store": 3}), encoding="utf-8")
    with pytest.raises(ValueError, match="key 'store': expected a string"):
        read_config_file(cfg)


# -- live: a real `lab serve` stopped mid-call and started again -----------------------


@contextmanager
def _serving(tmp: Path, port: int, *args: str) -> Iterator[LiveProcess]:
    """`lab serve` on `port` (0: any) with the ledger of `tmp`; stopped (SIGTERM) at the end
    if the test has not stopped it. No keep-alive comments: a stream that stalls fails the
    test by the client's read timeout instead of holding it forever."""
    log = tmp / f"server-{time.monotonic_ns()}.log"
    argv = [
        LAB,
        "serve",
        "--port",
        str(port),
        "--ledger",
        str(tmp / "ledger.sqlite"),
        "--keepalive",
        "0",
        *args,
    ]
    env = {**os.environ, "LAB_LEDGER_KEY": LEDGER_KEY}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        yield LiveProcess(proc, wait_for_line(proc, log, "lab-serve listening on "), log)
    finally:
        stop(proc)


def _port(srv: LiveProcess) -> int:
    port = urlsplit(srv.url).port
    assert port is not None
    return port


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def _ticker(m: Mcp) -> tuple[int, dict[str, Any]]:
    """A ticker call (200 progress, one per 20 ms): its request ID and body."""
    rid = m.take_id()
    body = jsonrpc.request(
        rid,
        "tools/call",
        {"name": "ticker", "arguments": {"count": 200, "interval_ms": 20}, "_meta": {"progressToken": "t"}},
    )
    return rid, body


def _seq(e: SseEvent) -> int:
    parsed = parse_event_id(e.id or "")
    assert parsed is not None, e.id
    return parsed.sequence


def _reconnect(m: Mcp) -> None:
    """A new HTTP client: the old one's connections went with the server."""
    m.client.close()
    m.client = httpx.Client(timeout=10.0)


def _assert_resumed_to_the_error(rest: list[SseEvent], after: SseEvent, rid: int) -> None:
    """`rest` (a resumption from `after`) is the rest of the call's stream: every event
    after the cursor in order, progress only, then the interrupted call's error, for the
    call's request ID, last."""
    assert rest and all(e.id for e in rest)
    assert [_seq(e) for e in rest] == list(range(_seq(after) + 1, _seq(after) + 1 + len(rest)))
    msgs = messages(rest)
    first = json.loads(after.data)["params"]["progress"] + 1 if after.data else 1
    assert [x["params"]["progress"] for x in msgs[:-1]] == list(range(first, first + len(msgs) - 1))
    assert all(x["params"]["progressToken"] == "t" for x in msgs[:-1])
    assert msgs[-1]["id"] == rid
    assert msgs[-1]["error"] == {"code": jsonrpc.INTERNAL_ERROR, "message": INTERRUPTED}


@pytest.mark.live
def test_sigterm_then_restart_keeps_the_session_and_the_call_resumes_to_its_error(tmp_path: Path) -> None:
    store = str(tmp_path / "store.sqlite")
    with _serving(tmp_path, 0, "--store", store) as first:
        port = _port(first)
        m = Mcp(first.url)
        assert m.initialize().status_code == 200
        rid, body = _ticker(m)
        with m.stream("POST", body) as (r, events):
            assert r.status_code == 200
            seen = [next(events) for _ in range(6)]  # priming and 5 progress; then the client goes
        assert stop(first.proc) == 0  # SIGTERM mid-call: a clean stop
    paused = _ledger(tmp_path, "SELECT close_reason FROM streams WHERE request_id=?", str(rid))
    assert paused == [("paused",)]
    with _serving(tmp_path, port, "--store", store) as second:
        assert second.url == first.url
        assert "restored from the store: sessions 1, streams 1," in second.output()
        _reconnect(m)
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 200  # not 404
        with m.stream("GET", headers={"last-event-id": seen[-1].id or ""}) as (r, resumed):
            assert r.status_code == 200
            rest = list(resumed)  # ends: the stream is complete
        _assert_resumed_to_the_error(rest, seen[-1], rid)
        # Nothing the server sent before the stop went missing: every progress it
        # recorded is in what the client saw and replayed.
        sent = _ledger(
            tmp_path,
            "SELECT COUNT(*) FROM events_sent e JOIN streams s USING (session, stream_id)"
            " WHERE s.request_id=? AND e.kind='notification' AND e.replay=0",
            str(rid),
        )
        assert sent == [(len(messages(seen)) + len(messages(rest)) - 1,)]
        assert m.sid is not None and m.sid not in second.output() + first.output()
    closed = _ledger(tmp_path, "SELECT close_reason FROM streams WHERE request_id=?", str(rid))
    assert closed == [("completed",)]  # the row of before, updated after the restart
    assert _ledger(tmp_path, "SELECT COUNT(*) FROM requests WHERE cursor_verdict='valid'") == [(1,)]


@pytest.mark.live
def test_sigkill_then_restart_answers_from_what_the_store_kept(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"

    def stored(event_id: str) -> bool:
        return any(e.event_id == event_id for e in read_store(store).events)

    with _serving(tmp_path, 0, "--store", str(store)) as first:
        port = _port(first)
        m = Mcp(first.url)
        assert m.initialize().status_code == 200
        rid, body = _ticker(m)
        with m.stream("POST", body) as (r, events):
            assert r.status_code == 200
            seen = [next(events) for _ in range(6)]
            safe = seen[-1]
            _wait_for("the store holds the client's cursor", lambda: stored(safe.id or ""))
            latest = [next(events) for _ in range(3)][-1]  # may be in the batch a kill loses
            first.proc.kill()
            first.proc.wait(timeout=10)
    with _serving(tmp_path, port, "--store", str(store)) as second:
        assert "the last stop was not clean" in second.output()
        _reconnect(m)
        # The session was committed before the cursor was: it survives, whatever was lost.
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 200
        # The newest cursor: resumed if the store kept it, else refused with a normal verdict.
        with m.stream("GET", headers={"last-event-id": latest.id or ""}) as (r, resumed):
            if r.status_code == 200:
                _assert_resumed_to_the_error(list(resumed), latest, rid)
            else:
                r.read()
                assert r.status_code == 400 and "Last-Event-ID rejected: tampered" in r.text
        # A cursor the store is known to hold resumes, whatever the kill lost after it.
        with m.stream("GET", headers={"last-event-id": safe.id or ""}) as (r, resumed):
            assert r.status_code == 200
            rest = list(resumed)
        _assert_resumed_to_the_error(rest, safe, rid)
        kept = {_seq(e): e.id for e in rest[:-1]}
        assert all(
            kept[_seq(e)] == e.id for e in (*seen, latest) if _seq(e) in kept
        )  # what it replays is what was sent
        # The ledger opened again and goes on (its own last batch may be lost too).
        _wait_for(
            "the ledger records requests after the restart",
            lambda: (
                _ledger(tmp_path, "SELECT COUNT(*) FROM requests WHERE cursor_verdict='valid'")[0][0] >= 1
            ),
        )


@pytest.mark.live
def test_without_a_store_a_restart_loses_the_session(tmp_path: Path) -> None:
    with _serving(tmp_path, 0) as first:
        port = _port(first)
        m = Mcp(first.url)
        assert m.initialize().status_code == 200
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 200
        assert stop(first.proc) == 0
    with _serving(tmp_path, port):
        _reconnect(m)
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 404
