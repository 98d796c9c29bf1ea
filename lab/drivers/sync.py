"""The synchronous I/O driver of ClientCore: httpx.Client, one thread per connection.

Written against `threading`, so under Locust (gevent monkey-patches the process) every
"thread" is a greenlet and every wait a cooperative one; outside gevent it works with
real threads. The core is not thread-safe, so every call into it holds one lock (free
under gevent, where nothing preempts).

Why httpx: it cooperates with gevent, yields SSE chunks as they arrive (Locust's
FastHttpUser waits for 1 KiB first, making small events arrive seconds late), and the
same library serves the async driver. `bench/bench_client_io.py` measures it against
geventhttpclient.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from lab.protocol.client import ClientCore
from lab.protocol.commands import CloseConnection, Command, Notice, SendRequest
from lab.protocol.records import Record

READ_IDLE_TIMEOUT = 20.0
"""Seconds without a byte before a connection counts as lost (a `timeout` toxic holds data
forever; without this the client would never notice)."""


def default_client(pool: int = 10_000) -> httpx.Client:
    """One client per process: shared connection pool and TLS context."""
    return httpx.Client(
        timeout=httpx.Timeout(connect=5.0, read=READ_IDLE_TIMEOUT, write=10.0, pool=30.0),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
    )


class SyncDriver:
    def __init__(
        self,
        core: ClientCore,
        url: str,
        client: httpx.Client,
        *,
        on_records: Callable[[list[Record]], None] | None = None,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        self.core = core
        self.url = url
        self.client = client
        self.on_records = on_records
        self.on_notice = on_notice
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._responses: dict[int, httpx.Response] = {}
        self._closed: set[int] = set()
        self._stopped = False
        self._timer = threading.Thread(
            target=self._timer_loop, name=f"timer-{core.config.client_id}", daemon=True
        )
        self._timer.start()

    # -- the application side --------------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a core method (it must take `now` last and return commands, or a pair whose
        second item is the commands) and carry out what it asks."""
        with self._lock:
            out = fn(*args, time.time(), **kwargs)
            cmds = out[1] if isinstance(out, tuple) else out
            self._after(cmds)
            return out[0] if isinstance(out, tuple) else None

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate()` (checked under the lock) holds, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for conn_id in list(self._responses):
                self._close(conn_id)
            self._changed.notify_all()

    # -- carrying out commands -------------------------------------------------------

    def _after(self, cmds: list[Command]) -> None:
        """Under the lock: start/close connections, hand out records and notices, wake waiters."""
        for cmd in cmds:
            if isinstance(cmd, CloseConnection):
                self._close(cmd.conn_id)
            elif not self._stopped:
                threading.Thread(target=self._run, args=(cmd,), daemon=True).start()
        if self.core.records and self.on_records is not None:
            records, self.core.records = self.core.records, []
            self.on_records(records)
        while self.core.notices:
            notice = self.core.notices.popleft()
            if self.on_notice is not None:
                self.on_notice(notice)
        self._changed.notify_all()

    def _close(self, conn_id: int) -> None:
        self._closed.add(conn_id)
        resp = self._responses.pop(conn_id, None)
        if resp is not None:
            resp.close()

    def _feed(self, fn: Callable[..., list[Command]], conn_id: int, *args: Any) -> bool:
        """Tell the core something about a connection; False once the core closed it."""
        with self._lock:
            if conn_id in self._closed:
                return False
            self._after(fn(conn_id, *args, time.time()) if args else fn(conn_id, time.time()))
            return conn_id not in self._closed

    def _run(self, cmd: SendRequest) -> None:
        conn_id = cmd.conn_id
        try:
            request = self.client.build_request(
                cmd.method, self.url, headers=list(cmd.headers), content=cmd.body
            )
            resp = self.client.send(request, stream=True)
        except httpx.HTTPError as e:
            self._lost(conn_id, e)
            return
        with self._lock:
            if conn_id in self._closed:
                resp.close()
                return
            self._responses[conn_id] = resp
        try:
            if not self._feed(
                self.core.response_head, conn_id, resp.status_code, list(resp.headers.multi_items())
            ):
                return
            for chunk in resp.iter_raw():
                if not self._feed(self.core.response_data, conn_id, chunk):
                    return
            self._feed(self.core.response_end, conn_id)
        except (httpx.HTTPError, OSError) as e:
            self._lost(conn_id, e)
        finally:
            with self._lock:
                self._responses.pop(conn_id, None)
            resp.close()

    def _lost(self, conn_id: int, error: BaseException) -> None:
        with self._lock:
            if conn_id in self._closed or self._stopped:
                return
            self._after(self.core.connection_failed(conn_id, time.time(), type(error).__name__))

    def _timer_loop(self) -> None:
        """Run the core's timers (backoff, budget, Retry-After) when they are due."""
        with self._lock:
            while not self._stopped:
                wake = self.core.next_wakeup()
                now = time.time()
                if wake is not None and now >= wake:
                    self._after(self.core.tick(now))
                    continue
                self._changed.wait(1.0 if wake is None else min(1.0, wake - now))
