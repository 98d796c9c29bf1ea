"""Transport failures named in the lab's own words, at the driver's edge.

The core and the ledgers never see an exception class: a driver passes
`transport_cause(error)` to `ClientCore.connection_failed`, so a witness says
"peer_closed_mid_body", not "RemoteProtocolError" (a name httpx shares with
`lab.wire.errors.RemoteProtocolError`, which means something else).

    cause                         what happened
    connection_refused            nothing listens (or a proxy refused the connection)
    connection_reset              the peer reset or aborted the connection (RST, EPIPE)
    connect_timeout               no connection within the connect timeout
    read_timeout                  no byte within the read timeout (a silent peer)
    write_timeout / pool_timeout  the request could not be written / no free connection
    peer_closed_before_response   the connection closed before any response head
    peer_closed_mid_body          the connection closed in the middle of the body
    protocol_error                the peer broke HTTP in another way
    connect_failed / read_failed / write_failed   other network errors at that step
    decoding_error                the body could not be decoded (content-encoding)
    encoding_error                the request could not be encoded (a header value, e.g.)
    driver_error                  anything else the HTTP stack raised (named by its class
                                  in the worker's log, never the exception's text)
    network_error / transport_error               anything else of the network / of httpx

The driver's edge is a wall: whatever the HTTP stack raises while a request is sent or
its body read (a target's garbage may reach a codec in httpx, h11 or the standard
library) comes out as an `EdgeError` (a `httpx.TransportError`, so the drivers' one
`except` takes it), named here, and the request is recorded as lost with that cause.
Nothing escapes into gevent's hub, which would print the request, headers and all.
"""

from __future__ import annotations

import errno

import httpx


class EdgeError(httpx.TransportError):
    """Something other than a network or HTTP error, raised by the HTTP stack while a
    request was sent or its body read; `cause` names it (the original is `__cause__`)."""

    def __init__(self, error: Exception) -> None:
        # The class only: an exception's text may quote what it could not encode (a header).
        super().__init__(type(error).__name__)
        self.cause = "encoding_error" if isinstance(error, UnicodeError) else "driver_error"


def at_the_edge(error: Exception) -> Exception:
    """`error` if it is a network or HTTP error (the drivers know those), else an
    `EdgeError` around it."""
    return error if isinstance(error, httpx.HTTPError | OSError) else EdgeError(error)


_BY_TYPE: tuple[tuple[type[BaseException], str], ...] = (
    (httpx.ConnectTimeout, "connect_timeout"),
    (httpx.ReadTimeout, "read_timeout"),
    (httpx.WriteTimeout, "write_timeout"),
    (httpx.PoolTimeout, "pool_timeout"),
    (httpx.ConnectError, "connect_failed"),
    (httpx.ReadError, "read_failed"),
    (httpx.WriteError, "write_failed"),
    (httpx.CloseError, "connection_reset"),
    (httpx.RemoteProtocolError, "protocol_error"),
    (httpx.LocalProtocolError, "protocol_error"),
    (httpx.DecodingError, "decoding_error"),
    (ConnectionRefusedError, "connection_refused"),
    (ConnectionResetError, "connection_reset"),
    (ConnectionAbortedError, "connection_reset"),
    (BrokenPipeError, "connection_reset"),
    (TimeoutError, "read_timeout"),
    (httpx.TransportError, "transport_error"),
    (OSError, "network_error"),
)
"""The first class the error is an instance of names it (most specific first)."""

_BY_ERRNO: dict[int, str] = {
    errno.ECONNREFUSED: "connection_refused",
    errno.ECONNRESET: "connection_reset",
    errno.ECONNABORTED: "connection_reset",
    errno.EPIPE: "connection_reset",
}
"""An OS error behind a generic failure says more precisely what happened."""

_GENERIC = frozenset({"connect_failed", "read_failed", "write_failed", "transport_error", "network_error"})

_BY_MESSAGE: tuple[tuple[str, str], ...] = (
    ("without sending complete message body", "peer_closed_mid_body"),
    ("incomplete chunked read", "peer_closed_mid_body"),
    ("server disconnected without sending a response", "peer_closed_before_response"),
)
"""h11/httpcore say how the peer closed only in the message of their protocol error."""


def transport_cause(error: BaseException) -> str:
    """The lab's cause name for a transport failure (see the module docstring)."""
    if isinstance(error, EdgeError):
        return error.cause
    cause = next((name for kind, name in _BY_TYPE if isinstance(error, kind)), "transport_error")
    if isinstance(error, httpx.ProtocolError | httpx.TransportError):
        text = str(error).lower()
        cause = next((name for needle, name in _BY_MESSAGE if needle in text), cause)
    if cause in _GENERIC:
        for inner in [error, *_chain(error)]:
            if isinstance(inner, OSError) and inner.errno in _BY_ERRNO:
                return _BY_ERRNO[inner.errno]
            inner_cause = next((name for kind, name in _BY_TYPE if isinstance(inner, kind)), None)
            if inner_cause is not None and inner_cause not in _GENERIC:
                return inner_cause
    return cause


def _chain(error: BaseException) -> list[BaseException]:
    """The errors behind `error` (`raise ... from`, or raised while handling), nearest first."""
    out: list[BaseException] = []
    inner = error.__cause__ or error.__context__
    while inner is not None and inner not in out and len(out) < 8:
        out.append(inner)
        inner = inner.__cause__ or inner.__context__
    return out
