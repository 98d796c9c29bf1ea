"""The trio driver + ClientCore against the live reference server."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from lab.client import (
    BackoffPolicy,
    CallFinished,
    CallHandle,
    CallOutcome,
    ClientConfig,
    ClientCore,
    LeaveFinished,
    LeaveReceipt,
    Notice,
    ReconnectBudget,
    SessionLost,
    State,
)
from lab.drivers.trio_driver import TrioDriver, default_async_client
from lab.inbox import InboxDatabase
from lab.wire.client_ledger import Record, Recovery
from lab.wire.redact import Redactor
from tests.livesrv import LEDGER_KEY, LiveProcess, reference_server

pytestmark = pytest.mark.live
ADMIN = "admin-token-0123"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    with reference_server(
        tmp_path_factory.mktemp("trio"), "--admin-token", ADMIN, "--tokens", "tok=alice"
    ) as p:
        yield p


class Harness:
    def __init__(self, url: str, tmp: Path, nursery: trio.Nursery, client: httpx.AsyncClient) -> None:
        self.db = InboxDatabase(tmp / "client.sqlite")
        self.records: list[Record] = []
        self.notices: list[Notice] = []
        self.core = ClientCore(
            ClientConfig(client_id="c1", token="tok", auth_subject="alice", backoff=BackoffPolicy(0.05, 0.5)),
            inbox=self.db.inbox("c1"),
            budget=ReconnectBudget(50.0),
            redactor=Redactor(bytes.fromhex(LEDGER_KEY)),
            rng=random.Random(3),
        )
        self.driver = TrioDriver(
            self.core, url, client, nursery, on_records=self.on_records, on_notice=self.notices.append
        )

    def on_records(self, records: list[Record]) -> None:
        self.records += records
        self.db.record(records)

    async def connect(self) -> None:
        self.driver.call(self.core.connect)
        assert await self.driver.wait_for(lambda: self.core.state is State.SESSION_ACTIVE, 10)

    async def call(
        self, tool: str, args: dict[str, object], *, write: bool = False, key: str | None = None
    ) -> CallFinished:
        handle: CallHandle = self.driver.call(
            self.core.call_tool, tool, args, idempotency_key=key, write=write
        )
        return await self.finished(handle)

    async def finished(self, handle: CallHandle, timeout: float = 20) -> CallFinished:
        def done() -> bool:
            return any(isinstance(n, CallFinished) and n.call == handle for n in self.notices)

        assert await self.driver.wait_for(done, timeout), f"{handle} did not finish"
        return [n for n in self.notices if isinstance(n, CallFinished) and n.call == handle][-1]


def run(url: str, tmp: Path, body: object) -> Harness:
    box: list[Harness] = []

    async def main() -> None:
        async with default_async_client() as client, trio.open_nursery() as nursery:
            h = Harness(url, tmp, nursery, client)
            box.append(h)
            with trio.fail_after(60):
                await body(h)  # type: ignore[operator]
            h.driver.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)
    box[0].db.close()
    return box[0]


def test_a_client_life_on_the_real_server(srv: LiveProcess, tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        await h.connect()
        assert (await h.call("echo", {"text": "hi"})).outcome is CallOutcome.OK
        ticks = await h.call("ticker", {"count": 5, "interval_ms": 10})
        assert ticks.outcome is CallOutcome.OK and ticks.result is not None
        w = await h.call("ledger.append", {"entry": "x"}, write=True)
        assert w.result is not None and w.result["structuredContent"]["receipt"].startswith("r-")
        h.driver.call(h.core.leave)
        assert await h.driver.wait_for(lambda: any(isinstance(n, LeaveFinished) for n in h.notices), 10)

    h = run(srv.url, tmp_path, body)
    assert [n.receipt for n in h.notices if isinstance(n, LeaveFinished)] == [LeaveReceipt.DELETED]
    db = sqlite3.connect(tmp_path / "client.sqlite")
    kinds = {r[0] for r in db.execute("SELECT kind FROM inbox")}
    assert {"priming", "notification", "response"} <= kinds
    purposes = {r[0] for r in db.execute("SELECT purpose FROM http_exchanges")}
    assert {"initialize", "initialized", "standalone", "call", "delete"} <= purposes


def test_server_initiated_close_is_resumed_and_every_event_arrives_once(
    srv: LiveProcess, tmp_path: Path
) -> None:
    async def body(h: Harness) -> None:
        await h.connect()
        f = await h.call("ticker", {"count": 12, "interval_ms": 40, "close_after": 3, "retry_ms": 100})
        assert f.outcome is CallOutcome.OK

    h = run(srv.url, tmp_path, body)
    db = sqlite3.connect(tmp_path / "client.sqlite")
    seqs = [
        r[0] for r in db.execute("SELECT sequence FROM inbox WHERE stream_key LIKE 'post:%' ORDER BY rowid")
    ]
    assert seqs == list(range(14))  # priming, 12 progress, response: once each, in order
    resumes = db.execute("SELECT COUNT(*), MIN(advised_delay) FROM reconnects WHERE kind='resume'").fetchone()
    assert resumes[0] >= 3 and resumes[1] == pytest.approx(0.1)
    assert all(r.path == "resumed" for r in h.records if isinstance(r, Recovery))


def test_expired_session_reinitializes_and_an_explicit_retry_writes_once(
    srv: LiveProcess, tmp_path: Path
) -> None:
    async def body(h: Harness) -> None:
        await h.connect()
        handle: CallHandle = h.driver.call(
            h.core.call_tool, "ticker", {"count": 50, "interval_ms": 20}, write=False
        )
        await trio.sleep(0.2)
        async with httpx.AsyncClient() as admin:
            r = await admin.post(
                srv.url.replace("/mcp", "/lab-admin/expire"),
                headers={"x-lab-admin-token": ADMIN, "mcp-session-id": h.core.session_id or ""},
            )
            assert r.status_code == 200
        first = await h.finished(handle)
        assert first.outcome is CallOutcome.UNKNOWN
        assert await h.driver.wait_for(
            lambda: h.core.generation == 2 and h.core.state is State.SESSION_ACTIVE, 10
        )
        w1 = await h.call("ledger.append", {"entry": "e"}, write=True, key="k-once")
        w2 = await h.call("ledger.append", {"entry": "e"}, write=True, key="k-twice")
        assert w1.outcome is w2.outcome is CallOutcome.OK

    h = run(srv.url, tmp_path, body)
    assert any(isinstance(n, SessionLost) for n in h.notices)
    time.sleep(0.2)
    server_db = sqlite3.connect(Path(srv.log).parent / "ledger.sqlite")
    rows = server_db.execute(
        "SELECT idempotency_key, effect FROM dispatches WHERE idempotency_key LIKE 'k-%'"
    ).fetchall()
    assert sorted(rows) == [("k-once", "performed"), ("k-twice", "performed")]
