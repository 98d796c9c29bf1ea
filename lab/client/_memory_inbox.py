"""`MemoryInbox`: the inbox and outbox in memory, for tests (`lab.inbox.SqliteInbox` is the
durable one a run uses). Beside the door (`_acceptance`), not in it: a store is what the
door writes to, and a run never uses this one."""

from __future__ import annotations

from lab.client._acceptance import DedupKey, InboxReceipt, OutboxDispatch, SeenEvent, Watermark


class MemoryInbox:
    """An in-memory `InboxStore` with the same semantics as the SQLite one (for unit tests
    and the model-based tests; it is not durable)."""

    def __init__(self, *, enforce_unique: bool = True) -> None:
        """`enforce_unique=False` drops the store's own uniqueness guard (the SQLite
        constraints), so a test can show what the acceptance checks alone prevent."""
        self.enforce_unique = enforce_unique
        self.receipts: list[InboxReceipt] = []
        self.dispatches: list[OutboxDispatch] = []
        self._keys: set[DedupKey] = set()
        self._seen: dict[tuple[int, str], SeenEvent] = {}
        self._wm: dict[tuple[int, str], Watermark] = {}
        self._dkeys: set[str] = set()

    def has(self, key: DedupKey) -> bool:
        return key in self._keys

    def seen(self, session_generation: int, event_id: str) -> SeenEvent | None:
        return self._seen.get((session_generation, event_id))

    def watermark(self, session_generation: int, stream_key: str) -> Watermark | None:
        return self._wm.get((session_generation, stream_key))

    def dispatched(self, dispatch_key: str) -> bool:
        return dispatch_key in self._dkeys

    def commit(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        k = receipt.key
        dup = k in self._keys or (dispatch is not None and dispatch.dispatch_key in self._dkeys)
        if dup and self.enforce_unique:
            raise ValueError(f"duplicate commit of {k}")  # the SQLite store's UNIQUE constraints
        self._keys.add(k)
        self.receipts.append(receipt)
        if not k.event_id.startswith("~"):
            self._seen.setdefault(
                (k.session_generation, k.event_id), SeenEvent(k.stream_key, k.message_digest)
            )
            self._wm[(k.session_generation, k.stream_key)] = Watermark(k.event_id, receipt.sequence)
        if dispatch is not None:
            self._dkeys.add(dispatch.dispatch_key)
            self.dispatches.append(dispatch)
