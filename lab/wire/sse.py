"""Server-Sent Events: an incremental decoder and an encoder, with no I/O.

The decoder follows the WHATWG "event stream interpretation" rules, with one deliberate
difference that MCP needs: a block that carries an `id` (or a `retry`) but no `data`
is *surfaced* (the WHATWG algorithm only updates the last-event-ID buffer and dispatches
nothing). MCP's priming event is exactly such a block — an event ID and empty data — and
a client that drops it has no cursor to resume with.

Bytes go in, in any chunking; the same events come out. Rules kept:
- UTF-8, decoded incrementally (a multi-byte character split across chunks is fine);
  invalid bytes become U+FFFD as the standard says.
- One leading byte-order mark is ignored.
- Lines end with CRLF, LF or CR; a CR at the end of one chunk followed by LF at the start
  of the next is one line ending.
- `:` starts a comment; `field: value` loses one leading space of the value; a line
  without a colon is a field with an empty value.
- `data` lines are joined with LF; `event` sets the type; `retry` counts only if it is
  all ASCII digits; an `id` whose value contains NUL is ignored.
- A block is dispatched at a blank line; an unterminated block at end of stream is
  discarded (and counted, so a caller can tell a cut mid-event from a clean end).
"""

from __future__ import annotations

import codecs
import re

from lab.wire.errors import LocalProtocolError
from lab.wire.frozen import frozen_record

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SIMPLE_BLOCK = re.compile(r"id: ([^\n\x00]*)\ndata: ([^\n]*)")
"""The block MCP servers send for an event: exactly what the line-by-line rules make of it."""


@frozen_record
class SseEvent:
    """One dispatched SSE block.

    `id` is the value of an `id` field in *this* block (None if it had none).
    `last_event_id` is the WHATWG last-event-ID buffer after this block: what a browser
    would send as `Last-Event-ID` on reconnect.
    """

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None
    has_data: bool = True
    last_event_id: str = ""

    @property
    def is_priming(self) -> bool:
        """An event ID with empty data: MCP's 'prime the client to reconnect' event."""
        return self.id is not None and self.data == ""

    @property
    def is_message(self) -> bool:
        """Carries a (non-empty) payload, i.e. a JSON-RPC message in MCP."""
        return self.data != ""


