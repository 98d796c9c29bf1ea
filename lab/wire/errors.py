"""Errors of the protocol core, named for who is to blame.

ProtocolError
 ├── LocalProtocolError    we (the caller of the core) asked for something illegal:
 │                         an illegal state transition, a call in the wrong state.
 │                         The state is left exactly as it was.
 └── RemoteProtocolError   the peer (server or proxy) sent something that breaks
                           the protocol: a malformed SSE field, a bad header.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error the sans-IO core raises."""


class LocalProtocolError(ProtocolError):
    """The local side broke the rules; nothing was changed."""


class RemoteProtocolError(ProtocolError):
    """The remote side broke the rules."""
