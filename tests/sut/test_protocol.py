"""The adapter protocol's vocabulary (no I/O): commands, records, digests, scrubbing."""

from __future__ import annotations

import json

import pytest

from lab.sut.protocol import (
    RECORD_FIELDS,
    SCHEMA,
    Call,
    Cancel,
    CommandError,
    Leave,
    Scrubber,
    Start,
    Stop,
    command_line,
    describe,
    message_digest,
    parse_command,
    parse_record,
    secrets_of_headers,
)
from lab.wire import event_ids, jsonrpc

COMMANDS = [
    Start("c1", "http://127.0.0.1:9/mcp", "2025-06-18", {"Origin": "http://127.0.0.1:9"}, {"x": 1}),
    Start("c2", "https://example.test/mcp", None),
    Call("c1", "c1:1", "ticker", {"count": 3, "text": "é"}, "key-1"),
    Cancel("c1:1"),
    Leave("c1"),
    Stop(),
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_survives_its_own_line(cmd: object) -> None:
    line = command_line(cmd)  # type: ignore[arg-type]
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert parse_command(line) == cmd


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "not a JSON line"),
        ("[1]", "a command is a JSON object"),
        ('{"cmd": "dance"}', "'cmd' must be one of start, call, cancel, leave, stop"),
        ('{"cmd": "start", "client": "c1"}', "start: 'url' must be a non-empty string"),
        ('{"cmd": "start", "client": "c1", "url": "ftp://x"}', "must be an http(s) URL"),
        (
            '{"cmd": "start", "client": "c1", "url": "http://x", "headers": []}',
            "'headers' must be a JSON object",
        ),
        ('{"cmd": "start", "client": "c1", "url": "http://x", "headers": {"a": 1}}', "must be a string"),
        ('{"cmd": "call", "client": "c1", "call": "k", "tool": "echo"}', "'idempotencyKey' must be"),
        (
            '{"cmd": "call", "client": "c1", "call": "", "tool": "echo", "idempotencyKey": "k"}',
            "'call' must be",
        ),
        ('{"cmd": "cancel"}', "cancel: 'call' must be"),
        ('{"cmd": "leave", "client": 3}', "leave: 'client' must be"),
    ],
)
def test_a_bad_command_is_refused_with_what_is_wrong(line: str, says: str) -> None:
    with pytest.raises(CommandError, match=None) as err:
        parse_command(line)
    assert says in str(err.value)


def test_the_digest_of_a_delivered_message_is_the_digest_of_the_servers_event() -> None:
    # The server writes each event's data with jsonrpc.dumps; an adapter re-encodes the parsed
    # message canonically. Both digests must agree, whatever order the members arrived in.
    msg = jsonrpc.result(7, {"content": [{"type": "text", "text": "héllo \u2028 \x01"}], "isError": False})
    data = jsonrpc.dumps(msg)
    shuffled = json.loads(json.dumps(dict(reversed(list(json.loads(data).items())))))
    assert message_digest(shuffled) == event_ids.message_digest(data)
    other = jsonrpc.result(7, {"content": [{"type": "text", "text": "hello"}], "isError": False})
    assert message_digest(other) != event_ids.message_digest(data)


def test_describe_tells_responses_errors_notifications_and_requests_apart() -> None:
    assert describe(jsonrpc.result(1, {})) == ("response", 1, None)
    assert describe(jsonrpc.error("a", -32600, "x")) == ("error", "a", None)
    assert describe(jsonrpc.notification("notifications/progress", {})) == (
        "notification",
        None,
        "notifications/progress",
    )
    assert describe(jsonrpc.request(2, "ping")) == ("request", 2, "ping")
    assert describe({"jsonrpc": "2.0", "id": True, "result": {}}) == ("response", None, None)


def test_records_are_checked_field_by_field() -> None:
    ok = {"ev": "ready", "t": 1.5, "schema": SCHEMA, "adapter": "x", "implementation": {}, "pid": 1}
    assert parse_record(json.dumps(ok)) == ok
    with pytest.raises(ValueError, match="ready: missing pid"):
        parse_record(json.dumps({k: v for k, v in ok.items() if k != "pid"}))
    with pytest.raises(ValueError, match=r"is not mcpLabAppLog\.v1"):
        parse_record(json.dumps({**ok, "schema": "other.v9"}))
    with pytest.raises(ValueError, match="'ev' must be one of"):
        parse_record(json.dumps({"ev": "party", "t": 1}))
    with pytest.raises(ValueError, match="'t' must be a number"):
        parse_record(json.dumps({"ev": "stopped", "clients": 0}))
    assert set(RECORD_FIELDS) >= {"deliver", "outcome", "reconnect", "started", "left", "stopped"}


def test_the_scrubber_replaces_every_secret_it_was_told_and_nothing_else() -> None:
    scrub = Scrubber()
    scrub.add("raw-session-id-0123456789", "s_abc")
    scrub.add("short", "x")  # too short to be a secret: left alone
    text = "404 for raw-session-id-0123456789 (short); again raw-session-id-0123456789"
    assert scrub(text) == "404 for s_abc (short); again s_abc"
    assert secrets_of_headers({"Authorization": "Bearer tok-123456789", "Origin": "http://x"}) == [
        "Bearer tok-123456789",
        "tok-123456789",
    ]
