"""What a running run looks like, read from the files its parts write (nothing is asked of them).

- `TapCounter` follows `proxy/tap.jsonl` as it grows: events the server sent (the run's
  event count) and faults fired, by kind.
- `progress.json` is the Locust master's sum of its workers' counters (clients, events
  accepted, reconnects, calls).
- `ProgressLine` turns them into one line a second, with reconnects/s against the budget.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class _Follower:
    """Follows a JSON-lines file as it grows: hands out the complete lines appended since
    the last call (a torn last line waits for the next)."""

    path: Path
    _offset: int = 0

    def new_lines(self) -> list[bytes]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.splitlines()


@dataclass
class TapCounter(_Follower):
    events: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    def update(self) -> None:
        for line in self.new_lines():
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            self._count(rec)

    def _count(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "sent":
            if rec.get("has_data") and not rec.get("priming"):
                self.events += 1
        elif kind == "flow":
            for f in rec.get("faults") or ():
                self.faults[str(f.get("fault"))] += 1
        elif kind in ("forwarded", "dropped", "fault") and rec.get("fault"):
            self.faults[str(rec["fault"])] += 1


@dataclass
class NemesisCounter(_Follower):
    toxics: int = 0

    def update(self) -> None:
        self.toxics += sum(1 for line in self.new_lines() if b'"toxic_added"' in line)


def read_progress(path: Path) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return out
    except (OSError, ValueError):
        return {}


@dataclass
class ProgressLine:
    budget_qps: float
    horizon: float
    event_target: int | None
    _last_reconnects: int = 0
    _last_at: float = 0.0

    def render(
        self, elapsed: float, now: float, progress: dict[str, Any], tap: TapCounter, toxics: int
    ) -> str:
        reconnects = int(progress.get("reconnects", 0))
        dt = now - self._last_at if self._last_at else 0.0
        rate = (reconnects - self._last_reconnects) / dt if dt > 0 else 0.0
        self._last_reconnects, self._last_at = reconnects, now
        left = (
            f"events {tap.events:,}/{self.event_target:,}" if self.event_target else f"events {tap.events:,}"
        )
        faults = sum(tap.faults.values()) + toxics
        warn = " OVER BUDGET" if rate > self.budget_qps else ""
        return (
            f"[{elapsed:5.0f}s/{self.horizon:.0f}s] clients {int(progress.get('users', 0)):>5} | {left} | "
            f"accepted {int(progress.get('accepted', 0)):,} | reconnects {rate:5.1f}/s "
            f"(budget {self.budget_qps:g}/s){warn} | faults {faults:,} | calls ok "
            f"{int(progress.get('calls_ok', 0)):,} failed {int(progress.get('calls_failed', 0)):,} "
            f"unknown {int(progress.get('calls_unknown', 0)):,}"
        )
