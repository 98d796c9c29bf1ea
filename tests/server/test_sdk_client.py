"""A strict client accepts everything our server sends (issue 10 §5): the official MCP
Python SDK (`mcp`), in its session-era handshake (`mode="legacy"`: 2025-11-25, since 2.x
defaults to 2026-07-28, which has no sessions), validates every message against the
schema; on top of it, every notification must be one the server's declared
capabilities allow it to send unasked."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.types import (
    LoggingMessageNotification,
    ProgressNotification,
    RequestParamsMeta,
    ServerCapabilities,
)

from tests.livesrv import LiveProcess, reference_server

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    with reference_server(tmp_path_factory.mktemp("sdk"), "--heartbeat-ms", "100") as p:
        yield p


def undeclared(note: Any, caps: ServerCapabilities) -> str | None:
    """Why a server may not send `note` unasked, given its capabilities (None: it may). The
    2025-11-25 rules: log messages need `logging`; resource updates need `resources.subscribe`
    and a subscription (this client makes none); list changes need their `listChanged`.
    Progress is routed by the SDK itself to the request that asked for it."""
    method = note.method
    if isinstance(note, LoggingMessageNotification):
        return None if caps.logging is not None else "notifications/message without the logging capability"
    if isinstance(note, ProgressNotification):
        return None
    if method == "notifications/tools/list_changed":
        return None if caps.tools is not None and caps.tools.list_changed else f"{method} not declared"
    return f"{method}: not allowed unasked (no capability or subscription of this client covers it)"


def _announced(received: list[Any]) -> bool:
    return any(
        isinstance(m, LoggingMessageNotification) and m.params.logger == "mcp-lab/ledger" for m in received
    )


def test_the_official_sdk_client_accepts_every_message_and_every_notification_is_declared(
    srv: LiveProcess, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[Any] = []

    async def on_message(message: Any) -> None:
        received.append(message)

    async def session() -> ServerCapabilities:
        async with Client(srv.url, mode="legacy", message_handler=on_message) as client:
            caps = client.server_capabilities
            echo = await client.call_tool("echo", {"text": "hi"})
            assert echo.content[0].text == "hi"  # type: ignore[union-attr]
            tick = await client.call_tool(
                "ticker", {"count": 3, "interval_ms": 0}, progress_callback=lambda *a: anyio.sleep(0)
            )
            assert tick.structured_content == {"count": 3}
            # A write announces itself on the standalone stream (which the SDK opens on its own
            # after initialize): write until one announcement has come, within a bound.
            for i in range(50):
                meta = RequestParamsMeta(**{"mcp-lab/idempotency-key": f"k{i}"})  # type: ignore[typeddict-unknown-key]
                r = await client.call_tool("ledger.append", {"entry": "e"}, meta=meta)
                assert r.structured_content is not None and r.structured_content["receipt"].startswith("r-")
                await anyio.sleep(0.1)
                if _announced(received):
                    break
            # Checked here, before anything else is asked: every notification so far declared.
            assert [why for m in received if (why := undeclared(m, caps)) is not None] == []
            with warnings.catch_warnings():  # deprecated in 2026-07-28, current in 2025-11-25
                warnings.simplefilter("ignore")
                await client.set_logging_level("error")  # the heartbeat (info) must stop coming
            await anyio.sleep(0.1)
            n = len(received)
            await anyio.sleep(0.5)
            assert all(not isinstance(m, LoggingMessageNotification) for m in received[n:])
            return caps

    with caplog.at_level(logging.DEBUG, logger="mcp"):
        caps = anyio.run(session)
    notes = [m for m in received if not isinstance(m, Exception)]
    assert not [m for m in received if isinstance(m, Exception)]
    assert _announced(notes)
    assert any(
        isinstance(m, LoggingMessageNotification) and m.params.logger == "mcp-lab/heartbeat" for m in notes
    )
    assert [why for m in notes if (why := undeclared(m, caps)) is not None] == []
    # The SDK drops (and logs) what fails its schema: nothing may have been dropped.
    dropped = [r.getMessage() for r in caplog.records if "Failed to validate" in r.getMessage()]
    assert dropped + [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped")] == []


def test_the_capability_rule_itself_refuses_an_undeclared_resource_update() -> None:
    """The check above can fail: a `notifications/resources/updated` without `resources`
    (what this server sent before) is named as undeclared; a log message with `logging` is not."""
    from mcp.types import ResourceUpdatedNotification, ResourceUpdatedNotificationParams

    update = ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri="lab://ledger/r-1"))
    caps = ServerCapabilities.model_validate({"tools": {"listChanged": False}})
    assert undeclared(update, caps) is not None
    log_note = LoggingMessageNotification.model_validate(
        {"method": "notifications/message", "params": {"level": "info", "data": {}}}
    )
    assert undeclared(log_note, caps) is not None
    assert undeclared(log_note, ServerCapabilities.model_validate({"logging": {}})) is None
