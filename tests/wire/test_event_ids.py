"""Event-ID codec: uniqueness, stream location, tamper evidence, cursor classification."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.wire.errors import LocalProtocolError
from lab.wire.event_ids import (
    CursorVerdict,
    EventIdCodec,
    classify_opaque,
    classify_structured,
    message_digest,
    parse_event_id,
    post_stream_id,
    session_tag,
)

KEY = b"k" * 32
codec = EventIdCodec(KEY)
TAG_A = session_tag("session-A-" + "x" * 30)
TAG_B = session_tag("session-B-" + "y" * 30)


def test_minted_id_carries_its_fields() -> None:
    eid = codec.mint(TAG_A, 3, "pStream1", 42, '{"jsonrpc":"2.0"}')
    p = parse_event_id(eid)
    assert p is not None
    assert (p.session_tag, p.generation, p.stream_id, p.sequence) == (TAG_A, 3, "pStream1", 42)
    assert codec.verify(p)
    assert "session-A" not in eid  # the raw session ID never appears


@pytest.mark.parametrize(
    ("raw", "kwargs", "verdict"),
    [
        ("garbage", {}, CursorVerdict.MALFORMED),
        ("", {}, CursorVerdict.MALFORMED),
        ("e1.short", {}, CursorVerdict.MALFORMED),
        ("OWN", {}, CursorVerdict.VALID),
        ("OWN", {"stream_id": "s1"}, CursorVerdict.VALID),
        ("OWN", {"stream_id": "s2"}, CursorVerdict.OTHER_STREAM),
        ("OWN", {"session_tag": TAG_B}, CursorVerdict.FOREIGN_SESSION),
        ("OWN", {"generations": (2,)}, CursorVerdict.OTHER_GENERATION),
        ("FORGED_SEQ", {}, CursorVerdict.TAMPERED),
        ("FORGED_STREAM", {}, CursorVerdict.TAMPERED),
        ("OTHER_KEY", {}, CursorVerdict.TAMPERED),
    ],
)
def test_server_classifies_cursors(raw: str, kwargs: dict[str, object], verdict: CursorVerdict) -> None:
    own = codec.mint(TAG_A, 1, "s1", 5, "data")
    samples = {
        "OWN": own,
        "FORGED_SEQ": own.replace(".5.", ".6."),
        "FORGED_STREAM": own.replace(".s1.", ".s2."),
        "OTHER_KEY": EventIdCodec(b"z" * 32).mint(TAG_A, 1, "s1", 5, "data"),
    }
    args: dict[str, object] = {"session_tag": TAG_A, "generations": (1,), "stream_id": None}
    args.update(kwargs)
    got, _ = codec.classify(samples.get(raw, raw), **args)  # type: ignore[arg-type]
    assert got is verdict


def test_client_side_classification_detects_swapped_content() -> None:
    eid = codec.mint(TAG_A, 1, "s1", 1, "original")
    p = parse_event_id(eid)
    assert p is not None
    ok = classify_structured(p, session_tag=TAG_A, generation=1, stream_id="s1", data="original")
    swapped = classify_structured(p, session_tag=TAG_A, generation=1, stream_id="s1", data="swapped")
    unbound = classify_structured(p, session_tag=TAG_A, generation=None, stream_id=None)
    assert (ok, swapped, unbound) == (CursorVerdict.VALID, CursorVerdict.TAMPERED, CursorVerdict.VALID)
    # The content's digest, when the caller has it, decides the same way as the content.
    by_digest = [
        classify_structured(p, session_tag=TAG_A, generation=1, stream_id="s1", digest=message_digest(d))
        for d in ("original", "swapped")
    ]
    assert by_digest == [CursorVerdict.VALID, CursorVerdict.TAMPERED]


def test_opaque_ids_are_valid_only_on_the_stream_they_were_seen() -> None:
    assert classify_opaque("post:1", "post:1") is CursorVerdict.VALID
    assert classify_opaque("post:1", "get:1") is CursorVerdict.OTHER_STREAM
    assert classify_opaque("post:1", None) is CursorVerdict.UNSEEN


def test_post_stream_ids_are_derived_and_distinct() -> None:
    a1, a2, b1 = post_stream_id(TAG_A, 1), post_stream_id(TAG_A, 2), post_stream_id(TAG_B, 1)
    assert len({a1, a2, b1}) == 3
    assert post_stream_id(TAG_A, 1) == a1
    assert post_stream_id(TAG_A, "1") != a1  # the string ID "1" is another request than 1
    assert a1.startswith("p")


def test_codec_rejects_bad_input() -> None:
    with pytest.raises(LocalProtocolError):
        EventIdCodec(b"short")
    with pytest.raises(LocalProtocolError):
        codec.mint(TAG_A, 0, "bad.stream", 0, "")
    with pytest.raises(LocalProtocolError):
        codec.mint(TAG_A, -1, "s", 0, "")


@given(
    st.lists(
        st.tuples(st.sampled_from(["s1", "s2", "pX_-9"]), st.integers(0, 10**6), st.text(max_size=20)),
        min_size=1,
        max_size=30,
        unique_by=lambda t: (t[0], t[1]),
    )
)
def test_ids_unique_per_stream_and_sequence(events: list[tuple[str, int, str]]) -> None:
    ids = [codec.mint(TAG_A, 0, s, n, d) for s, n, d in events]
    assert len(set(ids)) == len(ids)
    for (s, n, _), eid in zip(events, ids, strict=True):
        p = parse_event_id(eid)
        assert p is not None and (p.stream_id, p.sequence) == (s, n)


@given(st.text(max_size=80))
def test_parse_never_crashes_on_garbage(raw: str) -> None:
    verdict, _ = codec.classify(raw, session_tag=TAG_A, generations=(0,))
    assert verdict in (CursorVerdict.MALFORMED, CursorVerdict.TAMPERED)


@given(key=st.binary(min_size=16, max_size=130), signed=st.text(alphabet="abcXYZ019._-", max_size=80))
def test_the_mac_is_hmac_sha256_for_every_key_length(key: bytes, signed: str) -> None:
    # The codec builds HMAC from the padded key states (for speed); keys past the 64-byte
    # block are hashed first, as RFC 2104 says: the same 12 bytes as the library's HMAC.
    import base64
    import hmac

    want = base64.urlsafe_b64encode(hmac.digest(key, signed.encode("ascii"), "sha256")[:12]).decode()
    assert EventIdCodec(key)._mac(signed) == want
