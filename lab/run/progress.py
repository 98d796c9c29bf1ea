"""What a running run looks like, read from the files its parts write (nothing is asked of them).

- `TapCounter` follows `proxy/tap.jsonl` as it grows: events the server sent (the run's
  event count) and faults fired, by kind.
- `ReconnectCounter` follows the clients' ledgers (`clients/*.sqlite`, read-only) for
  their `reconnects` rows: the very rows gate 6 judges.
- `progress.json` is the Locust master's sum of its workers' counters (clients, events
  accepted, calls).
- `ProgressLine` turns them into one line a second. Its reconnects per second are gate
  6's own (`lab.checker.truth.reconnects.per_second`: 1 s bins of `sent_at`, all workers
  merged) against gate 6's own budget (run.json `budgets.reconnect_qps`), so the line
  can never say "over budget" where the gate says pass, or the reverse. Workers commit
  their ledgers in batches, so the line shows the last second old enough to be whole
  (`SETTLE_S` ago) and the busiest second so far.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The checker (pandas) is imported on the first progress line, not by `lab run`'s start
# (lab.run.orchestrator warms it meanwhile, while the parts start).

SETTLE_S = 2
"""Seconds after which a 1 s bin of reconnects is taken as whole (workers flush their
ledgers about once a second)."""


@dataclass
class JsonLines:
    """Follows a JSON-lines file as it grows: the complete lines (or records) appended since
    the last call (a torn last line waits for the next call; a bad line is skipped; a file
    that cannot be read yet gives nothing)."""

    path: Path
    _offset: int = 0

    def new_lines(self) -> list[bytes]:
        return self.new_bytes().splitlines()

    def new_bytes(self) -> bytes:
        """The complete lines appended since the last call, as one block of bytes."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return b""
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete

    def new_records(self) -> list[dict[str, Any]]:
        return [rec for line in self.new_lines() if (rec := _record(line)) is not None]


def _record(line: bytes) -> dict[str, Any] | None:
    """A line's JSON object; None for a bad line or any other JSON value."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


_SENT_HEAD = b'{"type":"sent",'
_EVENT_SENT = b'"has_data":true,"priming":false'
"""In a `sent` record of the fixed form: an event that carries a message."""


def _lines_with(data: bytes, marker: bytes) -> dict[int, bytes]:
    """The lines of `data` (complete lines) in which `marker` occurs, by where they start."""
    found: dict[int, bytes] = {}
    at = data.find(marker)
    while at >= 0:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        found[start] = data[start:end]
        at = data.find(marker, end)
    return found


@dataclass
class TapCounter(JsonLines):
    events: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    def update(self) -> None:
        data = self.new_bytes()
        # Most lines are the SSE pipe's `sent` records, written in one fixed form
        # (lab.faults.pipeline): the events among them are counted in the bytes at once
        # (a loop over 100k lines was most of `lab run`'s CPU while a gate ran; JSON was
        # ~10 µs a line before that). Only lines that may say something else are parsed:
        # ones naming a fault, and `sent` records in any other form. (A quote inside an
        # ID or a value is escaped, so these markers cannot come from inside one.)
        self.events += data.count(_EVENT_SENT)
        odd_sends = data.count(b'"sent"') != data.count(_SENT_HEAD)
        lines = _lines_with(data, b'"fault') | (_lines_with(data, b'"sent"') if odd_sends else {})
        for _, line in sorted(lines.items()):
            if line.startswith(_SENT_HEAD):
                continue
            rec = _record(line)
            if rec is not None and not (rec.get("type") == "sent" and _EVENT_SENT in line):
                self._count(rec)  # (a `sent` record holding the marker was counted in the bytes)

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
class NemesisCounter(JsonLines):
    toxics: int = 0

    def update(self) -> None:
        self.toxics += sum(1 for line in self.new_lines() if b'"toxic_added"' in line)


@dataclass
class ReconnectCounter:
    """Follows every worker's `reconnects` table as it grows (by rowid, read-only)."""

    clients_dir: Path
    sent_at: list[float] = field(default_factory=list)
    _seen: dict[Path, int] = field(default_factory=dict)

    def update(self) -> None:
        for path in sorted(self.clients_dir.glob("*.sqlite")):
            last = self._seen.get(path, 0)
            try:
                db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=0.2)
                try:
                    rows = db.execute(
                        "SELECT rowid, sent_at FROM reconnects WHERE rowid > ? ORDER BY rowid", (last,)
                    ).fetchall()
                finally:
                    db.close()
            except sqlite3.Error:
                continue  # not created yet, or busy: the next second reads it
            if rows:
                self._seen[path] = int(rows[-1][0])
                self.sent_at.extend(float(t) for _, t in rows if isinstance(t, int | float))


