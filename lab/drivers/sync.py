"""The synchronous I/O driver of ClientCore: httpx.Client, one thread per connection.

Written against `threading`, so under Locust (gevent monkey-patches the process) every
"thread" is a greenlet and every wait a cooperative one; outside gevent it works with
real threads. The core is not thread-safe, so every call into it holds one lock (free
under gevent, where nothing preempts).

Memory is what bounds the clients one Locust worker holds, so a driver keeps little:
no thread of its own (the process clock, `lab.drivers.clock`, runs every driver's
timers), a raw greenlet per open connection under gevent reading a few frames deep
(`lab.drivers.body`), and no idle connection beyond its keep-alive (`KEEPALIVE_S`).
docs/architecture.md gives the per-client breakdown.

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
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from lab.client import ClientCore, Notice, SendRequest
from lab.drivers.base import READ_IDLE_TIMEOUT, DriverBase, wire_headers
from lab.drivers.body import body_reader
from lab.drivers.causes import at_the_edge
from lab.drivers.clock import process_clock
from lab.wire.client_ledger import Record
from lab.wire.extensions import LAB_FAULT_HEADER

__all__ = ["KEEPALIVE_S", "READ_IDLE_TIMEOUT", "SyncDriver", "close_idle_connections", "default_client"]

KEEPALIVE_S = 2.0
"""Seconds an idle kept-alive connection stays open (the driver closes it within a second
after). A request on a kept-alive connection costs mitmdump with the fault addon about
3 ms of CPU, one on a new connection 6-8 ms (an initialize POST, measured); but an idle
connection holds a descriptor here and two in every proxy of the chain, and httpcore
closes an expired one only when the client sends its next request. A mostly idle client
(a call every 5-15 s) would hold its POST connection beside its GET stream all the time
while reusing it almost never (httpx's default keep-alive is 5 s). Two seconds keeps the
reuse of busy clients (calls less than 2 s apart) and leaves an idle client one
connection, its GET stream (bench/bench_worker_capacity.py)."""


def default_client(
    verify: ssl.SSLContext | bool = True,
    pool: int = 32,
    keepalive: float = KEEPALIVE_S,
    read_timeout: float = READ_IDLE_TIMEOUT,
) -> httpx.Client:
    """One client's HTTP pool: small (httpcore scans its pool on every request, so one pool
    shared by thousands of open streams would make each request cost more); pass one TLS
    context shared by the process as `verify`, building one per client is slow."""
    return httpx.Client(
        verify=verify,
        timeout=httpx.Timeout(connect=5.0, read=read_timeout, write=10.0, pool=60.0),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=4, keepalive_expiry=keepalive),
    )


IDLE_CHECK_S = 1.0
"""While a driver has idle connections, it looks this often whether to close them."""

DRAIN_S = 0.5
DRAIN_BYTES = 64 * 1024
"""A response the core is done with (its call answered, CloseConnection `finished`) is
read to the end of its message, so its connection goes back to the pool: for at most
DRAIN_S between reads and DRAIN_BYTES in all. The reference server ends a POST stream
right after the answer; a server that keeps it open gets the connection closed."""


def close_idle_connections(client: httpx.Client) -> int:
    """Close the client's idle connections whose keep-alive has run out (or that the server
    closed); returns how many idle ones are left open. (httpcore does this only when the
    pool is next used: a client that stays idle would keep them open until then.)

    Safe against a request taking the connection meanwhile: the pool never hands out an
    expired connection, and one handed out just before it expired but not yet started is
    refused by the closed connection and retried by httpcore on a new one. (`has_expired`
    polls the socket, which under gevent may yield: hence `is_idle` again right before
    closing.) A client whose transport is not httpx's own is left alone."""
    transport = getattr(client, "_transport", None)
    if not isinstance(transport, httpx.HTTPTransport):
        return 0
    left = 0
    for conn in transport._pool.connections:
        if conn.is_idle():
            if conn.has_expired() and conn.is_idle():
                conn.close()
            elif conn.is_idle():
                left += 1
    return left


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
        self._awaited = False
        """A waiter took `_changed` since it was last set: only then is it set and replaced
        (most signals, one per event of a stream, have nobody waiting)."""
        self._responses: dict[int, httpx.Response] = {}
        self._draining: set[int] = set()
        """Responses the core is done with whose reader lets the message end (DRAIN_S)."""
        self._timer_started = False
        """The timer starts with the first `call`: making a driver starts nothing, so a
        Locust user killed while it is being built leaves nothing behind."""
        self.wake_at: float | None = None
        """The process clock's: when it wakes this driver to run the core's timers."""

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._timer_started and not self._stopped:
            self._timer_started = True
            process_clock().schedule(self, 0.0)
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
                self._awaited = True
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

    def _close(self, conn_id: int, *, finished: bool = False) -> None:
        if finished and conn_id in self._responses:
            # Its own reader is the one feeding the core now: it reads on to the end of
            # the message (nothing more reaches the core), then closes it (`_run`).
            self._draining.add(conn_id)
            return
        resp = self._responses.pop(conn_id, None)
        if resp is not None:
            resp.close()  # under gevent this wakes the greenlet blocked reading it

    def _signal(self) -> None:
        if self._awaited:
            self._awaited = False
            self._changed.set()
            self._changed = threading.Event()
        if self._timer_started and not self._stopped:
            # The core may have moved its next wake-up earlier (a loss to reconnect, a
            # stream to watch): the clock learns it now. Every change of the core comes
            # through here, so a driver with nothing due is not woken at all.
            wake = self.core.next_wakeup()
            if wake is not None:
                process_clock().schedule(self, wake - time.time())

    def _run(self, cmd: SendRequest) -> None:
        conn_id = cmd.conn_id
        with self._lock:
            if conn_id in self._closed:
                return  # closed before it was sent: it must not go out at all
        try:
            resp = self.client.send(
                self.client.build_request(
                    cmd.method, self.url, headers=wire_headers(cmd.headers), content=cmd.body
                ),
                stream=True,
            )
        except Exception as e:  # the edge is a wall (lab.drivers.causes): no core call inside
            with self._lock:
                self._lost(conn_id, at_the_edge(e))
            return
        # This frame lives as long as the stream does: keep in it only what reading needs
        # (the request went out; `resp.request` has its own copy).
        del cmd
        with self._lock:
            if conn_id in self._closed:
                resp.close()
                self._released()
                return
            self._responses[conn_id] = resp
        try:
            with self._lock:
                self._note_injected(resp.headers.get(LAB_FAULT_HEADER))
                # (No local for the header list: this frame lives as long as the stream.)
                if not self._feed(
                    self.core.response_head, conn_id, resp.status_code, resp.headers.multi_items()
                ):
                    return
            # The core has the head: the stream (a GET held for minutes) need not keep
            # either header list, ~2 KiB of each open stream (bench_worker_capacity --users:
            # 46.6 -> 44.0 KiB per user at 4,000 users).
            resp.headers = httpx.Headers()
            resp.request.headers = httpx.Headers()
            # Read a few frames deep where httpx allows it (lab.drivers.body): an idle
            # stream's blocked reader then keeps a smaller stack.
            read = _walled(body_reader(resp) or _next_of(resp.iter_raw()))
            chunks = 0
            while (chunk := read()) is not None:
                with self._lock:
                    if not self._feed(self.core.response_data, conn_id, chunk):
                        draining = conn_id in self._draining
                        break
                chunks += 1
                if not chunks & YIELD_EVERY:
                    # A read that always finds data never blocks, and so never lets another
                    # greenlet run: a target that floods starved the worker's heartbeats and
                    # its flush loop until the master dropped it (lab.load.overload).
                    time.sleep(0)
            else:
                draining = False
                with self._lock:
                    self._feed(self.core.response_end, conn_id)
            if draining:
                _drain(resp)
            return
        except (httpx.HTTPError, OSError) as e:
            with self._lock:
                self._lost(conn_id, e)
        finally:
            with self._lock:
                self._responses.pop(conn_id, None)
                self._draining.discard(conn_id)
            resp.close()  # a message read to its end leaves the connection in the pool
            self._released()

    def _released(self) -> None:
        """A response is over: its connection may sit idle in the pool from now on."""
        if self._timer_started and not self._stopped:
            process_clock().schedule(self, IDLE_CHECK_S)

    def on_clock(self) -> None:
        """Called by the process clock: run the core's timers (backoff, budget, Retry-After,
        silent streams) if they are due, else ask for the time they will be; close the
        idle connections whose keep-alive ran out, and look again in a second while some
        are left."""
        with self._lock:
            if self._stopped:
                return  # nothing more may reach the core (its inbox may be closing)
            wake = self.core.next_wakeup()
            now = time.time()
            if wake is not None and now >= wake:
                self._after(self.core.tick(now))  # its signal asks for the next wake-up
            elif wake is not None:
                process_clock().schedule(self, wake - now)
        if close_idle_connections(self.client):  # outside the lock: it may yield (gevent)
            process_clock().schedule(self, IDLE_CHECK_S)


