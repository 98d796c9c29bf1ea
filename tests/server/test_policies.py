"""Server settings: expiry, DELETE refusal, cursor policies, load shedding, rollout and rollback."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from lab.wire import jsonrpc
from tests.livesrv import LiveProcess, reference_server
from tests.server.mcp_http import Mcp, messages

pytestmark = pytest.mark.live
ADMIN = "admin-token-0123"


def db_of(p: LiveProcess) -> sqlite3.Connection:
    time.sleep(0.2)
    return sqlite3.connect(Path(p.log).parent / "ledger.sqlite")


def test_idle_session_expires_and_its_streams_end_with_a_reason(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--session-ttl", "1") as srv:
        m = Mcp(srv.url)
        m.initialize()
        body = jsonrpc.request(
            m.take_id(),
            "tools/call",
            {
                "name": "ticker",
                "arguments": {"count": 1000, "interval_ms": 50},
                "_meta": {"progressToken": 1},
            },
        )
        with m.stream("POST", body) as (_, events):
            first = [next(events) for _ in range(2)]
        time.sleep(2.6)  # idle: no request, no live connection
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 404
        r = m.client.get(
            m.url, headers=m.headers({"accept": "text/event-stream", "last-event-id": first[-1].id or ""})
        )
        assert r.status_code == 404
        db = db_of(srv)
        assert db.execute("SELECT end_reason FROM sessions").fetchone()[0] == "expired"
        assert (
            db.execute("SELECT close_reason FROM streams WHERE opened_by='POST'").fetchone()[0]
            == "session_expired"
        )


def test_delete_refused_is_405_and_session_lives(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--delete", "refuse") as srv:
        m = Mcp(srv.url)
        m.initialize()
        r = m.client.delete(m.url, headers=m.headers())
        assert r.status_code == 405 and "POST" in r.headers["allow"]
        assert m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code == 200


@pytest.mark.parametrize(
    ("args", "status"), [(("--cursor-reject-status", "409"), 409), (("--cursor-reject-status", "410"), 410)]
)
def test_cursor_reject_status_is_configurable(tmp_path: Path, args: tuple[str, str], status: int) -> None:
    with reference_server(tmp_path, *args) as srv:
        m = Mcp(srv.url)
        m.initialize()
        r = m.client.get(
            m.url, headers=m.headers({"accept": "text/event-stream", "last-event-id": "garbage"})
        )
        assert r.status_code == status


def test_fresh_cursor_policy_opens_a_new_standalone_stream(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--cursor-policy", "fresh") as srv:
        m = Mcp(srv.url)
        m.initialize()
        with m.stream("GET", headers={"last-event-id": "garbage"}) as (r, events):
            assert r.status_code == 200
            assert next(events).is_priming
        assert (
            db_of(srv)
            .execute("SELECT cursor_verdict FROM requests WHERE last_event_id='garbage'")
            .fetchone()[0]
            == "malformed"
        )


def test_concurrent_stream_limit_gives_503_with_retry_after(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--max-streams", "2", "--retry-after", "3") as srv:
        m = Mcp(srv.url)
        m.initialize()
        with m.stream("GET") as (r1, _), m.stream("GET") as (r2, _):
            assert (r1.status_code, r2.status_code) == (200, 200)
            r3 = m.client.get(m.url, headers=m.headers({"accept": "text/event-stream"}))
            assert r3.status_code == 503 and r3.headers["retry-after"] == "3"


def test_request_rate_limit_gives_429_with_retry_after(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--max-rps", "5") as srv:
        m = Mcp(srv.url)
        m.initialize()
        statuses = [m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code for _ in range(30)]
        assert 429 in statuses and 200 in statuses
        r = next(
            r
            for r in (m.post_raw(jsonrpc.request(m.take_id(), "ping")) for _ in range(30))
            if r.status_code == 429
        )
        assert r.headers["retry-after"] == "1"


def test_rollout_fraction_zero_makes_nothing_resumable_but_writes_the_shadow_ledger(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--resumable-fraction", "0") as srv:
        m = Mcp(srv.url)
        m.initialize()
        _, events = m.call("ticker", {"count": 2, "interval_ms": 1})
        assert all(e.id is None for e in events) and len(messages(events)) == 3
        db = db_of(srv)
        assert db.execute("SELECT resumable, shadow FROM sessions").fetchone() == (0, 1)
        assert db.execute("SELECT COUNT(*) FROM events_sent").fetchone()[0] == 3
        assert db.execute("SELECT COUNT(*) FROM streams").fetchone()[0] == 1


def test_rollout_fraction_splits_sessions(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--resumable-fraction", "0.5") as srv:
        resumable = 0
        for _ in range(40):
            m = Mcp(srv.url)
            m.initialize()
            _, events = m.call("echo", {"text": "x"})
            resumable += events[0].id is not None
        assert 8 <= resumable <= 32  # about half, by a hash of the session ID


def test_rollback_keeps_old_cursors_and_stops_resumption_for_new_streams(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv:
        m = Mcp(srv.url)
        m.initialize()
        body = jsonrpc.request(
            m.take_id(),
            "tools/call",
            {"name": "ticker", "arguments": {"count": 20, "interval_ms": 20}, "_meta": {"progressToken": 1}},
        )
        with m.stream("POST", body) as (_, events):
            old = [next(events) for _ in range(3)]
        r = httpx.post(srv.url.replace("/mcp", "/lab-admin/rollback"), headers={"x-lab-admin-token": ADMIN})
        assert r.status_code == 200
        _, new_events = m.call("echo", {"text": "after rollback"})
        assert all(e.id is None for e in new_events)  # new streams: no cursor, not resumable
        with m.stream("GET", headers={"last-event-id": old[-1].id or ""}) as (r2, events):
            assert r2.status_code == 200  # the old generation's cursor index was kept
            rest = list(events)
        assert json.loads(rest[-1].data)["result"]  # ... and its request was drained to the end
        db = db_of(srv)
        assert db.execute("SELECT COUNT(*) FROM events_sent").fetchone()[0] > 0  # the ledger is kept


def test_silent_streams_get_keepalive_comments(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--keepalive", "0.3") as srv:
        m = Mcp(srv.url)
        m.initialize()
        with m.client.stream("GET", m.url, headers=m.headers({"accept": "text/event-stream"})) as r:
            raw = b""
            for chunk in r.iter_raw():
                raw += chunk
                if raw.split(b"\n\n").count(b":") >= 2:
                    break
        blocks = raw.split(b"\n\n")
        assert blocks[0].startswith(b"id: ") and blocks[1:3] == [b":", b":"]  # priming, then comments only


def test_cursor_of_a_forgotten_stream_is_rejected_as_unknown_stream(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--completed-stream-ttl", "0.5") as srv:
        m = Mcp(srv.url)
        m.initialize()
        _, events = m.call("echo", {"text": "x"})
        cursor = events[0].id or ""
        time.sleep(2.2)  # completed, then forgotten by the sweeper (runs every second)
        m.post_raw(jsonrpc.request(m.take_id(), "ping"))  # the session itself stays alive
        r = m.client.get(m.url, headers=m.headers({"accept": "text/event-stream", "last-event-id": cursor}))
        assert r.status_code == 400 and "unknown_stream" in r.json()["error"]["message"]
        assert (
            db_of(srv)
            .execute("SELECT COUNT(*) FROM requests WHERE cursor_verdict='unknown_stream'")
            .fetchone()[0]
            == 1
        )
