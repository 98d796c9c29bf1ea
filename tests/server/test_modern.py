"""The reference server's modern era (2026-07-28) beside its handshake era, on one
endpoint, each rule against a live uvicorn on 127.0.0.1 (lab.server.modern)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab.wire.sse import SseDecoder, SseEvent
from tests.livesrv import LiveProcess, reference_server
from tests.server.mcp_http import Mcp

pytestmark = pytest.mark.live
MODERN = "2026-07-28"
TOKEN = "tok-m"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    with reference_server(tmp_path_factory.mktemp("modern"), "--tokens", f"{TOKEN}=mona") as p:
        yield p


def body(
    mid: int, method: str, params: dict[str, Any] | None = None, *, version: str = MODERN
) -> dict[str, Any]:
    p = dict(params or {})
    p["_meta"] = {
        **p.get("_meta", {}),
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
    }
    return {"jsonrpc": "2.0", "id": mid, "method": method, "params": p}


def headers(msg: dict[str, Any], **override: str | None) -> dict[str, str]:
    h: dict[str, str | None] = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {TOKEN}",
        "mcp-protocol-version": msg["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        "mcp-method": msg["method"],
    }
    if msg["method"] == "tools/call":
        h["mcp-name"] = msg["params"]["name"]
    h.update(override)
    return {k: v for k, v in h.items() if v is not None}


def post(srv: LiveProcess, msg: dict[str, Any], **override: str | None) -> httpx.Response:
    return httpx.post(srv.url, content=json.dumps(msg), headers=headers(msg, **override), timeout=10)


def events(r: httpx.Response) -> list[SseEvent]:
    dec = SseDecoder()
    return list(dec.feed(r.content))  # every event dispatched: a priming one would show


def test_discover_and_tools_list_answer_in_json_without_a_session(srv: LiveProcess) -> None:
    r = post(srv, body(1, "server/discover"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert "mcp-session-id" not in r.headers
    result = r.json()["result"]
    assert result["resultType"] == "complete" and MODERN in result["supportedVersions"]
    assert "2025-11-25" in result["supportedVersions"]  # both eras are served here
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-lab-reference"
    r = post(srv, body(2, "tools/list"))
    assert r.status_code == 200 and r.json()["result"]["resultType"] == "complete"
    assert {t["name"] for t in r.json()["result"]["tools"]} >= {"echo", "ticker", "ledger.append"}


def test_a_tool_call_streams_without_ids_retry_or_priming_and_ends_with_its_answer(srv: LiveProcess) -> None:
    msg = body(
        3,
        "tools/call",
        {"name": "ticker", "arguments": {"count": 5, "interval_ms": 0}, "_meta": {"progressToken": "p"}},
    )
    r = post(srv, msg, **{"mcp-session-id": "ignored", "last-event-id": "ignored"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "mcp-session-id" not in r.headers
    got = events(r)
    assert all(e.id is None and e.retry is None and e.data for e in got), got
    messages = [json.loads(e.data) for e in got]
    assert [m["params"]["progress"] for m in messages[:-1]] == [1, 2, 3, 4, 5]
    assert messages[-1]["id"] == 3 and messages[-1]["result"]["resultType"] == "complete"


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"mcp-protocol-version": "2025-11-25"}, -32600),  # a handshake revision: that era's rules
        ({"mcp-method": None}, -32020),
        ({"mcp-method": "tools/list"}, -32020),
        ({"mcp-name": "ticker"}, -32020),
        ({"mcp-name": None}, -32020),
    ],
)
def test_headers_that_do_not_say_what_the_body_says_are_400_header_mismatch(
    srv: LiveProcess, override: dict[str, str | None], code: int
) -> None:
    msg = body(4, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
    r = post(srv, msg, **override)
    assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    assert r.json()["id"] == (4 if code == -32020 else None)  # the modern era answers the request


def test_meta_missing_an_unsupported_revision_and_methods_of_the_other_era(srv: LiveProcess) -> None:
    msg = body(5, "tools/list")
    del msg["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    r = post(srv, msg)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602
    r = post(srv, body(5, "tools/list", version="2025-11-25"), **{"mcp-protocol-version": MODERN})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020  # _meta says another
    # An unknown revision: 400 and what is served, whatever the method (either era's rule).
    r = post(srv, body(6, "tools/list", version="2099-01-01"))
    assert r.status_code == 400 and r.json()["error"]["code"] == -32022
    assert r.json()["error"]["data"]["requested"] == "2099-01-01"
    assert MODERN in r.json()["error"]["data"]["supported"]
    r = httpx.get(srv.url, headers={"mcp-protocol-version": "2099-01-01", "authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32022
    r = post(srv, body(7, "tools/call", {"name": "nope", "arguments": {}}))
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602 and r.json()["id"] == 7
    for method in ("initialize", "ping", "logging/setLevel"):
        r = post(srv, body(7, method))
        assert r.status_code == 404 and r.json()["error"]["code"] == -32601, method
    for method in ("GET", "DELETE"):
        r = httpx.request(
            method, srv.url, headers={"mcp-protocol-version": MODERN, "authorization": f"Bearer {TOKEN}"}
        )
        assert r.status_code == 405 and r.headers["allow"] == "POST", method
    r = httpx.post(
        srv.url, content=json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}),
        headers={**headers(body(0, "x")), "mcp-method": "notifications/cancelled"},
    )  # fmt: skip
    assert r.status_code == 202


def test_closing_the_stream_cancels_the_call_and_the_server_goes_on(srv: LiveProcess) -> None:
    msg = body(
        8,
        "tools/call",
        {"name": "ticker", "arguments": {"count": 100000, "interval_ms": 5}, "_meta": {"progressToken": 8}},
    )
    with httpx.stream("POST", srv.url, content=json.dumps(msg), headers=headers(msg), timeout=10) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            if b"progress" in chunk:
                break  # leave with the stream open: the close is the cancellation
    time.sleep(0.3)
    r = post(srv, body(9, "tools/call", {"name": "echo", "arguments": {"text": "still here"}}))
    assert json.loads(events(r)[-1].data)["result"]["content"][0]["text"] == "still here"
    assert "Traceback" not in Path(srv.log).read_text()


def test_one_idempotency_key_holds_across_both_eras(srv: LiveProcess) -> None:
    def append(msg: dict[str, Any]) -> str:
        r = post(srv, msg)
        return str(json.loads(events(r)[-1].data)["result"]["structuredContent"]["receipt"])

    k = f"k-{time.monotonic_ns()}"
    key = {"mcp-lab/idempotency-key": k}
    modern = append(
        body(10, "tools/call", {"name": "ledger.append", "arguments": {"entry": "e"}, "_meta": key})
    )
    again = append(
        body(11, "tools/call", {"name": "ledger.append", "arguments": {"entry": "e"}, "_meta": key})
    )
    m = Mcp(srv.url, token=TOKEN)
    assert m.initialize().status_code == 200  # the handshake era on the same endpoint
    _, evs = m.call("ledger.append", {"entry": "e"}, key=k)
    handshake = json.loads([e for e in evs if e.data][-1].data)["result"]["structuredContent"]["receipt"]
    assert modern == again == handshake
    m.client.close()


def test_a_modern_only_server_refuses_the_handshake_era_naming_what_it_serves(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--protocol-versions", MODERN, ledger=False) as srv:
        m = Mcp(srv.url)
        r = m.initialize()
        assert r.status_code == 400 and r.json()["error"]["code"] == -32022
        assert r.json()["error"]["data"]["supported"] == [MODERN]
        assert httpx.get(srv.url, headers={"accept": "text/event-stream"}).status_code == 405
        r = httpx.post(
            srv.url,
            content=json.dumps(body(1, "tools/list")),
            headers={k: v for k, v in headers(body(1, "tools/list")).items() if k != "authorization"},
        )
        assert r.status_code == 200 and r.json()["result"]["tools"]


def test_a_handshake_only_server_refuses_a_modern_request(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--protocol-versions", "2025-11-25", ledger=False) as srv:
        msg = body(1, "server/discover")
        r = httpx.post(
            srv.url,
            content=json.dumps(msg),
            headers={k: v for k, v in headers(msg).items() if k != "authorization"},
        )
        # 400 naming what it serves: a client of both eras falls back to initialize.
        assert r.status_code == 400 and r.json()["error"]["code"] == -32022
        assert r.json()["error"]["data"]["supported"] == ["2025-11-25"]
        assert Mcp(srv.url).initialize().status_code == 200


def test_the_modern_era_defects_show_on_the_wire(tmp_path: Path) -> None:
    """`modern-headers-unchecked` serves a request whose Mcp-Method / Mcp-Name the body
    contradicts; `modern-mints-session` answers with an Mcp-Session-Id. The pristine
    server refuses the first with 400 (-32020) and mints nothing."""
    call = body(5, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
    listing = body(6, "tools/list")
    with reference_server(
        tmp_path,
        "--tokens",
        f"{TOKEN}=mona",
        "--defect",
        "modern-headers-unchecked",
        "--defect",
        "modern-mints-session",
    ) as bad:
        served = post(bad, call, **{"mcp-name": "clock"})
        listed = post(bad, listing, **{"mcp-method": "tools/call"})
    assert served.status_code == 200 and listed.status_code == 200
    assert served.headers.get("mcp-session-id") and listed.headers.get("mcp-session-id")
    # The pristine server refuses both, and mints nothing.
    (tmp_path / "pristine").mkdir()
    with reference_server(tmp_path / "pristine", "--tokens", f"{TOKEN}=mona") as good:
        refused = post(good, call, **{"mcp-name": "clock"})
        ok = post(good, listing)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32020
    assert ok.status_code == 200 and "mcp-session-id" not in ok.headers


def _cancel_then_listen(server: LiveProcess) -> list[dict[str, Any]]:
    """A long ticker call left after its first progress (the close is its cancellation),
    then a second call of the same subject read for a second: the messages it carried."""
    first = body(21, "tools/call", {"name": "ticker", "arguments": {"count": 200, "interval_ms": 10},
                                     "_meta": {"progressToken": 21}})  # fmt: skip
    with httpx.stream("POST", server.url, content=json.dumps(first), headers=headers(first), timeout=10) as r:
        for chunk in r.iter_raw():
            if b"progress" in chunk:
                break
    second = body(22, "tools/call", {"name": "ticker", "arguments": {"count": 100, "interval_ms": 10},
                                      "_meta": {"progressToken": 22}})  # fmt: skip
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 1.0
    with httpx.stream(
        "POST", server.url, content=json.dumps(second), headers=headers(second), timeout=10
    ) as r:
        dec = SseDecoder()
        for chunk in r.iter_raw():
            got += [json.loads(e.data) for e in dec.feed(chunk) if e.data]
            if time.monotonic() > deadline:
                break
    return got


def test_a_cancelled_calls_messages_on_another_response_show_on_the_wire(tmp_path: Path) -> None:
    """`modern-sends-after-close`: the call whose stream closed runs on, and its progress
    reaches the subject's next open response (gate 1 sees it sent where it does not
    belong). The pristine server sends nothing more for a cancelled call."""
    with reference_server(
        tmp_path, "--tokens", f"{TOKEN}=mona", "--defect", "modern-sends-after-close"
    ) as bad:
        leaked = _cancel_then_listen(bad)
    tokens = {
        m.get("params", {}).get("progressToken")
        for m in leaked
        if m.get("method") == "notifications/progress"
    }
    assert tokens == {21, 22}, tokens
    (tmp_path / "pristine").mkdir()
    with reference_server(tmp_path / "pristine", "--tokens", f"{TOKEN}=mona") as good:
        clean = _cancel_then_listen(good)
    tokens = {
        m.get("params", {}).get("progressToken") for m in clean if m.get("method") == "notifications/progress"
    }
    assert tokens == {22}, tokens
