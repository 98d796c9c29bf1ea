"""What the target sent past the lab's bounds (docs/targets.md): the clients' connections
closed on a message over their bound (client `http_exchanges` with `error`
`message_too_large`) and the streams the proxy gave up on an event over its own (tap
`oversize` records). Each is the target's doing, said in the report's notes; none is a
gate of its own (gate 5 sees the recoveries that follow)."""

from __future__ import annotations

from lab.checker.context import Context
from lab.checker.inputs.load import MissingInput


def bound_notes(ctx: Context) -> list[str]:
    """One note per bound that was hit, with its count (none when neither was)."""
    notes: list[str] = []
    try:
        ex = ctx.data.client_table("http_exchanges")
        closed = int((ex["error"] == "message_too_large").sum())
    except (MissingInput, KeyError):
        closed = 0
    if closed:
        notes.append(
            f"the target sent messages too large to hold: the lab's clients closed {closed} connection(s) "
            "on an SSE event or JSON body over their bound (16 MiB by default; error message_too_large) "
            "and resumed them"
        )
    try:
        over = ctx.data.tap_records("oversize")
    except (MissingInput, KeyError):
        return notes
    if len(over):
        limit = int(over["limit"].max())
        notes.append(
            f"the proxy gave up {len(over)} stream(s) on which the target sent an SSE event over its bound "
            f"of {limit:,} characters (tap oversize records): it recorded and forwarded nothing more of them"
        )
    return notes
