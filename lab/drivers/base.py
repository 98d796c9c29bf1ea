"""What every driver does the same way: call the core with the time, carry out the commands
of its output, hand the output's ledger records and notices to whoever listens, and name
transport failures in the lab's words. Only starting and closing a connection, and waking
waiters, differ between the sync and the trio driver."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from lab.client import ClientCore, CloseConnection, Notice, Output, SendRequest
from lab.drivers.causes import transport_cause
from lab.wire.client_ledger import Record

READ_IDLE_TIMEOUT = 20.0
"""Seconds without a byte before a connection counts as lost (a `timeout` toxic holds data
forever; without this the client would never notice)."""


def wire_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """A request's headers as bytes: values in UTF-8, as a browser's EventSource sends a
    `Last-Event-ID` (httpx encodes a str value as ASCII and raises on anything else: a
    target whose event ID is not ASCII must not crash its client's resumption)."""
    return [(name.encode("ascii"), value.encode("utf-8")) for name, value in headers]


class DriverBase:
    def __init__(
        self,
        core: ClientCore,
        url: str,
        *,
        on_records: Callable[[list[Record]], None] | None = None,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        self.core = core
        self.url = url
        self.on_records = on_records
        self.on_notice = on_notice
        self._closed: set[int] = set()
        self._stopped = False
        self.injected_responses = 0
        """Responses the lab's proxy marked as changed by a fault it injected on purpose
        (`x-lab-fault`), for telling the lab's intended failures from the target's: a
        caller compares the count before and after a call. Never read by the core."""
        self.last_injected = ""
        """The fault kinds of the last such response."""

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a core method (it takes `now` after its positional arguments and returns an
        `Output`, or a pair whose second item is the output) and carry out its output;
        returns the pair's first item (a call handle), else None. A stopped driver calls
        nothing (the core's inbox may be closed already)."""
        if self._stopped:
            return None
        out = fn(*args, time.time(), **kwargs)
        if isinstance(out, tuple):
            self._after(out[1])
            return out[0]
        self._after(out)
        return None

    def _after(self, out: Output) -> None:
        # The records first: they are what already happened. Closing a connection may
        # switch greenlets (gevent), and a Locust user killed right there (its stop at the
        # end of a run) lost the records of the same output: an exchange the client had
        # ended, never written (gate 1 then could not verify the events it had received).
        if out.records and self.on_records is not None:
            self.on_records(list(out.records))
        for cmd in out.commands:
            if isinstance(cmd, CloseConnection):
                self._closed.add(cmd.conn_id)
                self._close(cmd.conn_id, finished=cmd.finished)
            elif not self._stopped:
                self._start(cmd)
        if self.on_notice is not None:
            for notice in out.notices:
                self.on_notice(notice)
        self._signal()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _stop_core(self) -> None:
        """Stop the client: its unfinished calls get their outcome, its recoveries their
        end, its open exchanges their records (written before anything is torn down)."""
        if not self._stopped:
            self._after(self.core.close_all(time.time()))
        self._stopped = True

    def _note_injected(self, tag: str | None) -> None:
        """A response head's `x-lab-fault` value (None when it has none)."""
        if tag:
            self.injected_responses += 1
            self.last_injected = tag

    def _feed(self, fn: Callable[..., Output], conn_id: int, *args: Any) -> bool:
        """Tell the core something about a connection; False once the core has closed it
        (or the driver was stopped: then nothing more may reach the core)."""
        if conn_id in self._closed or self._stopped:
            return False
        self._after(fn(conn_id, *args, time.time()))
        return conn_id not in self._closed

    def _lost(self, conn_id: int, error: BaseException) -> None:
        if conn_id not in self._closed and not self._stopped:
            self._after(self.core.connection_failed(conn_id, time.time(), transport_cause(error)))

    def _due(self) -> float | None:
        """Run the core's timers if they are due; else how long to sleep (at most 1 s)."""
        wake = self.core.next_wakeup()
        now = time.time()
        if wake is not None and now >= wake:
            self._after(self.core.tick(now))
            return None
        return 1.0 if wake is None else min(1.0, wake - now)

    def _start(self, cmd: SendRequest) -> None:
        raise NotImplementedError

    def _close(self, conn_id: int, *, finished: bool = False) -> None:
        """Close a connection; `finished` (CloseConnection's): the driver may first let the
        response's message end, to keep the connection."""
        raise NotImplementedError

    def _signal(self) -> None:
        raise NotImplementedError
