"""The synchronous I/O driver of ClientCore: httpx.Client, one thread per connection.

Written against `threading`, so under Locust (gevent monkey-patches the process) every
"thread" is a greenlet and every wait a cooperative one; outside gevent it works with
real threads. The core is not thread-safe, so every call into it holds one lock (free
under gevent, where nothing preempts).

Why httpx, measured by `bench/bench_client_io.py` under gevent on this 2-core machine:
geventhttpclient (Locust's FastHttpUser) reads ~3x more events/s flat out, but holds
small events back until its buffer fills — a 150-byte event every 100 ms reached the
reader after a median 1.6 s (max 3.1 s) — while httpx hands each one over in 0.3 ms.
Resume latency and event order are what the lab measures, so httpx it is; it also
serves the async driver.
"""

from __future__ import annotations

import _thread
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from lab.client import ClientCore, Notice, SendRequest
from lab.drivers.base import READ_IDLE_TIMEOUT, DriverBase
from lab.wire.client_ledger import Record

__all__ = ["READ_IDLE_TIMEOUT", "SyncDriver", "default_client"]


def default_client(verify: ssl.SSLContext | bool = True, pool: int = 32) -> httpx.Client:
    """One client's HTTP pool: small (httpcore scans its pool on every request, so one pool
    shared by thousands of open streams would make each request cost more); pass one TLS
    context shared by the process as `verify`, building one per client is slow."""
    return httpx.Client(
        verify=verify,
        timeout=httpx.Timeout(connect=5.0, read=READ_IDLE_TIMEOUT, write=10.0, pool=60.0),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=4),
    )


class SyncDriver(DriverBase):
    def __init__(
        self,
        core: ClientCore,
        url: str,
        client: httpx.Client,
        *,
        on_records: Callable[[list[Record]], None] | None = None,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        super().__init__(core, url, on_records=on_records, on_notice=on_notice)
        self.client = client
        self._lock = threading.RLock()
        self._changed = threading.Event()
        """Set (and replaced by a fresh one) whenever the core said something: waiters
        take the current one under the lock and wait on it without the lock."""
        self._responses: dict[int, httpx.Response] = {}
        self._timer_started = False
        """The timer starts with the first `call`: making a driver starts nothing, so a
        Locust user killed while it is being built leaves nothing behind."""

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._timer_started and not self._stopped:
            self._timer_started = True
            _spawn(self._timer_loop)
        with self._lock:
            return super().call(fn, *args, **kwargs)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate()` (checked under the lock) holds, or `timeout` passes.

        The wait itself holds no lock. (A condition variable would re-acquire the lock as
        it wakes; a Locust user killed right there turns its GreenletExit into "cannot
        release un-acquired lock", which Locust's task loop swallows: the user never
        stops, and neither does the worker.)"""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if predicate():
                    return True
                changed = self._changed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changed.wait(remaining)

    def stop(self) -> None:
        with self._lock:
            self._stop_core()
            for conn_id in list(self._responses):
                self._close(conn_id)
            self._signal()

    def _start(self, cmd: SendRequest) -> None:
        _spawn(self._run, cmd)

    def _close(self, conn_id: int) -> None:
        resp = self._responses.pop(conn_id, None)
        if resp is not None:
            resp.close()  # under gevent this wakes the greenlet blocked reading it

    def _signal(self) -> None:
        self._changed.set()
        self._changed = threading.Event()

    def _run(self, cmd: SendRequest) -> None:
        conn_id = cmd.conn_id
        with self._lock:
            if conn_id in self._closed:
                return  # closed before it was sent: it must not go out at all
        try:
            request = self.client.build_request(
                cmd.method, self.url, headers=list(cmd.headers), content=cmd.body
            )
            resp = self.client.send(request, stream=True)
        except (httpx.HTTPError, OSError) as e:
            with self._lock:
                self._lost(conn_id, e)
            return
        with self._lock:
            if conn_id in self._closed:
                resp.close()
                return
            self._responses[conn_id] = resp
        try:
            with self._lock:
                headers = list(resp.headers.multi_items())
                if not self._feed(self.core.response_head, conn_id, resp.status_code, headers):
                    return
            for chunk in resp.iter_raw():
                with self._lock:
                    if not self._feed(self.core.response_data, conn_id, chunk):
                        return
            with self._lock:
                self._feed(self.core.response_end, conn_id)
        except (httpx.HTTPError, OSError) as e:
            with self._lock:
                self._lost(conn_id, e)
        finally:
            with self._lock:
                self._responses.pop(conn_id, None)
            resp.close()

    def _timer_loop(self) -> None:
        """Run the core's timers (backoff, budget, Retry-After, silent streams) when due."""
        while True:
            with self._lock:
                if self._stopped:
                    return  # nothing more may reach the core (its inbox may be closing)
                sleep = self._due()
                changed = self._changed
            if sleep is not None:
                changed.wait(sleep)


def _spawn(fn: Callable[..., None], *args: Any) -> None:
    """Run `fn` in a new thread (a greenlet under gevent) without waiting for it to start:
    `threading.Thread.start` blocks until the thread runs, a switch at which Locust can
    kill the caller half-way through carrying out the core's commands."""
    _thread.start_new_thread(fn, args)
