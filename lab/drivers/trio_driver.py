"""The async I/O driver of ClientCore: httpx.AsyncClient on trio, one task per connection.

    async with trio.open_nursery() as nursery:
        driver = TrioDriver(core, url, client, nursery)
        driver.call(core.connect)
        await driver.wait_for(lambda: core.state is State.SESSION_ACTIVE, 5)

Closing a connection is cancelling its task's cancel scope: a stream blocked in a read
ends at once (the sync driver can only do that under gevent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import trio

from lab.client import ClientCore, Notice, SendRequest
from lab.drivers.base import READ_IDLE_TIMEOUT, DriverBase, wire_headers
from lab.drivers.causes import at_the_edge
from lab.wire.client_ledger import Record
from lab.wire.extensions import LAB_FAULT_HEADER


def default_async_client(pool: int = 10_000) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=5.0, read=READ_IDLE_TIMEOUT, write=10.0, pool=30.0),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
    )


class TrioDriver(DriverBase):
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
        super().__init__(core, url, on_records=on_records, on_notice=on_notice)
        self.client = client
        self.nursery = nursery
        self._scopes: dict[int, trio.CancelScope] = {}
        self._changed = trio.Event()
        nursery.start_soon(self._timer_loop)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return True
        return False

    def stop(self) -> None:
        self._stop_core()
        for scope in self._scopes.values():
            scope.cancel()
        self._signal()

    def _start(self, cmd: SendRequest) -> None:
        self._scopes[cmd.conn_id] = trio.CancelScope()
        self.nursery.start_soon(self._run, cmd)

    def _close(self, conn_id: int, *, finished: bool = False) -> None:  # always at once here
        scope = self._scopes.pop(conn_id, None)
        if scope is not None:
            scope.cancel()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _run(self, cmd: SendRequest) -> None:
        conn_id = cmd.conn_id
        scope = self._scopes.get(conn_id)
        if scope is None:
            return
        with scope:
            try:
                try:
                    request = self.client.build_request(
                        cmd.method, self.url, headers=wire_headers(cmd.headers), content=cmd.body
                    )
                    resp = await self.client.send(request, stream=True)
                except Exception as e:  # the edge is a wall (lab.drivers.causes)
                    raise at_the_edge(e) from e
                try:
                    headers = list(resp.headers.multi_items())
                    self._note_injected(resp.headers.get(LAB_FAULT_HEADER))
                    if not self._feed(self.core.response_head, conn_id, resp.status_code, headers):
                        return
                    chunks = resp.aiter_raw()
                    while (chunk := await _next_chunk(chunks)) is not None:
                        if not self._feed(self.core.response_data, conn_id, chunk):
                            return
                    self._feed(self.core.response_end, conn_id)
                finally:
                    await resp.aclose()
            except (httpx.HTTPError, OSError) as e:
                self._lost(conn_id, e)
        self._scopes.pop(conn_id, None)

    async def _timer_loop(self) -> None:
        while not self._stopped:
            sleep = self._due()
            if sleep is not None:
                with trio.move_on_after(sleep):
                    await self._changed.wait()


async def _next_chunk(chunks: AsyncIterator[bytes]) -> bytes | None:
    """The body's next chunk, None at its end; whatever else than a network or HTTP error
    reading raises becomes an `EdgeError` (the core, fed in the loop, is outside this)."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None
    except Exception as e:
        raise at_the_edge(e) from e
