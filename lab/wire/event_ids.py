"""Event IDs that locate their stream and cannot be forged, and cursor classification.

The reference server mints every SSE event ID with `EventIdCodec.mint`:

    e1.<session-tag>.<generation>.<stream-id>.<sequence>.<digest>.<mac>

- `session-tag`: 11 characters derived from the session ID by a one-way hash (the raw ID
  never appears). A client can compute the tag of its own session, so it can tell an
  event of a foreign session without knowing any server secret.
- `generation`: the server's cursor-index generation (rollout/rollback epoch), an integer.
- `stream-id`: the server's ID of the stream the event was sent on (`[A-Za-z0-9_-]`).
- `sequence`: position of the event in that stream, from 0 (the priming event) upwards,
  contiguous: a gap means an event was lost.
- `digest`: the first 12 hex digits of SHA-256 of the event's `data`, binding the ID to
  its content (a payload swapped under a genuine ID is detected by anyone).
- `mac`: keyed HMAC-SHA256 over everything before it, truncated to 96 bits, so the
  server detects a forged or altered cursor.

IDs are unique across a session because (stream-id, sequence) is. Servers that are not
ours use opaque IDs; for those the client's durable inbox remembers which ID it accepted on
which stream (`classify_opaque`), and only an ID seen on a stream may be its cursor.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
from collections.abc import Container

from lab.wire.errors import LocalProtocolError
from lab.wire.frozen import frozen_record

ID_SCHEME = "e1"
DIGEST_PREFIX_LEN = 12
_STREAM_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
_EVENT_ID = re.compile(
    r"e1\.([A-Za-z0-9_-]{11})\.(0|[1-9][0-9]{0,9})\.([A-Za-z0-9_-]{1,40})\.(0|[1-9][0-9]{0,15})"
    r"\.([0-9a-f]{12})\.([A-Za-z0-9_-]{16})"
)


def message_digest(data: str) -> str:
    """SHA-256 (hex) of an event's data as sent: the digest in dedup keys and ledgers."""
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def session_tag(session_id: str) -> str:
    """A one-way, non-secret tag of a session ID (64 bits of SHA-256, base64url)."""
    raw = hashlib.sha256(b"mcp-lab/session-tag\x00" + session_id.encode("utf-8")).digest()[:8]
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


class CursorVerdict(enum.StrEnum):
    """What an event ID (as an incoming event's ID, or as a `Last-Event-ID`) turned out to be."""

    VALID = "valid"
    MALFORMED = "malformed"
    """Not an ID of our scheme, or garbage."""
    TAMPERED = "tampered"
    """Our scheme, but the MAC (server side) or the content digest does not match."""
    FOREIGN_SESSION = "foreign_session"
    OTHER_GENERATION = "other_generation"
    OTHER_STREAM = "other_stream"
    UNSEEN = "unseen"
    """An opaque ID never seen on any stream of this session."""


@frozen_record
class ParsedEventId:
    """The fields of an `e1` event ID (structure only; the MAC is not checked here)."""

    session_tag: str
    generation: int
    stream_id: str
    sequence: int
    digest_prefix: str
    mac: str
    raw: str

    @property
    def signed_part(self) -> str:
        return self.raw[: self.raw.rfind(".")]


def parse_event_id(raw: str) -> ParsedEventId | None:
    """Parse an `e1` ID; None if it is not one (an opaque ID, or garbage)."""
    m = _EVENT_ID.fullmatch(raw)
    if m is None:
        return None
    tag, gen, stream, seq, dig, mac = m.groups()
    return ParsedEventId(tag, int(gen), stream, int(seq), dig, mac, raw)


