"""Which messages a party may send only if a capability was declared at initialize (pure).

Both sides "MUST only use capabilities that were successfully negotiated" (every revision,
§ Lifecycle, Operation). The server declares its capabilities in `InitializeResult`, the
client in the `initialize` request's params. A notification or request the server sends
that needs a capability nobody declared is a server violation the wire shows by itself:
the method names the capability (`GATED`). Methods that need none (`notifications/progress`,
`notifications/cancelled`, `ping`, ...) are not listed.

A capability is named by its path in the capabilities object: `logging` (declared when
the key is present, whatever its value), `tools.listChanged` (declared when true).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from lab.wire.revisions import META_CLIENT_CAPABILITIES

GATED: Final[dict[str, tuple[str, str]]] = {
    "notifications/message": ("server", "logging"),
    "notifications/resources/updated": ("server", "resources.subscribe"),
    "notifications/resources/list_changed": ("server", "resources.listChanged"),
    "notifications/tools/list_changed": ("server", "tools.listChanged"),
    "notifications/prompts/list_changed": ("server", "prompts.listChanged"),
    "sampling/createMessage": ("client", "sampling"),
    "elicitation/create": ("client", "elicitation"),
    "roots/list": ("client", "roots"),
}
"""Method the server sends -> (whose declaration allows it, the capability's path)."""

_KEYED: Final = re.compile(r'"method"\s*:\s*"(?:' + "|".join(re.escape(m) for m in GATED) + ')"')
"""A gated name as the value of a `"method"` key (confirmed by parsing: it may be nested)."""


def gated_method(data: str) -> str | None:
    """The gated method of the JSON-RPC message in `data` (one SSE event's data), or None:
    not a message, or a method that needs no capability.

    On the proxy's hot path (every event), so cheap first: a progress notification (most
    events) is dismissed by one substring test (~0.1 µs; a gated message that quotes that
    name in a value is missed, never invented), anything else by one regex search; only a
    hit is parsed."""
    if '"notifications/progress"' in data or _KEYED.search(data) is None:
        return None
    return _confirmed(data)


def _confirmed(data: str) -> str | None:
    """The message's own `method`, if it is gated (the name found may sit in a value)."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return None
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) and method in GATED else None


def declared_paths(capabilities: object) -> list[str]:
    """The capabilities an object declares, as sorted paths: each top-level key present
    (`logging`, `tools`, ...) and each of its sub-flags that is true (`tools.listChanged`).
    Anything that is not an object declares nothing."""
    if not isinstance(capabilities, Mapping):
        return []
    out: list[str] = []
    for key, value in capabilities.items():
        if not isinstance(key, str):
            continue
        out.append(key)
        if isinstance(value, Mapping):
            out.extend(f"{key}.{sub}" for sub, flag in value.items() if isinstance(sub, str) and flag is True)
    return sorted(out)


def initialize_capabilities(body: object) -> list[str] | None:
    """The capabilities a JSON-RPC `initialize` request (`params.capabilities`) or its
    result (`result.capabilities`) declares; None if `body` is neither. The modern era's
    (2026-07-28) `server/discover` the same: its result's `capabilities` are the server's,
    and its request declares the client's in `params._meta` (as every modern request does)."""
    if not isinstance(body, Mapping):
        return None
    holder: Any = body.get("params") if "method" in body else body.get("result")
    if not isinstance(holder, Mapping):
        return None
    if "capabilities" not in holder:
        meta = holder.get("_meta") if "method" in body else None
        if isinstance(meta, Mapping) and META_CLIENT_CAPABILITIES in meta:
            return declared_paths(meta[META_CLIENT_CAPABILITIES])
        return None
    return declared_paths(holder["capabilities"])


def needs(method: str) -> tuple[str, str] | None:
    """(whose declaration, which capability) a server-sent `method` needs, or None."""
    return GATED.get(method)
