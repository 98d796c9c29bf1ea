"""SSE decoder/encoder: WHATWG rules, the priming event, and split invariance."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.wire.errors import LocalProtocolError
from lab.wire.sse import SseDecoder, SseEvent, encode_comment, encode_event


def decode(raw: bytes) -> list[SseEvent]:
    d = SseDecoder()
    return d.feed(raw)


def decode_split(raw: bytes, cuts: list[int]) -> tuple[list[SseEvent], bool]:
    d = SseDecoder()
    out: list[SseEvent] = []
    prev = 0
    for c in sorted(set(cuts)):
        out += d.feed(raw[prev:c])
        prev = c
    out += d.feed(raw[prev:])
    return out, d.end_of_stream()


def fields(evs: list[SseEvent]) -> list[tuple[str | None, str, str | None, int | None]]:
    return [(e.id, e.data, e.event, e.retry) for e in evs]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"data: hello\n\n", [(None, "hello", None, None)]),
        (b"data:hello\n\n", [(None, "hello", None, None)]),
        (b"data:  two spaces\n\n", [(None, " two spaces", None, None)]),
        (b"data: a\ndata: b\n\n", [(None, "a\nb", None, None)]),
        (b"data: a\r\ndata: b\r\n\r\n", [(None, "a\nb", None, None)]),
        (b"data: a\rdata: b\r\r", [(None, "a\nb", None, None)]),
        (b"event: ping\ndata: x\n\n", [(None, "x", "ping", None)]),
        (b"id: 7\ndata: x\n\n", [("7", "x", None, None)]),
        (b"retry: 1500\ndata: x\n\n", [(None, "x", None, 1500)]),
        (b"retry: 15x0\ndata: x\n\n", [(None, "x", None, None)]),
        (b"retry: -1\ndata: x\n\n", [(None, "x", None, None)]),
        (b": a comment\ndata: x\n\n", [(None, "x", None, None)]),
        (b"data\n\n", [(None, "", None, None)]),
        (b"unknown: field\ndata: x\n\n", [(None, "x", None, None)]),
        (b"\xef\xbb\xbfdata: bom\n\n", [(None, "bom", None, None)]),
        (b"id: a\x00b\ndata: x\n\n", [(None, "x", None, None)]),
        (b"data: \xc3\xa9t\xc3\xa9\n\n", [(None, "été", None, None)]),
        (b"data: x\n", []),  # no blank line yet: nothing dispatched
        (b"\n\n\n", []),
        (b": only a comment\n\n", []),
        (b"event: lonely\n\n", []),
    ],
)
def test_whatwg_rules(raw: bytes, expected: list[tuple[str | None, str, str | None, int | None]]) -> None:
    assert fields(decode(raw)) == expected


def test_priming_event_is_surfaced_in_both_spellings() -> None:
    # `id` + empty `data:` line, and `id` alone: both are priming events, not dropped.
    evs = decode(b"id: p0\ndata:\n\nid: p1\n\n")
    assert [(e.id, e.data, e.is_priming, e.is_message) for e in evs] == [
        ("p0", "", True, False),
        ("p1", "", True, False),
    ]


def test_retry_only_block_is_surfaced_without_data() -> None:
    (ev,) = decode(b"retry: 3000\n\n")
    assert ev.retry == 3000 and ev.id is None and not ev.has_data and not ev.is_priming


def test_last_event_id_buffer_persists_across_blocks() -> None:
    evs = decode(b"id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n")
    assert [e.id for e in evs] == ["1", None, ""]
    assert [e.last_event_id for e in evs] == ["1", "1", ""]


def test_bom_only_stripped_at_start() -> None:
    evs = decode(b"data: a\n\n\xef\xbb\xbfdata: b\n\n")
    # the second BOM is part of a field name "\ufeffdata", an unknown field: ignored
    assert fields(evs) == [(None, "a", None, None)]


def test_bom_split_across_chunks() -> None:
    evs, _ = decode_split(b"\xef\xbb\xbfdata: x\n\n", [1, 2])
    assert fields(evs) == [(None, "x", None, None)]


def test_cr_then_lf_in_next_chunk_is_one_line_ending() -> None:
    evs, _ = decode_split(b"data: a\r\n\r\n", [8])
    assert fields(evs) == [(None, "a", None, None)]
    evs, _ = decode_split(b"data: a\r\r\n", [8])  # CR | CR LF: two line endings, one event
    assert fields(evs) == [(None, "a", None, None)]


def test_end_of_stream_reports_a_cut_mid_event() -> None:
    d = SseDecoder()
    assert d.feed(b"id: 1\ndata: complete\n\nid: 2\ndata: cut") != []
    assert d.end_of_stream() is True
    d2 = SseDecoder()
    d2.feed(b"data: x\n\n")
    assert d2.end_of_stream() is False


def test_invalid_utf8_becomes_replacement_character() -> None:
    (ev,) = decode(b"data: \xff\n\n")
    assert ev.data == "\ufffd"


def test_encoder_round_trip_and_validation() -> None:
    raw = encode_event("line1\nline2\r\nline3", id="e1", event="message", retry=250)
    (ev,) = decode(raw)
    assert (ev.id, ev.data, ev.event, ev.retry) == ("e1", "line1\nline2\nline3", "message", 250)
    assert encode_event("", id="p") == b"id: p\ndata:\n\n"
    assert decode(encode_comment("keepalive")) == []
    with pytest.raises(LocalProtocolError):
        encode_event("x", id="bad\nid")
    with pytest.raises(LocalProtocolError):
        encode_event("x", id="nul\x00")
    with pytest.raises(LocalProtocolError):
        encode_event()
    with pytest.raises(LocalProtocolError):
        encode_event("x", retry=-5)


# --- property: any chunking of any stream yields the same events --------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n\x00"), max_size=12
)
_line_end = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    """Streams mixing every field, comments, all line endings, a BOM and a cut tail."""
    parts: list[str] = []
    if draw(st.booleans()):
        parts.append("\ufeff")
    for _ in range(draw(st.integers(0, 6))):
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["data", "id", "event", "retry", "comment", "bare", "junk"]))
            if kind == "comment":
                line = ":" + draw(_text)
            elif kind == "bare":
                line = draw(st.sampled_from(["data", "id", "event", "retry"]))
            elif kind == "retry":
                line = (
                    "retry:"
                    + draw(st.sampled_from(["", " "]))
                    + draw(st.sampled_from(["0", "15", "3000", "12a", "", "a1", "99999"]))
                )
            elif kind == "junk":
                line = draw(_text)
            else:
                line = kind + ":" + draw(st.sampled_from(["", " ", "  "])) + draw(_text)
            parts.append(line + draw(_line_end))
        parts.append(draw(_line_end))
    if draw(st.booleans()):
        parts.append("data: unterminated")
    return "".join(parts).encode("utf-8")


@given(sse_streams(), st.lists(st.integers(0, 400), max_size=12))
def test_any_split_gives_identical_events(raw: bytes, cuts: list[int]) -> None:
    whole, whole_cut = decode_split(raw, [])
    split, split_cut = decode_split(raw, [c for c in cuts if c <= len(raw)])
    assert split == whole
    assert split_cut == whole_cut


@given(sse_streams())
def test_byte_by_byte_gives_identical_events(raw: bytes) -> None:
    whole, _ = decode_split(raw, [])
    bytewise, _ = decode_split(raw, list(range(len(raw) + 1)))
    assert bytewise == whole


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.text(alphabet="abcXYZ019._-", min_size=1, max_size=20)),
            st.text(
                alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\x00"),
                max_size=30,
            ),
        ),
        max_size=8,
    )
)
def test_encode_then_decode_is_identity(events: list[tuple[str | None, str]]) -> None:
    raw = b"".join(encode_event(data, id=eid) for eid, data in events)
    decoded = decode(raw)
    assert [(e.id, e.data) for e in decoded] == [(eid, data) for eid, data in events]


class LineByLine(SseDecoder):
    """The decoder without its fast path for whole `id` + `data` blocks."""

    def _feed_blocks(self, text: str) -> list[SseEvent]:
        return self._feed_lines(text)


_simple_block = st.builds(
    lambda i, d: f"id: {i}\ndata: {d}\n\n",
    st.text(alphabet="e1.aXZ-_09 ", max_size=14) | st.just("nul\x00id"),
    # Spaces, tabs, quotes, NUL and non-ASCII where the fast path must keep them exactly.
    st.text(alphabet=' a{}":\t\x00éあ', max_size=20),
)
_other_block = st.sampled_from(
    [
        "id:x\ndata:y\n\n",
        "data: only\n\n",
        ": keepalive\n\n",
        "id: a\ndata: b\ndata: c\n\n",
        "retry: 5\n\n",
        "\n",
        "id: p\ndata:\n\n",
        "event: e\nid: q\ndata: r\n\n",
        "id: a\r\ndata: b\r\n\r\n",
    ]
)
# Mostly the blocks MCP servers send (the fast path's business), now and then another shape.
_mcp_block = st.one_of(_simple_block, _simple_block, _simple_block, _simple_block, _other_block)


@given(st.lists(_mcp_block, max_size=12), st.lists(st.integers(0, 300), max_size=8))
def test_fast_path_decodes_exactly_like_the_line_rules(blocks: list[str], cuts: list[int]) -> None:
    raw = "".join(blocks).encode()
    fast, slow = SseDecoder(), LineByLine()
    got_fast: list[SseEvent] = []
    got_slow: list[SseEvent] = []
    prev = 0
    for c in [*sorted({c for c in cuts if c <= len(raw)}), len(raw)]:
        got_fast += fast.feed(raw[prev:c])
        got_slow += slow.feed(raw[prev:c])
        prev = c
    assert got_fast == got_slow
    assert fast.end_of_stream() == slow.end_of_stream()
