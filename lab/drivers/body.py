"""A response body read from its HTTP/1.1 connection, a few frames deep.

`httpx.Response.iter_raw()` reaches the socket through six nested generators (httpx's
`iter_raw`, its bound stream, its transport's stream, httpcore's pool stream, its
connection stream, `_receive_response_body`). A reader blocked in `recv` for minutes (an
idle GET stream) keeps every one of them: under gevent, greenlet saves the C stack each
nested generator adds, the largest single part of an idle client's memory
(bench/bench_worker_capacity.py --users: 43.7-43.8 -> 41.1-41.4 KiB per Locust user at
4,000 users).

`body_reader(resp)` reads the same bytes the same way httpcore does: from the response's
`HTTP11Connection`, one h11 event at a time (`_receive_event`, which reads the socket when
h11 needs data), stopping at the message's end, with httpcore's errors turned into httpx's
(as httpx maps them), so a failure has the same class, message and cause
(lab.drivers.causes) as through `iter_raw`. Closing the response afterwards is unchanged:
a finished message leaves the connection reusable, an unfinished one closes it.

These are httpx's and httpcore's private parts (httpx is pinned to 0.28). Where they are
not what this module expects (another version, HTTP/2, a mock transport), `body_reader`
returns None and the caller reads with `iter_raw()`; `tests/drivers/test_body.py` fails
if the installed versions no longer take the shallow path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h11
import httpcore
import httpx

__all__ = ["body_reader"]

_AS_HTTPX: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)
"""What a body read may raise, as httpx raises it (most specific first): the class and
message `iter_raw` would give. (Not httpx's own mapping, a context manager: entered on
every read, it would be kept, suspended, by every blocked reader.)"""


def _as_httpx(error: Exception) -> Exception:
    return next((to(str(error)) for kind, to in _AS_HTTPX if isinstance(error, kind)), error)


def _connection(resp: httpx.Response) -> Any | None:
    """The httpcore HTTP11Connection carrying `resp`, or None."""
    stream: Any = resp.stream
    try:
        conn = stream._stream._httpcore_stream._stream._connection
    except AttributeError:
        return None
    if type(conn).__name__ != "HTTP11Connection" or not callable(getattr(conn, "_receive_event", None)):
        return None
    return conn


def body_reader(resp: httpx.Response, *, timeout: float | None = None) -> Callable[[], bytes | None] | None:
    """A function returning the body's next bytes, None once the body has ended (raising
    httpx's errors, as `iter_raw` would); None if `resp` cannot be read this way. Each
    read waits at most `timeout` s for data (default: the request's read timeout)."""
    if resp.is_closed or resp.is_stream_consumed:
        return None
    conn = _connection(resp)
    if conn is None:
        return None
    if timeout is None:
        timeout = resp.request.extensions.get("timeout", {}).get("read")
    receive_event = conn._receive_event

    def read() -> bytes | None:
        # As httpcore's `_receive_response_body`: data, or the end; anything else is
        # passed over.
        while True:
            try:
                event = receive_event(timeout=timeout)
            except Exception as e:
                mapped = _as_httpx(e)
                if mapped is e:
                    raise
                raise mapped from e
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                return None

    return read