class SseDecoder:
    """Incremental SSE decoder: `feed(bytes) -> list[SseEvent]`, then `end_of_stream()`."""

    __slots__ = (
        "_block_chars",
        "_bom_checked",
        "_buf",
        "_data",
        "_decoder",
        "_event",
        "_has_data",
        "_id",
        "_last_event_id",
        "_retry",
        "_skip_lf",
        "_touched",
    )

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._bom_checked = False
        self._skip_lf = False
        self._buf = ""
        self._last_event_id = ""
        self._reset_block()

    def _reset_block(self) -> None:
        self._block_chars = 0
        self._data: list[str] = []
        self._has_data = False
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._touched = False

    @property
    def last_event_id(self) -> str:
        """The WHATWG last-event-ID buffer: survives blocks that carry no `id`."""
        return self._last_event_id

    @property
    def in_block(self) -> bool:
        """True while bytes of an unfinished block are buffered."""
        return self._touched or bool(self._buf)

    @property
    def pending_chars(self) -> int:
        """Characters held for the unfinished block: its data lines so far and its
        unfinished line (a bound on what a sender can make the decoder hold)."""
        return len(self._buf) + self._block_chars

    @property
    def at_boundary(self) -> bool:
        """True when nothing of the stream is held back: no unfinished block, and no partial
        UTF-8 character. The bytes fed so far are then exactly the events returned so far
        (and comments): a proxy may forward them as they came."""
        return not (self._touched or self._buf) and not self._decoder.getstate()[0]

    def feed(self, chunk: bytes) -> list[SseEvent]:
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if not self._bom_checked:
            if self._buf == "" and text and text[0] == "\ufeff":
                text = text[1:]
            if text or self._buf:
                self._bom_checked = True
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        if not text:
            return []
        if not self._buf and not self._touched and "\r" not in text:
            return self._feed_blocks(text)
        return self._feed_lines(text)

    def _feed_blocks(self, text: str) -> list[SseEvent]:
        """Fast path, at a block boundary with LF line ends: whole `id: X` + `data: Y` blocks
        (what MCP servers send) become events with one regex match each; the first block of
        any other shape, and everything after it, goes the general way."""
        blocks = text.split("\n\n")
        tail = blocks.pop()
        events: list[SseEvent] = []
        for i, block in enumerate(blocks):
            m = _SIMPLE_BLOCK.fullmatch(block)
            if m is None:
                return events + self._feed_lines("\n\n".join(blocks[i:]) + "\n\n" + tail)
            eid = m.group(1)
            self._last_event_id = eid
            events.append(SseEvent(data=m.group(2), id=eid, last_event_id=eid))
        if tail:
            events += self._feed_lines(tail)
        return events

    def _feed_lines(self, text: str) -> list[SseEvent]:
        parts = _LINE_BREAK.split(self._buf + text)
        self._buf = parts.pop()
        if self._buf == "" and text.endswith("\r"):
            # The last line ended with a bare CR: an LF opening the next chunk is part of it.
            self._skip_lf = True
        events: list[SseEvent] = []
        for line in parts:
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        return events

    def end_of_stream(self) -> bool:
        """Flush the UTF-8 decoder; True if an unfinished block (a cut mid-event) was discarded."""
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._buf += tail
        discarded = self._touched or bool(self._buf)
        self._buf = ""
        self._reset_block()
        return discarded

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line[0] == ":":
            return None
        colon = line.find(":")
        if colon == -1:
            field, value = line, ""
        else:
            field = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == " ":
                value = value[1:]
        if field == "data":
            self._block_chars += len(value)
            self._data.append(value)
            self._has_data = True
            self._touched = True
        elif field == "id":
            if "\x00" not in value:
                self._id = value
                self._last_event_id = value
                self._touched = True
        elif field == "event":
            self._event = value
            self._touched = True
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
            self._touched = True
        return None

    def _dispatch(self) -> SseEvent | None:
        if not (self._has_data or self._id is not None or self._retry is not None):
            self._reset_block()
            return None
        ev = SseEvent(
            data="\n".join(self._data),
            event=self._event,
            id=self._id,
            retry=self._retry,
            has_data=self._has_data,
            last_event_id=self._last_event_id,
        )
        self._reset_block()
        return ev


def _check_field(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise LocalProtocolError(f"SSE {name} must not contain a line break: {value!r}")
    if name == "id" and "\x00" in value:
        raise LocalProtocolError("SSE id must not contain NUL (receivers ignore such ids)")


def encode_event(
    data: str | None = None,
    *,
    id: str | None = None,
    event: str | None = None,
    retry: int | None = None,
) -> bytes:
    """One SSE block. `data=""` with an `id` is a priming event (`id: X` + an empty `data:`).

    `data=None` writes no data line at all (e.g. a block with only `retry`).
    Multi-line data (any of CRLF, CR, LF) becomes several `data:` lines.
    """
    out: list[str] = []
    if id is not None:
        _check_field("id", id)
        out.append(f"id: {id}\n")
    if event is not None:
        _check_field("event", event)
        out.append(f"event: {event}\n")
    if retry is not None:
        if retry < 0:
            raise LocalProtocolError(f"SSE retry must be >= 0 ms, got {retry}")
        out.append(f"retry: {retry}\n")
    if data is not None:
        if data == "":
            out.append("data:\n")
        elif "\n" not in data and "\r" not in data:
            out.append(f"data: {data}\n")  # the common case (compact JSON): no split needed
        else:
            out.extend(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    if not out:
        raise LocalProtocolError("an SSE block needs at least one of data, id or retry")
    out.append("\n")
    return "".join(out).encode("utf-8")


def encode_comment(text: str = "") -> bytes:
    """A comment block (`: text`), e.g. a keep-alive; receivers dispatch nothing for it."""
    _check_field("comment", text)
    return f": {text}\n\n".encode() if text else b":\n\n"
