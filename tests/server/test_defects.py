"""`lab serve --defect NAME`: each deliberate misbehaviour shows on the wire, and the
pristine server (same settings, no defect) does not show it (issue 10 §6)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab.server.defects import DEFECT_NAMES, STALL_SESSIONS
from lab.wire import jsonrpc
from lab.wire.sse import SseEvent
from tests.livesrv import LAB, ROOT, LiveProcess, reference_server
from tests.server.mcp_http import POST_HEADERS, Mcp, messages

pytestmark = pytest.mark.live
OPAQUE = ("--event-ids", "seq", "--keepalive", "0.2")
"""As the lab's black-box runs see servers: opaque IDs."""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    with reference_server(tmp_path_factory.mktemp("pristine"), *OPAQUE) as p:
        yield p


@contextmanager
def defective(tmp: Path, name: str) -> Iterator[LiveProcess]:
    with reference_server(tmp, *OPAQUE, "--defect", name) as p:
        assert f"DEFECTS ON PURPOSE: {name}" in p.output()
        yield p


def _session(srv: LiveProcess) -> Mcp:
    m = Mcp(srv.url)
    assert m.initialize().status_code == 200
    return m


def _resume(m: Mcp, cursor: str, *, limit: float = 5.0) -> tuple[int, list[SseEvent]]:
    """GET with Last-Event-ID; the events until the stream ends (or `limit` seconds)."""
    out: list[SseEvent] = []
    with m.stream("GET", headers={"last-event-id": cursor}) as (r, events):
        if r.status_code != 200:
            return r.status_code, out
        deadline = time.monotonic() + limit
        for e in events:
            out.append(e)
            if time.monotonic() > deadline:
                break
    return r.status_code, out


def _ids(events: list[SseEvent]) -> list[str]:
    return [e.id for e in events if e.id]


def _ticker(m: Mcp, rid: int, count: int = 3) -> list[SseEvent]:
    r, events = m.call("ticker", {"count": count, "interval_ms": 0}, rid=rid)
    assert r.status_code == 200
    return events


# -- resumption defects --------------------------------------------------------------------


def _shared_store_case(srv: LiveProcess) -> tuple[list[str], list[str]]:
    """A and B each run request id 5; A resumes from its priming event. Returns (IDs B was
    sent, IDs A's resumption replayed)."""
    a, b = _session(srv), _session(srv)
    mine = _ticker(a, rid=5)
    theirs = _ticker(b, rid=5)
    status, replayed = _resume(a, mine[0].id or "")
    assert status == 200
    return _ids(theirs), _ids(replayed)


def test_shared_event_store_replays_another_sessions_events(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "shared-event-store") as srv:
        theirs, replayed = _shared_store_case(srv)
        assert set(theirs) & set(replayed), "B's events were replayed to A"
    theirs, replayed = _shared_store_case(pristine)
    assert not set(theirs) & set(replayed) and len(replayed) == 4  # A's own 3 progress + response


def _other_streams_case(srv: LiveProcess) -> list[dict[str, Any]]:
    m = _session(srv)
    first = _ticker(m, rid=1)
    m.call("echo", {"text": "second stream"}, rid=2)
    status, replayed = _resume(m, first[0].id or "")
    assert status == 200
    return messages(replayed)


def test_replay_other_streams_mixes_the_sessions_streams(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "replay-other-streams") as srv:
        assert 2 in [msg.get("id") for msg in _other_streams_case(srv)]
    assert [msg.get("id") for msg in _other_streams_case(pristine)] == [None, None, None, 1]


def _from_start_case(srv: LiveProcess) -> tuple[list[str], list[str]]:
    m = _session(srv)
    events = _ticker(m, rid=1)
    status, replayed = _resume(m, events[2].id or "")  # after progress 2
    assert status == 200
    return _ids(events), _ids(replayed)


def test_replay_from_start_ignores_the_cursor(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "replay-from-start") as srv:
        sent, replayed = _from_start_case(srv)
        assert replayed == sent  # from the priming event on, the cursor's own event included
    sent, replayed = _from_start_case(pristine)
    assert replayed == sent[3:]


def _misordered_case(srv: LiveProcess) -> list[dict[str, Any]]:
    m = _session(srv)
    events = _ticker(m, rid=1)
    _, replayed = _resume(m, events[0].id or "")
    return messages(replayed)


def test_replay_misordered_sends_the_response_before_its_progress(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "replay-misordered") as srv:
        msgs = _misordered_case(srv)
        assert "result" in msgs[0] and [x["params"]["progress"] for x in msgs[1:]] == [1, 2, 3]
    msgs = _misordered_case(pristine)
    assert [x["params"]["progress"] for x in msgs[:-1]] == [1, 2, 3] and "result" in msgs[-1]