def read_progress(path: Path) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return out
    except (OSError, ValueError):
        return {}


@dataclass
class ProgressLine:
    budget_qps: float
    """The budget to show until run.json's `budgets.reconnect_qps` (gate 6's) is read."""
    horizon: float
    event_target: int | None
    run_dir: Path | None = None
    """The run folder; by default the folder of the tap the line is rendered with."""
    phases: tuple[tuple[str, str, float, float], ...] = ()
    """The scenario's phases as (name, kind, start, end), seconds from the run start: the
    line names the one under way (`phase blow (faults, 2 of 6)`)."""
    _reconnects: ReconnectCounter | None = None
    _budget_from_run: float | None = None
    reconnects: int = 0
    """Reconnect rows seen so far (all seconds, settled or not)."""
    reconnect_peak: int = 0
    """The busiest settled second so far."""

    def budget(self) -> float:
        """Gate 6's budget: run.json `budgets.reconnect_qps` (as the checker reads it)."""
        if self._budget_from_run is None and self.run_dir is not None:
            from lab.checker import parse_budgets

            try:
                run = json.loads((self.run_dir / "run.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                run = None
            self._budget_from_run = parse_budgets(run if isinstance(run, dict) else None).reconnect_qps
        return self.budget_qps if self._budget_from_run is None else self._budget_from_run

    def phase_at(self, elapsed: float) -> str:
        """` phase NAME (KIND, i of n) |` for the phase under way at `elapsed`, else ""."""
        for i, (name, kind, start, end) in enumerate(self.phases, start=1):
            if start <= elapsed < end:
                return f" phase {name} ({kind}, {i} of {len(self.phases)}) |"
        return ""

    def reconnect_rates(self, now: float) -> tuple[int, int, bool]:
        """(reconnects in the last whole second, in the busiest second so far, whether any
        second was over the budget), all from gate 6's per-second bins."""
        if self._reconnects is None:
            if self.run_dir is None:
                return 0, 0, False
            self._reconnects = ReconnectCounter(self.run_dir / "clients")
        from lab.checker import over_budget, per_second

        self._reconnects.update()
        counts = per_second(self._reconnects.sent_at)
        settled = counts[counts.index <= int(now) - SETTLE_S]
        last = int(settled.get(int(now) - SETTLE_S, 0))
        peak = int(settled.max()) if len(settled) else 0
        self.reconnects, self.reconnect_peak = len(self._reconnects.sent_at), peak
        return last, peak, bool(len(over_budget(settled, self.budget())))

    def render(
        self, elapsed: float, now: float, progress: dict[str, Any], tap: TapCounter, toxics: int
    ) -> str:
        if self.run_dir is None:
            self.run_dir = tap.path.parent.parent  # <run>/proxy/tap.jsonl
        last, peak, over = self.reconnect_rates(now)
        left = (
            f"events {tap.events:,}/{self.event_target:,}" if self.event_target else f"events {tap.events:,}"
        )
        faults = sum(tap.faults.values()) + toxics
        warn = " OVER BUDGET" if over else ""
        return (
            f"[{elapsed:5.0f}s/{self.horizon:.0f}s]{self.phase_at(elapsed)} clients {int(progress.get('users', 0)):>5} | {left} | "
            f"accepted {int(progress.get('accepted', 0)):,} | reconnects {last}/s, peak {peak}/s "
            f"(budget {self.budget():g}/s){warn} | faults injected {faults:,} | calls ok "
            f"{int(progress.get('calls_ok', 0)):,}, failed as injected "
            f"{int(progress.get('calls_injected', 0)):,} | unexpected: failed "
            f"{int(progress.get('calls_failed', 0)):,} unknown {int(progress.get('calls_unknown', 0)):,}"
        )
