"""The async I/O driver of ClientCore: httpx.AsyncClient on trio, one task per connection.

    async with trio.open_nursery() as nursery:
        driver = TrioDriver(core, url, client, nursery)
        driver.call(core.connect)
        await driver.wait_for(lambda: core.state is State.SESSION_ACTIVE, 5)

Closing a connection is cancelling its task's cancel scope: a stream blocked in a read
ends at once (the sync driver can only do that under gevent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import trio

from lab.drivers.sync import READ_IDLE_TIMEOUT
from lab.protocol.client import ClientCore
from lab.protocol.commands import CloseConnection, Command, Notice, SendRequest
from lab.protocol.records import Record


def default_async_client(pool: int = 10_000) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=5.0, read=READ_IDLE_TIMEOUT, write=10.0, pool=30.0),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
    )


class TrioDriver:
    def __init__(
        self,
        core: ClientCore,
        url: str,
        client: httpx.AsyncClient,
        nursery: trio.Nursery,
        *,
        on_records: Callable[[list[Record]], None] | None = None,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        self.core = core
        self.url = url
        self.client = client
        self.nursery = nursery
        self.on_records = on_records
        self.on_notice = on_notice
        self._scopes: dict[int, trio.CancelScope] = {}
        self._closed: set[int] = set()
        self._changed = trio.Event()
        self._stopped = False
        nursery.start_soon(self._timer_loop)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a core method (`now` is passed last) and carry out the commands it returns."""
        out = fn(*args, time.time(), **kwargs)
        self._after(out[1] if isinstance(out, tuple) else out)
        return out[0] if isinstance(out, tuple) else None

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return True
        return False

    def stop(self) -> None:
        self._stopped = True
        for scope in self._scopes.values():
            scope.cancel()
        self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _after(self, cmds: list[Command]) -> None:
        for cmd in cmds:
            if isinstance(cmd, CloseConnection):
                self._closed.add(cmd.conn_id)
                scope = self._scopes.pop(cmd.conn_id, None)
                if scope is not None:
                    scope.cancel()
            elif not self._stopped:
                self._scopes[cmd.conn_id] = trio.CancelScope()
                self.nursery.start_soon(self._run, cmd)
        if self.core.records and self.on_records is not None:
            records, self.core.records = self.core.records, []
            self.on_records(records)
        while self.core.notices:
            notice = self.core.notices.popleft()
            if self.on_notice is not None:
                self.on_notice(notice)
        self._signal()

    def _feed(self, fn: Callable[..., list[Command]], conn_id: int, *args: Any) -> bool:
        if conn_id in self._closed:
            return False
        self._after(fn(conn_id, *args, time.time()))
        return conn_id not in self._closed

    async def _run(self, cmd: SendRequest) -> None:
        conn_id = cmd.conn_id
        scope = self._scopes.get(conn_id)
        if scope is None:
            return
        with scope:
            try:
                request = self.client.build_request(
                    cmd.method, self.url, headers=list(cmd.headers), content=cmd.body
                )
                resp = await self.client.send(request, stream=True)
                try:
                    if not self._feed(
                        self.core.response_head, conn_id, resp.status_code, list(resp.headers.multi_items())
                    ):
                        return
                    async for chunk in resp.aiter_raw():
                        if not self._feed(self.core.response_data, conn_id, chunk):
                            return
                    self._feed(self.core.response_end, conn_id)
                finally:
                    await resp.aclose()
            except (httpx.HTTPError, OSError) as e:
                if conn_id not in self._closed and not self._stopped:
                    self._after(self.core.connection_failed(conn_id, time.time(), type(e).__name__))
        self._scopes.pop(conn_id, None)

    async def _timer_loop(self) -> None:
        while not self._stopped:
            wake = self.core.next_wakeup()
            now = time.time()
            if wake is not None and now >= wake:
                self._after(self.core.tick(now))
                continue
            with trio.move_on_after(1.0 if wake is None else min(1.0, wake - now)):
                await self._changed.wait()