def _owed_case(srv: LiveProcess) -> tuple[int, list[SseEvent]]:
    """A finished call, resumed from its priming event: it owes 3 progress + the response."""
    m = _session(srv)
    events = _ticker(m, rid=1)
    return _resume(m, events[0].id or "", limit=2.0)


def test_resume_forget_answers_200_and_replays_nothing(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "resume-forget") as srv:
        status, replayed = _owed_case(srv)
        assert status == 200 and messages(replayed) == []  # a finished stream: closed at once
    status, replayed = _owed_case(pristine)
    assert status == 200 and len(messages(replayed)) == 4


def test_resume_empty_answers_a_fresh_priming_event_and_closes(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "resume-empty") as srv:
        m = _session(srv)
        events = _ticker(m, rid=1)
        status, replayed = _resume(m, events[0].id or "", limit=2.0)
        assert status == 200 and messages(replayed) == []
        (fresh,) = replayed
        assert fresh.id and fresh.data == "" and fresh.id not in _ids(events)  # a new priming event
        # The fresh ID is the server's own: a resumption from it is accepted, and empty again.
        again, more = _resume(m, fresh.id, limit=2.0)
        assert again == 200 and messages(more) == []


def test_unknown_cursor_silent_answers_200_and_never_sends_an_event(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "unknown-cursor-silent") as srv:
        m = _session(srv)
        with m.stream("GET", headers={"last-event-id": "no-such-id"}) as (r, _):
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            raw = b""
            deadline = time.monotonic() + 1.0
            for chunk in r.iter_raw():
                raw += chunk
                if time.monotonic() > deadline:
                    break
        assert raw and set(raw.split(b"\n\n")) <= {b":", b""}  # keep-alive comments only
    status, _ = _resume(_session(pristine), "no-such-id")
    assert status == 400


# -- session and write defects -------------------------------------------------------------


def _two_writes(srv: LiveProcess) -> list[dict[str, Any]]:
    m = _session(srv)
    out = []
    for _ in range(2):
        _, events = m.call("ledger.append", {"entry": "once"}, key="same-key")
        out.append(messages(events)[-1]["result"]["structuredContent"])
    return out


def test_no_idempotency_performs_a_repeated_key_twice(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "no-idempotency") as srv:
        first, second = _two_writes(srv)
        assert first["receipt"] != second["receipt"]
        time.sleep(0.3)
        db = sqlite3.connect(tmp_path / "ledger.sqlite")
        performed = db.execute("SELECT COUNT(*) FROM dispatches WHERE effect='performed'").fetchone()[0]
        db.close()
        assert performed == 2
    first, second = _two_writes(pristine)
    assert first == second  # the original receipt, the whole answer identical


def _write_methods(srv: LiveProcess) -> tuple[list[str], dict[str, Any]]:
    """The methods a write's stream carried, and what the server declared at initialize."""
    m = _session(srv)
    declared = m.initialize().json()["result"]["capabilities"]
    _, events = m.call("ledger.append", {"entry": "x"}, key="k-caps")
    return [str(x.get("method")) for x in messages(events) if "method" in x], declared


def test_undeclared_capability_sends_resources_updated_without_declaring_resources(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "undeclared-capability") as srv:
        methods, declared = _write_methods(srv)
        assert "notifications/resources/updated" in methods and "resources" not in declared
    methods, declared = _write_methods(pristine)
    assert "notifications/resources/updated" not in methods


def _two_calls_ids(srv: LiveProcess) -> tuple[list[str], list[str], Any]:
    """Two calls of one session, then a resumption of the second from its first event:
    (IDs of call 1, IDs of call 2, the id of the response the resumption replayed)."""
    m = _session(srv)
    one, two = _ticker(m, rid=1), _ticker(m, rid=2)
    status, replayed = _resume(m, two[0].id or "", limit=2.0)
    assert status == 200
    return _ids(one), _ids(two), messages(replayed)[-1].get("id")


def test_per_stream_ids_reuses_ids_and_resumes_the_wrong_stream(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "per-stream-ids") as srv:
        one, two, answered = _two_calls_ids(srv)
        assert one == two  # both streams count 0, 1, 2, ...
        assert answered == 1  # the cursor resolved to the first stream with that ID: call 1's answer
    one, two, answered = _two_calls_ids(pristine)
    assert not set(one) & set(two) and answered == 2


def test_any_origin_serves_an_illegal_origin(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "any-origin") as srv:
        assert Mcp(srv.url, origin="http://evil.example").initialize().status_code == 200
    assert Mcp(pristine.url, origin="http://evil.example").initialize().status_code == 403