class EventIdCodec:
    """Mints and verifies event IDs with a server-side secret key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise LocalProtocolError("event-ID MAC key must be at least 16 bytes")
        # HMAC-SHA256 (RFC 2104) from the two padded key states, copied per ID: the same
        # MAC as hmac.digest in under half its time (each call of it sets the key up anew).
        block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def _mac(self, signed: str) -> str:
        inner = self._inner.copy()
        inner.update(signed.encode("ascii"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        d = outer.digest()[:12]
        return base64.urlsafe_b64encode(d).decode("ascii")

    def mint(
        self,
        tag: str,
        generation: int,
        stream_id: str,
        sequence: int,
        data: str,
        *,
        digest: str | None = None,
    ) -> str:
        """The ID of event `sequence` of a stream; `digest` (the data's `message_digest`)
        may be passed when the caller has it already."""
        if not _STREAM_ID.fullmatch(stream_id):
            raise LocalProtocolError(f"stream ID must match [A-Za-z0-9_-]{{1,40}}: {stream_id!r}")
        if generation < 0 or sequence < 0:
            raise LocalProtocolError("generation and sequence must be >= 0")
        dig = (digest or message_digest(data))[:DIGEST_PREFIX_LEN]
        signed = f"{ID_SCHEME}.{tag}.{generation}.{stream_id}.{sequence}.{dig}"
        return f"{signed}.{self._mac(signed)}"

    def verify(self, parsed: ParsedEventId) -> bool:
        return hmac.compare_digest(self._mac(parsed.signed_part), parsed.mac)

    def classify(
        self,
        raw: str,
        *,
        session_tag: str,
        generations: Container[int],
        stream_id: str | None = None,
    ) -> tuple[CursorVerdict, ParsedEventId | None]:
        """Server side: is `raw` a cursor this session may resume from (optionally on `stream_id`)?"""
        parsed = parse_event_id(raw)
        if parsed is None:
            return CursorVerdict.MALFORMED, None
        if not self.verify(parsed):
            return CursorVerdict.TAMPERED, parsed
        return _classify_fields(parsed, session_tag, generations, stream_id), parsed


def _classify_fields(
    parsed: ParsedEventId, tag: str, generations: Container[int] | None, stream_id: str | None
) -> CursorVerdict:
    if not hmac.compare_digest(parsed.session_tag, tag):
        return CursorVerdict.FOREIGN_SESSION
    if generations is not None and parsed.generation not in generations:
        return CursorVerdict.OTHER_GENERATION
    if stream_id is not None and parsed.stream_id != stream_id:
        return CursorVerdict.OTHER_STREAM
    return CursorVerdict.VALID


def classify_structured(
    parsed: ParsedEventId,
    *,
    session_tag: str,
    generation: int | None,
    stream_id: str | None,
    data: str | None = None,
    digest: str | None = None,
) -> CursorVerdict:
    """Client side (no key): check an `e1` ID against what the client knows.

    `generation`/`stream_id` None means "not bound yet": anything is accepted there.
    With `data`, the digest in the ID must match the content (else TAMPERED); `digest`
    (the data's `message_digest`) may be passed when the caller has it already, so the
    content is not hashed a second time.
    """
    gens = None if generation is None else (generation,)
    verdict = _classify_fields(parsed, session_tag, gens, stream_id)
    if data is not None and digest is None:
        digest = message_digest(data)
    digest_ok = digest is None or digest[:DIGEST_PREFIX_LEN] == parsed.digest_prefix
    if verdict is CursorVerdict.VALID and not digest_ok:
        return CursorVerdict.TAMPERED
    return verdict


def post_stream_id(tag: str, request_id: int | str) -> str:
    """The stream ID the reference server gives the POST stream of `request_id` in a session.

    Derived, not random, so a client that knows its session can check that an event on
    the stream of its request carries that stream's ID from the very first event: a
    crossed ID cannot poison the binding of a new stream. (Request IDs are unique within
    a session, so this ID is too.) Standalone GET streams get IDs starting with `g`.
    """
    key = f"{tag}\x00{type(request_id).__name__}\x00{request_id}".encode()
    digest = hashlib.sha256(b"mcp-lab/post-stream\x00" + key).digest()[:9]
    return "p" + base64.urlsafe_b64encode(digest).decode("ascii")


def classify_opaque(stream_key: str, seen_on: str | None) -> CursorVerdict:
    """For servers whose IDs we cannot read: an ID is a valid cursor of a stream only if
    it was seen (accepted) on that stream. `seen_on` is where the ID was seen, if anywhere
    (the durable inbox remembers this across restarts)."""
    if seen_on is None:
        return CursorVerdict.UNSEEN
    return CursorVerdict.VALID if seen_on == stream_key else CursorVerdict.OTHER_STREAM
