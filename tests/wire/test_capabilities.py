"""lab.wire.capabilities: which server-sent methods need a declared capability (pure)."""

from __future__ import annotations

import json

from lab.wire.capabilities import declared_paths, gated_method, initialize_capabilities, needs


def note(method: str, **params: object) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params})


def test_gated_methods_are_found_and_the_rest_are_not() -> None:
    assert (
        gated_method(note("notifications/resources/updated", uri="x://1"))
        == "notifications/resources/updated"
    )
    assert gated_method(note("notifications/message", level="info", data="hi")) == "notifications/message"
    assert gated_method(note("sampling/createMessage")) == "sampling/createMessage"
    assert gated_method(note("notifications/progress", progress=1, progressToken=1)) is None
    assert gated_method(note("ping")) is None
    # The name in a value, not as the method: not a gated message.
    assert gated_method(note("notifications/progress", message="notifications/message")) is None
    assert gated_method('{"jsonrpc": "2.0", "id": 1, "result": {"text": "\\"roots/list\\""}}') is None
    assert gated_method("") is None and gated_method('"notifications/message" not json') is None


def test_declared_paths_keep_keys_and_true_flags() -> None:
    caps = {
        "tools": {"listChanged": False},
        "logging": {},
        "resources": {"subscribe": True, "listChanged": 0},
    }
    assert declared_paths(caps) == ["logging", "resources", "resources.subscribe", "tools"]
    assert declared_paths(None) == [] and declared_paths(["tools"]) == []


def test_initialize_request_and_result() -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"capabilities": {"sampling": {}}},
    }
    result = {"jsonrpc": "2.0", "id": 0, "result": {"capabilities": {"tools": {"listChanged": True}}}}
    assert initialize_capabilities(request) == ["sampling"]
    assert initialize_capabilities(result) == ["tools", "tools.listChanged"]
    assert initialize_capabilities({"jsonrpc": "2.0", "id": 0, "result": {}}) is None
    assert initialize_capabilities("nope") is None


def test_what_each_gated_method_needs() -> None:
    assert needs("notifications/tools/list_changed") == ("server", "tools.listChanged")
    assert needs("roots/list") == ("client", "roots")
    assert needs("notifications/progress") is None


def test_server_discover_request_and_result() -> None:
    """The modern era declares at server/discover: the client's capabilities in the
    request's `_meta`, the server's in the result (2026-07-28)."""
    asked = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "server/discover",
        "params": {"_meta": {"io.modelcontextprotocol/clientCapabilities": {"sampling": {}, "roots": {}}}},
    }
    answered = {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}},
    }
    assert initialize_capabilities(asked) == ["roots", "sampling"]
    assert initialize_capabilities(answered) == ["tools"]
    # A request that declares nothing is not a declaration.
    assert initialize_capabilities({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}) is None
