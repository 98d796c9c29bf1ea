"""The reference server's rollout knobs, changed live through its admin control
(`POST /lab-admin/knobs`, lab/server/admin.py): what `lab run` does at a phase's start."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lab.server.admin import parse_knobs
from lab.wire import jsonrpc
from tests.livesrv import reference_server
from tests.server.mcp_http import Mcp

ADMIN = "admin-token-phases"


def knobs(url: str, body: object, token: str = ADMIN) -> httpx.Response:
    return httpx.post(
        url.replace("/mcp", "/lab-admin/knobs"), json=body, headers={"x-lab-admin-token": token}, timeout=5
    )


def old_cursor(m: Mcp) -> str:
    """A cursor of a ticker stream opened now (the client then goes away mid-stream)."""
    body = jsonrpc.request(
        m.take_id(),
        "tools/call",
        {"name": "ticker", "arguments": {"count": 200, "interval_ms": 20}, "_meta": {"progressToken": 1}},
    )
    with m.stream("POST", body) as (_, events):
        seen = [next(events) for _ in range(3)]
    return seen[-1].id or ""


def test_parse_knobs_names_the_bad_key() -> None:
    assert parse_knobs(b'{"resumable_fraction": 0.1, "max_rps": 5}') == {
        "resumable_fraction": 0.1,
        "max_rps": 5.0,
    }
    for bad, key in [
        (b'{"resumable_fraction": 1.5}', "resumable_fraction"),
        (b'{"rollback": true}', "rollback"),
        (b'{"max_rps": -1}', "max_rps"),
        (b'{"colour": 1}', "colour"),
        (b"[]", "JSON object"),
        (b"{", "not JSON"),
    ]:
        with pytest.raises(ValueError, match=key):
            parse_knobs(bad)


@pytest.mark.live
def test_fraction_changes_live_for_new_sessions_only(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--admin-token", ADMIN, "--resumable-fraction", "1") as srv:
        early = Mcp(srv.url)
        early.initialize()
        assert knobs(srv.url, {"resumable_fraction": 0.0}).json()["resumable_fraction"] == 0.0
        late = Mcp(srv.url)
        late.initialize()
        _, before = early.call("echo", {"text": "x"})
        _, after = late.call("echo", {"text": "x"})
        assert before[0].id is not None  # a session keeps what it was created with
        assert all(e.id is None for e in after)  # the new one writes the shadow ledger only
        # A bad knob changes nothing and says why; a wrong token is refused.
        r = knobs(srv.url, {"resumable_fraction": 2})
        assert r.status_code == 400 and "resumable_fraction" in r.text
        assert knobs(srv.url, {"max_rps": 1}, token="nope").status_code == 403
        assert knobs(srv.url, {"max_rps": 0}).json()["resumable_fraction"] == 0.0


@pytest.mark.live
def test_max_rps_knob_sheds_load_and_can_be_lifted(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv:
        m = Mcp(srv.url)
        m.initialize()
        assert knobs(srv.url, {"max_rps": 1}).json()["max_rps"] == 1.0
        codes = [m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code for _ in range(6)]
        assert 429 in codes
        knobs(srv.url, {"max_rps": 0})
        codes = [m.post_raw(jsonrpc.request(m.take_id(), "ping")).status_code for _ in range(6)]
        assert 429 not in codes


@pytest.mark.live
@pytest.mark.parametrize(("mode", "status"), [("keep-index", 200), ("drop-index", 400)])
def test_rollback_keeps_or_drops_the_old_cursor_index(tmp_path: Path, mode: str, status: int) -> None:
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv:
        m = Mcp(srv.url)
        m.initialize()
        cursor = old_cursor(m)
        answer = knobs(srv.url, {"rollback": mode}).json()
        assert answer["rollback"] is True and answer["generation"] == 1
        with m.stream("GET", headers={"last-event-id": cursor}) as (r, _):
            assert r.status_code == status  # drop-index: refused although the session lives on
        _, new = m.call("echo", {"text": "after"})
        assert all(e.id is None for e in new)  # either way, new streams are not resumable
