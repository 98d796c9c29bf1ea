"""The reference server's rules, each against a live uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.wire import jsonrpc
from lab.wire.event_ids import parse_event_id, post_stream_id, session_tag
from lab.wire.sse import SseDecoder
from tests.livesrv import LiveProcess, reference_server
from tests.server.mcp_http import POST_HEADERS, Mcp, messages

pytestmark = pytest.mark.live
ADMIN = "admin-token-0123"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    tmp = tmp_path_factory.mktemp("srv")
    with reference_server(tmp, "--tokens", "tok-a=alice,tok-a2=alice,tok-b=bob", "--admin-token", ADMIN) as p:
        yield p


@pytest.fixture
def mcp(srv: LiveProcess) -> Iterator[Mcp]:
    m = Mcp(srv.url, token="tok-a")
    assert m.initialize().status_code == 200
    yield m
    m.close()


def ledger(srv: LiveProcess) -> sqlite3.Connection:
    time.sleep(0.2)  # the writer thread commits every 50 ms
    path = Path(srv.log).parent / "ledger.sqlite"
    return sqlite3.connect(path)


# -- sessions ----------------------------------------------------------------------------


def test_initialize_returns_a_secure_session_id_and_advertises_e1(srv: LiveProcess) -> None:
    m = Mcp(srv.url, token="tok-a")
    r = m.initialize()
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    sid = r.headers["mcp-session-id"]
    assert len(sid) >= 40 and all(0x21 <= ord(c) <= 0x7E for c in sid)
    caps = r.json()["result"]["capabilities"]
    assert caps["experimental"]["mcp-lab/event-ids"] == {"scheme": "e1"}
    other = Mcp(srv.url, token="tok-a")
    other.initialize()
    assert other.sid != sid


def test_request_without_session_id_is_400_unknown_is_404(mcp: Mcp) -> None:
    body = jsonrpc.request(99, "tools/list")
    no_sid = mcp.client.post(
        mcp.url, content=json.dumps(body), headers={**POST_HEADERS, "authorization": "Bearer tok-a"}
    )
    assert no_sid.status_code == 400
    mcp.sid = "not-a-session"
    assert mcp.post_raw(body).status_code == 404


def test_delete_terminates_then_404_on_every_method(mcp: Mcp) -> None:
    r = mcp.client.delete(mcp.url, headers=mcp.headers())
    assert r.status_code == 200
    assert mcp.post_raw(jsonrpc.request(5, "ping")).status_code == 404
    assert mcp.client.get(mcp.url, headers=mcp.headers({"accept": "text/event-stream"})).status_code == 404
    assert mcp.client.delete(mcp.url, headers=mcp.headers()).status_code == 404


def test_initialize_with_a_session_id_is_refused(mcp: Mcp) -> None:
    body = jsonrpc.request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    assert mcp.post_raw(body).status_code == 400


# -- protocol version --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_unsupported_version_header_is_400_on_every_method(mcp: Mcp, method: str) -> None:
    h = mcp.headers({"mcp-protocol-version": "1999-01-01", "accept": "application/json, text/event-stream"})
    if method == "POST":
        r = mcp.client.post(
            mcp.url,
            content=json.dumps(jsonrpc.request(7, "ping")),
            headers={**h, "content-type": "application/json"},
        )
    else:
        r = mcp.client.request(method, mcp.url, headers=h)
    assert r.status_code == 400


def test_missing_version_header_follows_the_negotiated_revision(mcp: Mcp) -> None:
    h = mcp.headers(POST_HEADERS)
    del h["mcp-protocol-version"]
    r = mcp.client.post(mcp.url, content=json.dumps(jsonrpc.request(8, "ping")), headers=h)
    assert r.status_code == 200


def test_version_header_other_than_negotiated_is_400(mcp: Mcp) -> None:
    assert mcp.post_raw(jsonrpc.request(9, "ping"), {"mcp-protocol-version": "2025-06-18"}).status_code == 400


def test_version_is_negotiated_at_initialize(srv: LiveProcess) -> None:
    for v in ("2025-03-26", "2025-06-18", "2025-11-25"):
        m = Mcp(srv.url, token="tok-a")
        assert m.initialize(v).json()["result"]["protocolVersion"] == v
    m = Mcp(srv.url, token="tok-a")
    assert m.initialize("2099-01-01").json()["result"]["protocolVersion"] == "2025-11-25"


# -- origin, host, tokens ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://127.0.0.1:8080", 200),
        ("http://localhost:3000", 200),
        ("http://127.0.0.1", 200),
        ("http://evil.example", 403),
        ("http://127.0.0.1:80.evil.example", 403),
        ("null", 403),
        ("https://127.0.0.1:8080", 403),
    ],
)
def test_origin_allow_list(mcp: Mcp, origin: str, status: int) -> None:
    assert mcp.post_raw(jsonrpc.request(mcp.take_id(), "ping"), {"origin": origin}).status_code == status


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_illegal_origin_is_403_on_every_method(mcp: Mcp, method: str) -> None:
    h = mcp.headers(
        {
            "origin": "http://attacker.example",
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
    )
    r = mcp.client.request(method, mcp.url, headers=h, content=b"{}" if method == "POST" else None)
    assert r.status_code == 403


def test_dns_rebinding_host_is_refused(mcp: Mcp) -> None:
    r = mcp.post_raw(jsonrpc.request(mcp.take_id(), "ping"), {"host": "attacker.example:80"})
    assert r.status_code == 421


def test_token_required_and_subject_bound_to_session(srv: LiveProcess, mcp: Mcp) -> None:
    ping = jsonrpc.request(mcp.take_id(), "ping")
    h = mcp.headers(POST_HEADERS)
    del h["authorization"]
    assert mcp.client.post(mcp.url, content=json.dumps(ping), headers=h).status_code == 401
    mcp.token = "wrong"
    assert mcp.post_raw(ping).status_code == 401
    mcp.token = "tok-b"  # a valid token, of another subject: an old token with a new session fails
    assert mcp.post_raw(ping).status_code == 403
    mcp.token = "tok-a2"  # another token of the same subject is fine
    assert mcp.post_raw(jsonrpc.request(mcp.take_id(), "ping")).status_code == 200


# -- bad input ---------------------------------------------------------------------------


def test_malformed_json_gets_a_parse_error(mcp: Mcp) -> None:
    r = mcp.client.post(mcp.url, content=b"{not json", headers=mcp.headers(POST_HEADERS))
    assert r.status_code == 400 and r.json()["error"]["code"] == jsonrpc.PARSE_ERROR


def test_wrong_content_type_and_accept(mcp: Mcp) -> None:
    body = json.dumps(jsonrpc.request(mcp.take_id(), "ping"))
    r = mcp.client.post(
        mcp.url, content=body, headers=mcp.headers({**POST_HEADERS, "content-type": "text/plain"})
    )
    assert r.status_code == 415
    r = mcp.client.post(
        mcp.url, content=body, headers=mcp.headers({**POST_HEADERS, "accept": "application/json"})
    )
    assert r.status_code == 406
    r = mcp.client.get(mcp.url, headers=mcp.headers({"accept": "application/json"}))
    assert r.status_code == 406


def test_oversized_body_is_413(mcp: Mcp) -> None:
    big = json.dumps(
        jsonrpc.request(mcp.take_id(), "tools/call", {"name": "echo", "arguments": {"text": "x" * (2 << 20)}})
    )
    assert mcp.client.post(mcp.url, content=big, headers=mcp.headers(POST_HEADERS)).status_code == 413


def test_batches_only_where_the_revision_allows_them(srv: LiveProcess, mcp: Mcp) -> None:
    batch = [jsonrpc.request(mcp.take_id(), "ping"), jsonrpc.request(mcp.take_id(), "tools/list")]
    assert mcp.post_raw(batch).status_code == 400  # 2025-11-25 forbids batches
    old = Mcp(srv.url, token="tok-a", version="2025-03-26")
    old.initialize("2025-03-26")
    h = old.headers(POST_HEADERS)
    h.pop("mcp-protocol-version")  # 2025-03-26 has no version header
    r = old.client.post(old.url, content=json.dumps(batch), headers=h)
    assert r.status_code == 200 and [m["id"] for m in r.json()] == [b["id"] for b in batch]


def test_reused_request_id_is_refused(mcp: Mcp) -> None:
    assert mcp.call("echo", {"text": "a"}, rid=500)[0].status_code == 200
    assert mcp.call("echo", {"text": "b"}, rid=500)[0].status_code == 400


def test_notification_gets_202(mcp: Mcp) -> None:
    r = mcp.post_raw(jsonrpc.notification("notifications/initialized"))
    assert r.status_code == 202 and r.content == b""


# -- streams -----------------------------------------------------------------------------


def test_post_stream_priming_progress_response(mcp: Mcp) -> None:
    r, events = mcp.call("ticker", {"count": 3, "interval_ms": 1}, rid=42)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert events[0].is_priming
    msgs = messages(events)
    assert [m.get("method") for m in msgs] == [jsonrpc.PROGRESS] * 3 + [None]
    assert all(m["params"]["progressToken"] == "pt-42" for m in msgs[:3])
    assert msgs[-1]["id"] == 42 and "result" in msgs[-1]
    assert mcp.sid is not None
    want = post_stream_id(session_tag(mcp.sid), 42)
    parsed = [parse_event_id(e.id or "") for e in events]
    assert all(p is not None and p.stream_id == want for p in parsed)
    assert [p.sequence for p in parsed if p] == list(range(5))


def test_no_priming_event_before_2025_11_25(srv: LiveProcess) -> None:
    m = Mcp(srv.url, token="tok-a", version="2025-06-18")
    m.initialize("2025-06-18")
    _, events = m.call("echo", {"text": "x"})
    assert not events[0].is_priming and messages(events)[0]["result"]


def test_standalone_get_carries_notifications_never_responses(mcp: Mcp) -> None:
    with mcp.stream("GET") as (r, events):
        assert r.status_code == 200
        first = next(events)
        assert first.is_priming and parse_event_id(first.id or "").stream_id.startswith("g")  # type: ignore[union-attr]
        resp, _ = mcp.call("ledger.append", {"entry": "e"}, key="k-standalone")
        assert resp.status_code == 200
        note = next(events)
        msg = json.loads(note.data)
        assert msg["method"] == "notifications/message" and "id" not in msg
        assert msg["params"]["logger"] == "mcp-lab/ledger" and msg["params"]["level"] == "info"


def test_server_initiated_close_sends_retry_then_client_resumes(mcp: Mcp) -> None:
    body = jsonrpc.request(
        mcp.take_id(),
        "tools/call",
        {
            "name": "ticker",
            "arguments": {"count": 6, "interval_ms": 5, "close_after": 3, "retry_ms": 250},
            "_meta": {"progressToken": 1},
        },
    )
    with mcp.stream("POST", body) as (_, events):
        first = list(events)
    assert first[-1].retry == 250 and first[-1].id is None
    got = [e for e in first if e.id]
    assert len(got) == 3  # priming + 2 progress, then the server closed
    seen = list(got)
    for _ in range(10):
        if seen and json.loads(seen[-1].data or "{}").get("result"):
            break
        with mcp.stream("GET", headers={"last-event-id": seen[-1].id or ""}) as (r, events):
            assert r.status_code == 200
            seen += [e for e in events if e.id]
    seqs = [parse_event_id(e.id or "").sequence for e in seen]  # type: ignore[union-attr]
    assert seqs == list(range(8))  # priming, 6 progress, response: each exactly once


def test_resumption_replays_that_stream_only_without_gap_or_duplicate(mcp: Mcp) -> None:
    # Two concurrent streams; the first is cut mid-way and resumed while the tool keeps ticking.
    other = jsonrpc.request(
        mcp.take_id(),
        "tools/call",
        {
            "name": "ticker",
            "arguments": {"count": 30, "interval_ms": 10},
            "_meta": {"progressToken": "other"},
        },
    )
    body = jsonrpc.request(
        mcp.take_id(),
        "tools/call",
        {"name": "ticker", "arguments": {"count": 60, "interval_ms": 10}, "_meta": {"progressToken": "mine"}},
    )
    with mcp.stream("POST", other) as (_, other_events):
        with mcp.stream("POST", body) as (_, events):
            before = [next(events) for _ in range(8)]
        next(other_events)
        time.sleep(0.15)  # events are produced while we are away
        with mcp.stream("GET", headers={"last-event-id": before[-1].id or ""}) as (r, events):
            assert r.status_code == 200
            after = list(events)
    all_events = before + [e for e in after if e.id]
    seqs = [parse_event_id(e.id or "").sequence for e in all_events]  # type: ignore[union-attr]
    assert seqs == list(range(62)), "gap or duplicate at the replay/live switch"
    for m in messages(all_events):
        assert (
            m.get("params", {}).get("progressToken", "mine") == "mine"
            and m.get("id", body["id"]) == body["id"]
        )


# -- cursor rejection --------------------------------------------------------------------


def test_cursors_of_other_sessions_tampered_or_unknown_are_rejected(srv: LiveProcess, mcp: Mcp) -> None:
    _, mine = mcp.call("echo", {"text": "x"})
    other = Mcp(srv.url, token="tok-a")
    other.initialize()
    _, theirs = other.call("echo", {"text": "y"})
    good = mine[0].id or ""
    cases = {
        "foreign_session": theirs[0].id or "",
        "tampered": good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB"),
        "malformed": "definitely-not-ours",
    }
    for verdict, cursor in cases.items():
        r = mcp.client.get(
            mcp.url, headers=mcp.headers({"accept": "text/event-stream", "last-event-id": cursor})
        )
        assert r.status_code == 400, verdict
        assert verdict in r.json()["error"]["message"]
    db = ledger(srv)
    verdicts = {
        row[0]
        for row in db.execute(
            "SELECT cursor_verdict FROM requests WHERE status = 400 AND cursor_verdict IS NOT NULL"
        )
    }
    assert {"foreign_session", "tampered", "malformed"} <= verdicts


# -- writes ------------------------------------------------------------------------------


def test_write_once_per_idempotency_key_even_after_a_cut(srv: LiveProcess, mcp: Mcp) -> None:
    body = jsonrpc.request(
        mcp.take_id(),
        "tools/call",
        {
            "name": "ledger.append",
            "arguments": {"entry": "pay"},
            "_meta": {"mcp-lab/idempotency-key": "k-cut"},
        },
    )
    with mcp.stream("POST", body) as (_, events):
        next(events)  # priming only: then the connection is cut before the response
    time.sleep(0.2)  # the server performs the write anyway (a disconnect is not a cancel)
    _, retried = mcp.call("ledger.append", {"entry": "pay"}, key="k-cut")  # a retry: new request ID, same key
    result = messages(retried)[-1]["result"]["structuredContent"]
    assert "effect" not in result  # the answer is the original receipt; the ledger says it was replayed
    db = ledger(srv)
    effects = [
        row[0]
        for row in db.execute("SELECT effect FROM dispatches WHERE idempotency_key = 'k-cut' ORDER BY at")
    ]
    assert effects == ["performed", "replayed"]
    receipts = {
        row[0] for row in db.execute("SELECT receipt FROM dispatches WHERE idempotency_key = 'k-cut'")
    }
    assert receipts == {result["receipt"]}


def test_write_without_key_is_an_error(mcp: Mcp) -> None:
    _, events = mcp.call("ledger.append", {"entry": "x"})
    assert messages(events)[-1]["error"]["code"] == jsonrpc.INVALID_PARAMS


def test_unknown_tool_and_method(mcp: Mcp) -> None:
    _, events = mcp.call("nope")
    assert messages(events)[-1]["error"]["code"] == jsonrpc.INVALID_PARAMS
    r = mcp.post_raw(jsonrpc.request(mcp.take_id(), "resources/list"))
    assert messages(SseDecoder().feed(r.content))[-1]["error"]["code"] == jsonrpc.METHOD_NOT_FOUND


def test_cancel_stops_the_tool_and_sends_no_response(mcp: Mcp) -> None:
    rid = mcp.take_id()
    body = jsonrpc.request(
        rid,
        "tools/call",
        {"name": "ticker", "arguments": {"count": 1000, "interval_ms": 10}, "_meta": {"progressToken": "c"}},
    )
    with mcp.stream("POST", body) as (_, events):
        next(events)
        assert (
            mcp.post_raw(jsonrpc.notification("notifications/cancelled", {"requestId": rid})).status_code
            == 202
        )
        rest = list(events)  # the stream ends
    assert not any("result" in m or "error" in m for m in messages(rest))


# -- admin and ledger --------------------------------------------------------------------


def test_admin_expire_needs_the_token_and_expires_at_once(srv: LiveProcess, mcp: Mcp) -> None:
    url = srv.url.replace("/mcp", "/lab-admin/expire")
    assert (
        httpx.post(
            url, headers={"x-lab-admin-token": "wrong-token", "mcp-session-id": mcp.sid or ""}
        ).status_code
        == 403
    )
    assert (
        httpx.post(url, headers={"x-lab-admin-token": ADMIN, "mcp-session-id": mcp.sid or ""}).status_code
        == 200
    )
    assert mcp.post_raw(jsonrpc.request(mcp.take_id(), "ping")).status_code == 404
    # The admin path is not the MCP endpoint's auth path: a bearer token does not open it.
    assert (
        httpx.post(url, headers={"authorization": "Bearer tok-a", "mcp-session-id": "x"}).status_code == 403
    )


def test_ledger_never_holds_a_raw_session_id_or_token(srv: LiveProcess, mcp: Mcp) -> None:
    mcp.call("ledger.append", {"entry": "x"}, key="k-ledger")
    time.sleep(0.3)
    raw = b"".join(p.read_bytes() for p in Path(srv.log).parent.glob("ledger.sqlite*"))
    assert mcp.sid is not None and mcp.sid.encode() not in raw
    assert b"tok-a" not in raw
    db = ledger(srv)
    row = db.execute("SELECT session, auth_subject, protocol_version FROM sessions LIMIT 1").fetchone()
    assert row[0].startswith("s_") and row[1] in ("alice", "bob")


def test_the_tools_are_annotated_truthfully_for_the_retry_rule() -> None:
    # A client that lost an answer may re-send only what these say is safe to re-send: the
    # read-only tools; ledger.append only with its idempotency key (called again without
    # it, it appends again), which its entry says the server honours.
    from lab.faults.declarations import tool_annotations
    from lab.server.tools import TOOL_LIST

    told = tool_annotations({"result": {"tools": TOOL_LIST}})
    assert told is not None
    safe = {name for name, a in told.items() if a.get("readOnlyHint") or a.get("idempotentHint")}
    assert safe == {"echo", "clock", "ticker"}
    assert told["ledger.append"] == {
        "readOnlyHint": False,
        "idempotentHint": False,
        "mcp-lab/idempotency-key": True,
    }
