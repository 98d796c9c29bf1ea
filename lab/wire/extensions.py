"""Names the lab adds to MCP on the wire. Every part of a run (client, server, proxy,
checker) agrees on them; a target that knows none of them still works, only with less
cooperation (docs/targets.md says what each gate needs from a target).
"""

from __future__ import annotations

from typing import Final

EVENT_ID_CAPABILITY: Final = "mcp-lab/event-ids"
"""`capabilities.experimental[EVENT_ID_CAPABILITY] = {"scheme": "e1"}` in an InitializeResult
tells the client that event IDs are structured (`lab.wire.event_ids`)."""

LAB_CONN_HEADER: Final = "x-lab-conn"
"""`<client-id>:<conn-id>` on every request of a lab client (see docs/ledgers.md)."""

IDEMPOTENCY_META: Final = "mcp-lab/idempotency-key"
"""`params._meta[IDEMPOTENCY_META]` of a tools/call: the logical operation's key. In a
`tools/list` entry, `_meta[IDEMPOTENCY_META]: true` is the server's word that it performs
a call of that tool once per key: re-sending it with the same key is safe, whatever its
annotations say (the retry rule's "an idempotency key the server honours")."""

LAB_FAULT_HEADER: Final = "x-lab-fault"
"""On a response the lab's proxy changed by a fault it injected on purpose (the request's
Origin, token, session or version rewritten; an answer of its own, such as a storm's 429):
the fault kinds, comma-separated (`rewrite_origin`). The lab's clients count a call that
failed after such a response as an injected failure, not an unexpected one; nothing else
reads it, and a client under test may ignore it (docs/faults.md)."""
