"""The `header_hold` toxic's view of a connection's responses (pure): where each HTTP/1.1
response head ends and where its body ends, so that a head is held until the first byte
after it, as some CDNs do (they send the status and headers only with the first body
byte: a server that sends no byte of an SSE stream for a while leaves its client with no
answer at all, not even the 200).

Framing follows RFC 9112 for responses: no body for 1xx, 204 and 304; `Transfer-Encoding:
chunked` (chunk sizes, data, trailers); `Content-Length`; otherwise the body runs to the
end of the connection. A head that cannot be read (or that grows past `MAX_HEAD` bytes)
ends the framing: from then on every byte passes untouched, as it would without the
toxic. Requests are not seen (one direction), so a response to HEAD is not known as
such: MCP clients send none.
"""

from __future__ import annotations

import enum
import re
from typing import Final

MAX_HEAD: Final = 64 * 1024
_RESPONSE: Final = b"HTTP/1."
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]+")


class _Mode(enum.Enum):
    HEAD = "head"  # reading a response head
    WAIT = "wait"  # a head is held: its first body byte has not come
    LENGTH = "length"  # a body of a known length
    CHUNK_SIZE = "chunk_size"  # a chunked body: the size line
    CHUNK_DATA = "chunk_data"
    CHUNK_END = "chunk_end"  # the CRLF after a chunk's data
    TRAILERS = "trailers"  # after the last chunk: trailer lines until an empty one
    TO_CLOSE = "to_close"  # a body that ends with the connection
    PASS = "pass"  # framing given up: everything passes


class HeaderHold:
    """One connection's responses, fed in order: `feed` returns the bytes that may go on
    now; a response's head is kept back until a byte of its body has come. With
    `hold_heads=False` it only follows the framing (`between_responses`: the buffer
    toxic lets a complete response go, as a buffering proxy does)."""

    __slots__ = ("_body_mode", "_buf", "_held", "_hold_heads", "_left", "_mode")

    def __init__(self, *, hold_heads: bool = True) -> None:
        self._hold_heads = hold_heads
        self._mode = _Mode.HEAD
        self._body_mode = _Mode.HEAD  # what follows the held head
        self._buf = bytearray()  # bytes of the current head, or of a size or trailer line
        self._held = b""  # a complete head waiting for its first body byte
        self._left = 0  # bytes left of a body (LENGTH) or of a chunk (CHUNK_DATA, CHUNK_END)

    @property
    def holding(self) -> bool:
        """Whether a complete head is held back."""
        return self._mode is _Mode.WAIT

    @property
    def between_responses(self) -> bool:
        """Whether every response fed so far is complete (none begun and unfinished)."""
        return self._mode is _Mode.HEAD and not self._buf

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        view = memoryview(data)
        while view:  # each pass consumes at least one byte, or stops
            view = self._step(view, out)
        return bytes(out)

    def release(self) -> bytes:
        """At the end of the stream (or when the toxic leaves): whatever is held."""
        held = self._held + bytes(self._buf) if self._mode in (_Mode.WAIT, _Mode.HEAD) else self._held
        self._held, self._buf, self._mode = b"", bytearray(), _Mode.PASS
        return held

    def _step(self, view: memoryview, out: bytearray) -> memoryview:
        mode = self._mode
        if mode is _Mode.PASS or mode is _Mode.TO_CLOSE:
            out += view
            return view[len(view) :]
        if mode is _Mode.WAIT:  # the first body byte has come: the head goes with it
            out += self._held
            self._held = b""
            self._mode = self._body_mode
            return view
        if mode is _Mode.HEAD:
            return self._head(view, out)
        if mode is _Mode.LENGTH or mode is _Mode.CHUNK_DATA or mode is _Mode.CHUNK_END:
            n = min(self._left, len(view))
            out += view[:n]
            self._left -= n
            if not self._left:
                self._mode = {
                    _Mode.LENGTH: _Mode.HEAD,
                    _Mode.CHUNK_DATA: _Mode.CHUNK_END,
                    _Mode.CHUNK_END: _Mode.CHUNK_SIZE,
                }[mode]
                if self._mode is _Mode.CHUNK_END:
                    self._left = 2
            return view[n:]
        return self._line(view, out)  # CHUNK_SIZE, TRAILERS

    def _head(self, view: memoryview, out: bytearray) -> memoryview:
        start = max(0, len(self._buf) - 3)
        self._buf += view
        if not _RESPONSE.startswith(bytes(self._buf[:7])):
            # Not a response head (the toxic came in the middle of a body): no framing.
            return self._give_up(out)
        end = self._buf.find(b"\r\n\r\n", start)
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                return self._give_up(out)
            return view[len(view) :]
        head = bytes(self._buf[: end + 4])
        rest = memoryview(bytes(self._buf[end + 4 :]))
        self._buf = bytearray()
        framing = _body_of(head)
        if framing is None:
            out += head
            self._mode = _Mode.PASS
            return rest
        mode, length = framing
        if mode is _Mode.HEAD:  # no body: nothing to wait for
            out += head
            return rest
        if not self._hold_heads:
            out += head
            self._mode, self._left = mode, length
            return rest
        self._held, self._body_mode, self._left = head, mode, length
        self._mode = _Mode.WAIT
        return rest

    def _line(self, view: memoryview, out: bytearray) -> memoryview:
        """A chunk-size line, or a trailer line; both pass on as they come."""
        start = max(0, len(self._buf) - 1)
        self._buf += view
        end = self._buf.find(b"\r\n", start)
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                return self._give_up(out)
            out += view
            return view[len(view) :]
        line = bytes(self._buf[:end])
        taken = end + 2 - (len(self._buf) - len(view))  # of `view`
        out += view[:taken]
        self._buf = bytearray()
        if self._mode is _Mode.TRAILERS:
            if not line:
                self._mode = _Mode.HEAD
            return view[taken:]
        size = _CHUNK_SIZE.match(line)
        if size is None:
            self._mode = _Mode.PASS
            return view[taken:]
        self._left = int(size.group(0), 16)
        self._mode = _Mode.CHUNK_DATA if self._left else _Mode.TRAILERS
        return view[taken:]

    def _give_up(self, out: bytearray) -> memoryview:
        out += self._buf
        self._buf = bytearray()
        self._mode = _Mode.PASS
        return memoryview(b"")


def _body_of(head: bytes) -> tuple[_Mode, int] | None:
    """How the body after `head` is framed: (HEAD, 0) for none, (LENGTH, n),
    (CHUNK_SIZE, 0), (TO_CLOSE, 0); None if the head is not a response head."""
    status = _STATUS.match(head)
    if status is None:
        return None
    code = int(status.group(1))
    if code < 200 or code in (204, 304):
        return (_Mode.HEAD, 0)
    chunked, length = False, None
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
    if chunked:
        return (_Mode.CHUNK_SIZE, 0)
    if length is not None:
        return (_Mode.LENGTH, length) if length > 0 else (_Mode.HEAD, 0)
    return (_Mode.TO_CLOSE, 0)