def _drain(resp: httpx.Response) -> None:
    """Read a response the core is done with to the end of its message (bounded by
    DRAIN_S and DRAIN_BYTES), discarding it; whatever stops it, the caller closes."""
    read = None if resp.is_closed else body_reader(resp, timeout=DRAIN_S)
    if read is None:
        return  # not the shallow path (or closed meanwhile, by stop()): closed as before
    left = DRAIN_BYTES
    try:
        while left > 0 and (chunk := read()) is not None:
            left -= len(chunk)
    except Exception:  # whatever it was (lab.drivers.causes' wall): the caller closes
        pass  # the connection is not reusable then: closing it is all that is left


YIELD_EVERY = 31
"""A reader gives the others their turn every 32 chunks (a mask: `chunks & 31 == 0`)."""


def _walled(read: Callable[[], bytes | None]) -> Callable[[], bytes | None]:
    """`read`, with whatever else than a network or HTTP error it raises (a codec's, from
    a target's garbage) turned into an `EdgeError`: the body loop's `except` takes it, and
    the core (called in that loop too) is never inside this wall."""

    def walled() -> bytes | None:
        try:
            return read()
        except Exception as e:
            raise at_the_edge(e) from e

    return walled


def _next_of(chunks: Iterator[bytes]) -> Callable[[], bytes | None]:
    """`iter_raw()` as a reader: its next chunk, None at the end."""
    return lambda: next(chunks, None)


def _spawn(fn: Callable[..., None], *args: Any) -> None:
    """Run `fn` in a new thread (a greenlet under gevent) without waiting for it to start:
    `threading.Thread.start` blocks until the thread runs, a switch at which Locust can
    kill the caller half-way through carrying out the core's commands.

    Under gevent, a raw greenlet: gevent's `Greenlet` (what a patched `_thread` makes)
    keeps the stack it was spawned from and its arguments for as long as it runs, about
    2 KiB for each open stream. An exception escaping either kind is printed by gevent's
    hub the same way."""
    if not _spawner:
        _spawner.append(_choose_spawner())
    _spawner[0](fn, *args)


_spawner: list[Callable[..., Any]] = []


def _choose_spawner() -> Callable[..., Any]:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        import gevent

        return gevent.spawn_raw  # type: ignore[no-any-return]

    def start(fn: Callable[..., None], *args: Any) -> None:
        _thread.start_new_thread(fn, args)

    return start