def _unknown_session_status(srv: LiveProcess) -> int:
    m = _session(srv)
    m.sid = "no-such-session"
    return m.call("echo")[0].status_code


def test_unknown_session_400_instead_of_404(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "unknown-session-400") as srv:
        assert _unknown_session_status(srv) == 400
    assert _unknown_session_status(pristine) == 404


def _status_after_delete(srv: LiveProcess) -> int:
    m = _session(srv)
    assert m.client.delete(m.url, headers=m.headers()).status_code == 200
    return m.call("echo")[0].status_code


def test_deleted_session_alive_keeps_working_after_delete(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "deleted-session-alive") as srv:
        assert _status_after_delete(srv) == 200
    assert _status_after_delete(pristine) == 404


# -- stream-shape defects ------------------------------------------------------------------


def _standalone_after_echo(srv: LiveProcess) -> dict[str, Any]:
    """The first message on the standalone GET after an echo call and then a write (whose
    announcement is a notification: so the pristine server sends something too)."""
    m = _session(srv)
    with m.stream("GET") as (r, events):
        assert r.status_code == 200 and next(events).is_priming
        m.call("echo", {"text": "x"})
        m.call("ledger.append", {"entry": "e"}, key=f"k-{time.monotonic_ns()}")
        return dict(json.loads(next(e for e in events if e.data).data))


def test_response_on_get_sends_a_response_on_the_standalone_stream(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "response-on-get") as srv:
        first = _standalone_after_echo(srv)
        assert "result" in first and "id" in first
    first = _standalone_after_echo(pristine)
    assert first["method"] == "notifications/message" and "id" not in first


def test_no_priming_starts_streams_without_the_priming_event(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "no-priming") as srv:
        events = _session(srv).call("echo")[1]
        assert not events[0].is_priming and events[0].data
    assert _session(pristine).call("echo")[1][0].is_priming


def _polling_close(srv: LiveProcess) -> list[SseEvent]:
    return _session(srv).call("ticker", {"count": 5, "interval_ms": 0, "close_after": 2, "retry_ms": 300})[1]


def test_no_retry_field_closes_without_advising_retry(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "no-retry-field") as srv:
        events = _polling_close(srv)
        assert events and all(e.retry is None for e in events) and "id" not in messages(events)[-1]
    assert _polling_close(pristine)[-1].retry == 300


# -- the list itself -----------------------------------------------------------------------


def _without_session_status(srv: LiveProcess) -> int:
    m = _session(srv)
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x"}},
    }
    headers = m.headers({"accept": "application/json, text/event-stream"}, session=False)
    with httpx.stream("POST", srv.url, json=body, headers=headers, timeout=5) as r:
        return r.status_code


def test_serve_without_session_serves_a_request_that_names_no_session(
    tmp_path: Path, pristine: LiveProcess
) -> None:
    with defective(tmp_path, "serve-without-session") as srv:
        assert _without_session_status(srv) == 200
    assert _without_session_status(pristine) == 400


def test_every_defect_is_listed_in_help_and_in_docs_targets() -> None:
    shown = subprocess.run(
        [LAB, "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30
    ).stdout
    doc = (ROOT / "docs" / "targets.md").read_text(encoding="utf-8")
    for name in DEFECT_NAMES:
        assert f"  {name}: " in shown, name
        assert f"`{name}`" in doc, name
    assert len(DEFECT_NAMES) >= 12


def _answered_past_capacity(srv: LiveProcess, sessions: int) -> tuple[int, bool]:
    """Open `sessions` sessions; (how many of the first's and the last's calls were answered
    within 1 s, and whether one more session could still be made)."""
    made = [_session(srv) for _ in range(sessions)]
    answered = 0
    for m in (made[0], made[-1]):
        body = jsonrpc.request(m.take_id(), "tools/call", {"name": "echo", "arguments": {"text": "x"}})
        try:
            r = m.client.post(m.url, content=json.dumps(body), headers=m.headers(POST_HEADERS), timeout=1.0)
            answered += r.status_code == 200
        except httpx.ReadTimeout:
            pass
    return answered, Mcp(srv.url).initialize().status_code == 200


def test_stalls_at_capacity_never_answers_past_its_sessions(tmp_path: Path, pristine: LiveProcess) -> None:
    with defective(tmp_path, "stalls-at-capacity") as srv:
        answered, still_opens = _answered_past_capacity(srv, STALL_SESSIONS + 1)
        assert answered == 0 and still_opens  # past its capacity: sessions made, calls never answered
    answered, _ = _answered_past_capacity(pristine, STALL_SESSIONS + 1)
    assert answered == 2
