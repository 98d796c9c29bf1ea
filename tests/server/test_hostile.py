"""Hostile and malformed requests: every one answered with a 4xx/2xx, never a 5xx, never a crash."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.livesrv import LiveProcess, reference_server
from tests.server.mcp_http import Mcp

pytestmark = pytest.mark.live

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_jsonrpc_ish = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2, None]),
        "id": st.one_of(
            st.integers(), st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2)
        ),
        "method": st.sampled_from(
            ["initialize", "tools/call", "tools/list", "ping", "notifications/cancelled", "x", 7]
        ),
        "params": st.one_of(
            _json,
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.sampled_from(["echo", "ticker", "ledger.append", "nope", 1]),
                    "arguments": _json,
                    "_meta": _json,
                    "protocolVersion": st.sampled_from(["2025-11-25", "bogus", 3]),
                    "requestId": _json,
                },
            ),
        ),
        "result": _json,
        "error": _json,
    },
)
_body = st.one_of(
    st.binary(max_size=200),
    _json.map(lambda v: json.dumps(v).encode()),
    _jsonrpc_ish.map(lambda v: json.dumps(v).encode()),
    st.lists(_jsonrpc_ish, max_size=3).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 50_000).map(lambda n: b"[" * n + b"]" * n),
)
_ascii = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveProcess, str]]:
    with reference_server(
        tmp_path_factory.mktemp("hostile"), "--tokens", "good=alice", "--max-streams", "500"
    ) as p:
        m = Mcp(p.url, token="good")
        m.initialize()
        assert m.sid is not None
        yield p, m.sid


def _mostly(valid: Any, *others: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The valid value most of the time, so that requests get deep into the server."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), *others)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=_mostly("POST", st.sampled_from(["GET", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"])),
    content_type=_mostly(
        "application/json", st.sampled_from([None, "application/json; charset=utf-8", "text/plain", "x"])
    ),
    accept=_mostly(
        "application/json, text/event-stream", st.sampled_from([None, "text/event-stream", "*/*", ""])
    ),
    session=_mostly("valid", st.sampled_from(["garbage", "none", "long"])),
    version=_mostly(None, st.sampled_from(["2025-11-25", "2025-03-26", "1.0", ""]), _ascii),
    origin=_mostly(None, st.sampled_from(["http://127.0.0.1:1", "http://evil", "null", ""]), _ascii),
    token=_mostly("Bearer good", st.sampled_from([None, "Bearer bad", "Basic Zm9v", "Bearer"])),
    last_event_id=_mostly(None, _ascii),
    body=_body,
)
def test_no_5xx_for_any_request(
    srv: tuple[LiveProcess, str],
    method: str,
    content_type: str | None,
    accept: str | None,
    session: str,
    version: str | None,
    origin: str | None,
    token: str | None,
    last_event_id: str | None,
    body: bytes,
) -> None:
    proc, sid = srv
    headers: dict[str, Any] = {}
    for name, value in (
        ("content-type", content_type),
        ("accept", accept),
        ("mcp-protocol-version", version),
        ("origin", origin),
        ("authorization", token),
        ("last-event-id", last_event_id),
    ):
        if value is not None:
            headers[name] = value
    if session != "none":
        headers["mcp-session-id"] = {"valid": sid, "garbage": "zzz", "long": "s" * 5000}[session]
    with (
        httpx.Client(timeout=10.0) as client,
        client.stream(
            method, proc.url, headers=headers, content=body if method in ("POST", "PUT", "PATCH") else None
        ) as r,
    ):
        status = r.status_code  # a 200 SSE stream is closed right away by leaving the block
    assert status < 500, f"{method} {headers} {body[:80]!r} -> {status}"
    assert status in {200, 202, 400, 401, 403, 404, 405, 406, 409, 410, 413, 415, 421, 422, 429, 503}
    assert proc.proc.poll() is None, "the server died"
