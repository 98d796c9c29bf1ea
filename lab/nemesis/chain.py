"""The toxics of one nemesis proxy (trio): `ToxicChain` holds them in the order they were
added, per direction, and signals every change, so a sleeping toxic can end early when it
is removed; `ToxicEntry` names one toxic from its addition to its removal."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import trio

from lab.nemesis.toxics import ToxicSpec


@dataclass(frozen=True, slots=True)
class ToxicEntry:
    """A toxic in a proxy's chain. `added_id` names it from its addition to its removal
    (per-connection state such as limit_data's count is keyed by it); `version_id`
    changes with every update (the toxicity roll is keyed by it)."""

    spec: ToxicSpec
    added_id: int
    version_id: int


class ToxicChain:
    """The toxics of one proxy, in the order they were added, and a change signal."""

    def __init__(self) -> None:
        self._entries: dict[str, ToxicEntry] = {}
        self._by_stream: dict[str, tuple[ToxicEntry, ...]] = {}
        self._ids = itertools.count(1)
        self._changed = trio.Event()

    def get(self, name: str) -> ToxicEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[ToxicEntry]:
        return list(self._entries.values())

    def listing(self) -> list[ToxicEntry]:
        """As the API lists them: upstream toxics, then downstream ones, each in the order
        they were added (Toxiproxy's order)."""
        return sorted(self._entries.values(), key=lambda e: e.spec.stream != "upstream")

    def for_stream(self, stream: str) -> tuple[ToxicEntry, ...]:
        """The toxics of one direction, in the order they were added (kept ready: the
        proxy asks for every chunk)."""
        return self._by_stream.get(stream, ())

    def is_current(self, entry: ToxicEntry) -> bool:
        """The toxic is still in the chain (possibly updated since)."""
        now = self._entries.get(entry.spec.name)
        return now is not None and now.added_id == entry.added_id

    def add(self, spec: ToxicSpec) -> ToxicEntry:
        if spec.name in self._entries:
            raise KeyError(spec.name)
        entry = ToxicEntry(spec, next(self._ids), next(self._ids))
        self._entries[spec.name] = entry
        self._notify()
        return entry

    def update(self, spec: ToxicSpec) -> ToxicEntry:
        old = self._entries[spec.name]
        entry = ToxicEntry(spec, old.added_id, next(self._ids))
        self._entries[spec.name] = entry
        self._notify()
        return entry

    def remove(self, name: str) -> ToxicEntry:
        entry = self._entries.pop(name)
        self._notify()
        return entry

    def changed_event(self) -> trio.Event:
        """An event set at the next change of the chain."""
        return self._changed

    def _notify(self) -> None:
        streams = {e.spec.stream for e in self._entries.values()}
        self._by_stream = {
            st: tuple(e for e in self._entries.values() if e.spec.stream == st) for st in streams
        }
        self._changed.set()
        self._changed = trio.Event()
