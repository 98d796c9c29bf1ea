"""The reference server's legal but unusual modes (`lab serve --json-answers`,
`--protocol-versions`), which `lab selftest` runs as legal shapes: each shows on the wire."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.wire.sse import SseEvent
from tests.livesrv import LiveProcess, reference_server
from tests.server.mcp_http import Mcp, messages

pytestmark = pytest.mark.live


def test_json_answers_answer_calls_as_json_and_stream_only_the_ticker(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--event-ids", "seq", "--json-answers") as srv:
        m = Mcp(srv.url)
        assert m.initialize().status_code == 200
        r, _ = m.call("echo", {"text": "hi"}, rid=1)
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["id"] == 1 and "result" in r.json()
        r, events = m.call("ticker", {"count": 2, "interval_ms": 0}, rid=2)
        assert r.headers["content-type"].startswith("text/event-stream")
        assert [x.get("id") for x in messages(events)][-1] == 2


def _negotiated(srv: LiveProcess, asked: str) -> tuple[str, list[SseEvent]]:
    m = Mcp(srv.url)
    r = m.initialize(asked)
    version = r.json()["result"]["protocolVersion"]
    _, events = m.call("ticker", {"count": 2, "interval_ms": 0}, rid=1)
    return version, events


def test_only_2025_03_26_negotiates_it_and_sends_no_priming_event(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--event-ids", "seq", "--protocol-versions", "2025-03-26") as srv:
        version, events = _negotiated(srv, "2025-11-25")
        assert version == "2025-03-26"
        assert events[0].data != "" and events[0].retry is None  # a message first: no priming event
        assert all(e.retry is None for e in events)
