"""The header_hold toxic's framing of a connection's responses (lab.nemesis.framing), on
its own: a head is held until its first body byte and then goes with it; responses
without a body are never held; Content-Length and chunked bodies end where they end, so
the next response on a kept connection is held in turn; anything that is not a response
head passes untouched. Every stream is fed whole and byte by byte: the output is the
input, in both cases."""

from __future__ import annotations

import pytest

from lab.nemesis.framing import MAX_HEAD, HeaderHold

SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n"
ACCEPTED = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"


def feed_all(hold: HeaderHold, *pieces: bytes) -> list[bytes]:
    return [hold.feed(p) for p in pieces]


def test_a_head_waits_for_its_first_body_byte_and_goes_with_it() -> None:
    hold = HeaderHold()
    assert hold.feed(SSE) == b"" and hold.holding
    first = b"e\r\nid: 1\ndata: x\n\n\r\n"
    assert hold.feed(first) == SSE + first and not hold.holding


def test_no_body_no_wait_and_the_next_response_is_held_in_turn() -> None:
    hold = HeaderHold()
    assert hold.feed(ACCEPTED) == ACCEPTED  # a 202 with no body goes at once
    assert hold.feed(JSON) == b""
    assert hold.feed(b"[1,2]") == JSON + b"[1,2]"
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"
    assert hold.feed(no_content + SSE) == no_content  # the 204 goes; the SSE head waits
    assert hold.holding
    assert hold.feed(b"0\r\n\r\n") == SSE + b"0\r\n\r\n"  # an empty chunked body ends it
    assert hold.feed(JSON) == b"" and hold.holding  # the next response: held again


@pytest.mark.parametrize("by_byte", [False, True])
def test_what_goes_out_is_what_came_in(by_byte: bool) -> None:
    stream = (
        ACCEPTED
        + SSE
        + b"5\r\nhello\r\n"
        + b"3\r\n\n\n\n\r\n"
        + b"0\r\nX-Trailer: t\r\n\r\n"
        + JSON
        + b"[1,2]"
        + b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
        + b"to the end of the connection"
    )
    hold = HeaderHold()
    pieces = [stream[i : i + 1] for i in range(len(stream))] if by_byte else [stream]
    out = b"".join(feed_all(hold, *pieces)) + hold.release()
    assert out == stream


def test_release_gives_back_a_held_head_and_framing_stops() -> None:
    hold = HeaderHold()
    assert hold.feed(SSE) == b""
    assert hold.release() == SSE
    assert hold.feed(b"anything") == b"anything"


@pytest.mark.parametrize(
    "stream",
    [
        b"id: 7\ndata: a body already under way\n\n",  # the toxic came mid-stream
        b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\nbody",  # a head that cannot be read
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * MAX_HEAD,  # a head that never ends
    ],
)
def test_what_cannot_be_framed_passes_untouched(stream: bytes) -> None:
    hold = HeaderHold()
    out = hold.feed(stream)
    assert out == stream and not hold.holding


def test_without_holding_it_only_says_where_responses_end() -> None:
    # The buffer toxic's use: every byte goes on as it comes (nothing held for a body), and
    # it knows when every response begun is complete.
    track = HeaderHold(hold_heads=False)
    assert track.between_responses
    assert track.feed(JSON) == JSON and not track.between_responses  # its body is to come
    assert track.feed(b"[1,") == b"[1," and not track.between_responses
    assert track.feed(b"2]") == b"2]" and track.between_responses
    assert track.feed(SSE + b"5\r\nhello\r\n") == SSE + b"5\r\nhello\r\n" and not track.between_responses
    assert track.feed(b"0\r\n\r\n") == b"0\r\n\r\n" and track.between_responses
