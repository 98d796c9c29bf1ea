"""Pseudonyms for secrets: no raw session ID or token is ever written anywhere.

Every component of a run gets the same per-run key, so the checker can join a client's
records with the server's and the proxy's by the pseudonym without anyone holding the
raw value. HMAC (not a bare hash) so that pseudonyms of different runs cannot be linked.
"""

from __future__ import annotations

import hashlib
import hmac
import re


class Redactor:
    """Pseudonyms under one run key.

    `cache_size` bounds a memo of session pseudonyms for callers that ask for the same
    session over and over (a client, the proxy on every request); a caller that asks once
    per session (the server, which keeps the pseudonym on its session) passes 0.
    """

    __slots__ = ("_cache", "_cache_size", "_key")

    def __init__(self, key: bytes, *, cache_size: int = 100_000) -> None:
        if len(key) < 16:
            raise ValueError("redaction key must be at least 16 bytes")
        self._key = key
        self._cache_size = cache_size
        self._cache: dict[str, str] = {}

    def _mac(self, kind: bytes, value: str) -> str:
        return hmac.new(self._key, kind + b"\x00" + value.encode("utf-8"), hashlib.sha256).hexdigest()[:20]

    def session(self, session_id: str | None) -> str | None:
        """`s_` + 80 bits of HMAC of the session ID (None stays None)."""
        if session_id is None:
            return None
        hit = self._cache.get(session_id)
        if hit is None:
            hit = "s_" + self._mac(b"session", session_id)
            if self._cache_size > 0:
                if len(self._cache) >= self._cache_size:
                    self._cache.clear()
                self._cache[session_id] = hit
        return hit

    def token(self, token: str | None) -> str | None:
        """`t_` + 80 bits of HMAC of a bearer token."""
        return None if token is None else "t_" + self._mac(b"token", token)


# --- secrets in free text: logs, tracebacks, third-party output ------------------------

_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",)\]}]+")
_SECRET_HEADER = re.compile(
    r"(?i)((?:mcp-session-id|authorization|proxy-authorization|set-cookie|cookie)['\"]?\s*[:=,]\s*b?['\"]?)"
    r"[^'\"\r\n]+"
)
_SECRET_HINT = re.compile(r"(?i)bearer|session-id|authorization|cookie")
REDACTED = "[redacted]"


def scrub(text: str) -> str:
    """`text` with every bearer token and the value of every session-ID, authorization and
    cookie header replaced by `[redacted]`, in whatever form a header is printed (`name:
    value`, `('name', 'value')`, `(b'name', b'value')`, `"name": "value"`). For text the lab
    does not write itself (a third party's traceback repr of a request): what the lab
    writes carries pseudonyms (`Redactor`) and never a raw value."""
    if not _SECRET_HINT.search(text):
        return text  # (most lines: one look)
    return _SECRET_HEADER.sub(r"\1" + REDACTED, _BEARER.sub(r"\1" + REDACTED, text))
