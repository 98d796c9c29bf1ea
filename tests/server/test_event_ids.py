"""`lab serve --event-ids seq|uuid`: opaque event IDs, as other servers send, and resumption
still exact: the server maps an opaque cursor back to its stream (issue 10 §6)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.wire.sse import SseEvent
from tests.livesrv import reference_server
from tests.server.mcp_http import Mcp, messages

pytestmark = pytest.mark.live


def _follow(m: Mcp, events: list[SseEvent]) -> list[SseEvent]:
    """Resume the stream from its last event ID until it ends with the response (the server
    closes the connection every few events, ticker `close_after`)."""
    out = list(events)
    for _ in range(50):
        if messages(out) and "id" in messages(out)[-1]:
            return out
        cursor = next(e.id for e in reversed(out) if e.id)
        with m.stream("GET", headers={"last-event-id": cursor}) as (r, stream):
            assert r.status_code == 200
            out += list(stream)
    raise AssertionError("the stream never completed")


@pytest.mark.parametrize(
    ("scheme", "looks_right"),
    [("seq", lambda i: i.isdigit()), ("uuid", lambda i: str(uuid.UUID(i)) == i)],
)
def test_opaque_ids_resume_exactly_on_their_stream(
    tmp_path: Path, scheme: str, looks_right: Callable[[str], bool]
) -> None:
    with reference_server(tmp_path, "--event-ids", scheme) as srv:
        a, b = Mcp(srv.url), Mcp(srv.url)
        caps = a.initialize().json()["result"]["capabilities"]
        b.initialize()
        assert "experimental" not in caps  # no `e1` promise: the client must treat IDs as opaque
        r, first = a.call("ticker", {"count": 6, "interval_ms": 0, "close_after": 2, "retry_ms": 0})
        assert r.status_code == 200 and first[0].is_priming and first[-1].retry == 0
        events = _follow(a, first)
        ids = [e.id for e in events if e.id]
        assert all(looks_right(i) for i in ids) and len(set(ids)) == len(ids)
        msgs = messages(events)
        assert [x["params"]["progress"] for x in msgs[:-1]] == [1, 2, 3, 4, 5, 6]  # no gap, no repeat
        assert msgs[-1]["result"]["structuredContent"] == {"count": 6}
        # A cursor of session A is nothing in session B; garbage is nothing anywhere.
        for who, cursor in ((b, ids[1]), (a, "no-such-id")):
            with who.stream("GET", headers={"last-event-id": cursor}) as (g, _):
                g.read()
                assert g.status_code == 400 and "unknown_cursor" in g.text
        if scheme == "seq":  # server-wide sequential: B's events follow A's
            _, b_events = b.call("echo", {"text": "x"})
            assert int(b_events[0].id or 0) > max(int(i) for i in ids)
        time.sleep(0.3)
        db = sqlite3.connect(tmp_path / "ledger.sqlite")
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        verdicts = [
            r[0] for r in db.execute("SELECT cursor_verdict FROM requests WHERE cursor_verdict IS NOT NULL")
        ]
        db.close()
        assert meta["event_ids"] == scheme
        assert verdicts.count("unknown_cursor") == 2 and "valid" in verdicts
