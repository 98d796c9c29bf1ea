"""The adapter loop's promises, whatever the implementation: one outcome per call,
`cancelled` only when the application asked, a dying client's calls accounted for, no raw
secret in any line. The implementation here is a scripted stand-in (the seam is the
`Driver` protocol, as httpx's is its transport); the real SDKs are driven in
test_sdk_clients_live.py."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from lab.sut.applog import AppLog, ClientContext
from lab.sut.protocol import Call, Cancel, Leave, Start, command_line, parse_record
from lab.sut.runtime import Adapter, CallFailed
from lab.wire import jsonrpc
from lab.wire.redact import Redactor

RAW_SID = "raw-session-id-that-must-never-be-written"
TOKEN = "Bearer very-secret-token-value"


class ScriptedConnection:
    """Tools: `ok` answers, `fail` is a JSON-RPC error, `hang` waits forever, `boom` raises,
    `die` kills the whole client (as a transport whose task group fails would)."""

    def __init__(self, ctx: ClientContext, tg: anyio.abc.TaskGroup) -> None:
        self._ctx = ctx
        self._tg = tg
        self._next = 1

    @property
    def protocol_version(self) -> str | None:
        return "2025-11-25"

    async def call(self, call: Call) -> None:
        rid, self._next = self._next, self._next + 1
        self._ctx.request_sent(rid, call.idempotency_key)
        if call.tool == "ok":
            self._ctx.deliver(jsonrpc.result(rid, {"content": []}))
        elif call.tool == "fail":
            raise CallFailed(-32602, f"bad arguments for session {RAW_SID}")
        elif call.tool == "hang":
            await anyio.sleep_forever()
        elif call.tool == "boom":
            raise RuntimeError(f"transport broke, token {TOKEN.split()[1]}")
        elif call.tool == "die":

            async def crash() -> None:
                raise ConnectionError(f"connection to session {RAW_SID} reset")

            self._tg.start_soon(crash)
            await anyio.sleep_forever()


class ScriptedDriver:
    adapter = "scripted"
    implementation = ("scripted", "1")

    @asynccontextmanager
    async def open(self, start: Start, ctx: ClientContext) -> AsyncIterator[ScriptedConnection]:
        ctx.set_session_id(RAW_SID)
        async with anyio.create_task_group() as tg:
            yield ScriptedConnection(ctx, tg)
            tg.cancel_scope.cancel()


def run_script(*commands: Call | Start | Cancel | Leave, settle: float = 0.05) -> list[dict[str, Any]]:
    out = io.StringIO()

    async def main() -> None:
        adapter = Adapter(ScriptedDriver(), AppLog(out), Redactor(b"k" * 32))
        async with anyio.create_task_group() as tg:
            for n, cmd in enumerate(commands, 1):
                adapter.handle(command_line(cmd).encode(), n, tg)
                await anyio.sleep(settle)
            await adapter.stop()
            tg.cancel_scope.cancel()

    anyio.run(main)
    return [parse_record(line) for line in out.getvalue().splitlines()]


def outcomes(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["call"]: r for r in records if r["ev"] == "outcome"}


def start(client: str = "c1") -> Start:
    return Start(client, "http://127.0.0.1:1/mcp", None, {"Authorization": TOKEN})


def test_every_call_ends_once_and_cancelled_means_the_application_asked() -> None:
    records = run_script(
        start(),
        Call("c1", "a", "ok", {}, "ka"),
        Call("c1", "b", "fail", {}, "kb"),
        Call("c1", "c", "boom", {}, "kc"),
        Call("c1", "d", "hang", {}, "kd"),
        Call("c1", "e", "hang", {}, "ke"),
        Cancel("d"),
        Leave("c1"),
    )
    got = {c: (o["status"], o["error"], o["code"]) for c, o in outcomes(records).items()}
    assert got["a"] == ("ok", None, None)
    assert got["b"][0] == "error" and got["b"][2] == -32602
    assert got["c"][0] == "exception" and got["c"][1].startswith("RuntimeError: transport broke")
    assert got["d"] == ("cancelled", "cancel", None)
    assert got["e"] == ("cancelled", "leave", None)
    assert len([r for r in records if r["ev"] == "outcome"]) == 5
    # The response was joined to its call by the idempotency key the request carried.
    (answer,) = [r for r in records if r["ev"] == "deliver"]
    assert answer["call"] == "a" and answer["id"] == outcomes(records)["a"]["id"] == 1
    assert [r["ev"] for r in records][-1] == "left"


def test_a_client_that_dies_accounts_for_its_calls_and_later_ones() -> None:
    records = run_script(
        start(),
        Call("c1", "waiting", "hang", {}, "k1"),
        Call("c1", "killer", "die", {}, "k2"),
        Call("c1", "late", "ok", {}, "k3"),
    )
    (failed,) = [r for r in records if r["ev"] == "client_failed"]
    assert "connection to session" in failed["error"]
    res = outcomes(records)
    assert {c: o["status"] for c, o in res.items()} == dict.fromkeys(
        ["waiting", "killer", "late"], "exception"
    )
    assert all(o["error"] == f"client ended: {failed['error']}" for o in res.values())
    assert not [r for r in records if r["ev"] == "left"]


def test_calls_sent_before_the_client_is_up_wait_for_it() -> None:
    records = run_script(start(), Call("c1", "early", "ok", {}, "k1"), Leave("c1"), settle=0)
    assert outcomes(records)["early"]["status"] == "ok"


def test_no_raw_session_id_or_token_in_any_line() -> None:
    records = run_script(
        start(),
        Call("c1", "b", "fail", {}, "kb"),
        Call("c1", "c", "boom", {}, "kc"),
        Call("c1", "x", "die", {}, "kx"),
    )
    text = "\n".join(json.dumps(r) for r in records)
    pseudonym = Redactor(b"k" * 32).session(RAW_SID)
    assert pseudonym is not None
    assert RAW_SID not in text and TOKEN.split()[1] not in text
    assert pseudonym in text and "<credential>" in text  # the secrets were there, replaced
    assert {r["session"] for r in records if r["ev"] in ("outcome", "started")} == {pseudonym}
