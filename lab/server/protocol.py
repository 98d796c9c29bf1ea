"""uvicorn's httptools protocol with the bounds it lacks: header size and read timeouts.

Measured (bench/bench_server_resources.py): stock httptools has no header-size limit and
no timeout while a request's head or body is being received (uvicorn's
`timeout_keep_alive` runs only *between* requests, and `h11_max_incomplete_event_size`
applies only to the h11 parser), so a client that sends an endless header or a body that
never ends holds the connection, and its header bytes, forever. These bounds must live
where the bytes arrive, before the ASGI app sees a request:

    start line + headers larger than max_header_bytes   431, connection closed
    head not complete within header_timeout            408, connection closed
    body not complete within body_timeout              408 (or a plain close if a
                                                      response has started)
    more than 16 pipelined requests waiting            connection closed (uvicorn
                                                      queues them without bound)

The header count is of bytes received while the head is incomplete, checked after each
read, so the overshoot is at most one read (≤ 256 KiB).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 64 * 1024
    header_timeout = 10.0
    body_timeout = 30.0
    max_pipelined = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_done = False
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    # A new connection starts with a request head to receive.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._head_done:
            self._head_bytes += len(data)
            if self._timer is None:  # the first bytes of the next request on a kept-alive connection
                self._arm(self.header_timeout)
        super().data_received(data)
        if (
            not self._head_done
            and self._head_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(431, "request head too large")

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._head_bytes = 0
        self._arm(self.body_timeout)
        super().on_headers_complete()
        if len(self.pipeline) > self.max_pipelined:
            # uvicorn queues pipelined requests without bound (reading resumes whenever the
            # app reads a body): a client that never waits for answers grows the queue.
            self._disarm()
            self.transport.close()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._head_done = False  # what arrives next is the next request's head

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self._refuse(408, "request not received in time")

    def _refuse(self, status: int, text: str) -> None:
        """Answer `status` unless a response is under way on this connection, then close it."""
        self._disarm()
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            body = text.encode("ascii")
            head = (
                b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % (status, _REASONS[status], len(body))
            )
            self.transport.write(head + body)
        if cycle is not None and not cycle.response_complete:
            # The app's request is over: its receive() says so, and what it sends goes nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def bounded_protocol(
    max_header_bytes: int, header_timeout: float, body_timeout: float
) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` with these bounds."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {
            "max_header_bytes": max_header_bytes,
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
        },
    )
