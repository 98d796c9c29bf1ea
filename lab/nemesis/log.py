"""The nemesis log — `mcpLabNemesis.v1`, JSON lines (`nemesis.jsonl` of a run).

One JSON object per change, written and flushed as the change takes effect:

| field | meaning |
| --- | --- |
| `type` | `proxy_created` \\| `proxy_deleted` \\| `toxic_added` \\| `toxic_removed` |
| `t` | when the change took effect, Unix epoch seconds (float, `time.time()`) |
| `proxy` | proxy name |
| `listen` | the proxy's listen address `host:port`: the bound port (0 only for a proxy created disabled on port 0) |
| `upstream` | the proxy's upstream address `host:port` |
| `toxic` | toxic name (null for proxy records) |
| `kind` | toxic type: latency, bandwidth, slow_close, timeout, reset_peer, limit_data, slicer, or `down` (null for proxy records) |
| `stream` | `upstream` (client -> server) \\| `downstream` (server -> client); null for proxy records and `down` |
| `toxicity` | probability per connection, 0..1 (null for proxy records) |
| `attributes` | the toxic's attributes, units as in `lab.nemesis.toxics` (`{}` for `down`; null for proxy records) |

How other changes are written, so that every fault is a window between two records:
- a proxy **disabled** (`enabled: false`, Toxiproxy's "down") is `toxic_added` of the
  pseudo-toxic `{"toxic": "down", "kind": "down"}`; enabled again is its `toxic_removed`;
- an **updated toxic** is `toxic_removed` of the old version, then `toxic_added` of the new;
- a proxy whose `listen` or `upstream` changed (Toxiproxy restarts it and drops its
  connections) is `proxy_deleted`, then `proxy_created`;
- deleting a proxy, `/reset`, and the nemesis stopping write `toxic_removed` for every
  toxic still in place before `proxy_deleted` (or the `down` removal).

Used by the embedded nemesis (server side) and by `lab.nemesis.client` or
`lab.nemesis.schedule` when they drive a real Toxiproxy (client side; the time is then when
the API answered). Thread-safe; several writers (processes too) may append to one file,
each line in one write.

Besides the changes, the schedule runner writes the **outcome of every toxic add and
remove it attempts** (`lab.nemesis.schedule`), against the embedded nemesis and a real
Toxiproxy alike, so a run can tell a toxic that never ended from one that did:

    {"type": "toxic_outcome", "t", "proxy", "toxic", "kind",
     "action": "add"|"remove", "outcome": "ok"|"failed"|"timeout"|"unknown", "detail"}

| field | meaning |
| --- | --- |
| `t` | when the call ended (answer, error or timeout), Unix epoch seconds |
| `toxic`, `kind` | the toxic's name and type |
| `action` | `add` or `remove` |
| `outcome` | `ok`: the API confirmed it (a remove that found no toxic, 404, is `ok` too: it is gone); `failed`: the API refused it, or no connection could be made (the change did not happen); `timeout`: the request was sent and no answer came in time (it may have happened); `unknown`: the connection broke after sending, or the answer was unreadable (it may have happened) |
| `detail` | why, in words (`""` for a plain `ok`) |
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Final

from lab.nemesis.toxics import ToxicSpec

SCHEMA: Final = "mcpLabNemesis.v1"
RECORD_TYPES: Final = ("proxy_created", "proxy_deleted", "toxic_added", "toxic_removed")
OUTCOME_TYPE: Final = "toxic_outcome"
ACTIONS: Final = ("add", "remove")
OUTCOMES: Final = ("ok", "failed", "timeout", "unknown")
DOWN: Final = "down"
"""Name and kind of the pseudo-toxic that stands for a disabled proxy."""


@dataclass(frozen=True, slots=True)
class NemesisRecord:
    """One line of the log (fields documented in the module docstring)."""

    type: str
    t: float
    proxy: str
    listen: str
    upstream: str
    toxic: str | None = None
    kind: str | None = None
    stream: str | None = None
    toxicity: float | None = None
    attributes: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        if self.type not in RECORD_TYPES:
            raise ValueError(f"{SCHEMA}: unknown record type {self.type!r}")

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["attributes"] = None if self.attributes is None else dict(self.attributes)
        return out


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """What became of one toxic add or remove (`toxic_outcome`; fields in the module docstring)."""

    t: float
    proxy: str
    toxic: str
    kind: str
    action: str
    outcome: str
    detail: str = ""
    type: str = OUTCOME_TYPE

    def __post_init__(self) -> None:
        if self.type != OUTCOME_TYPE:
            raise ValueError(f"{SCHEMA}: an outcome record has type {OUTCOME_TYPE!r}, got {self.type!r}")
        if self.action not in ACTIONS:
            raise ValueError(f"{SCHEMA}: action must be one of {ACTIONS}, got {self.action!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"{SCHEMA}: outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    def to_json(self) -> dict[str, object]:
        return {
            "type": self.type,
            "t": self.t,
            "proxy": self.proxy,
            "toxic": self.toxic,
            "kind": self.kind,
            "action": self.action,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def proxy_record(type_: str, proxy: str, listen: str, upstream: str, t: float | None = None) -> NemesisRecord:
    """A `proxy_created` / `proxy_deleted` record."""
    return NemesisRecord(type_, time.time() if t is None else t, proxy, listen, upstream)


def toxic_record(
    type_: str, proxy: str, listen: str, upstream: str, toxic: ToxicSpec, t: float | None = None
) -> NemesisRecord:
    """A `toxic_added` / `toxic_removed` record for a real toxic."""
    return NemesisRecord(
        type_,
        time.time() if t is None else t,
        proxy,
        listen,
        upstream,
        toxic.name,
        toxic.kind,
        toxic.stream,
        toxic.toxicity,
        dict(toxic.attributes),
    )


def down_record(type_: str, proxy: str, listen: str, upstream: str, t: float | None = None) -> NemesisRecord:
    """A `toxic_added` (proxy disabled) / `toxic_removed` (enabled again) of the `down` pseudo-toxic."""
    return NemesisRecord(
        type_, time.time() if t is None else t, proxy, listen, upstream, DOWN, DOWN, None, 1.0, {}
    )


class NemesisLog:
    """Appends records to a JSON-lines file, one flushed line per record."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        # Line-buffered text: each record reaches the OS as soon as it is written, so a
        # crash loses at most the change that was being written.
        self._file: IO[str] | None = path.open("a", encoding="utf-8", buffering=1)

    def write(self, record: NemesisRecord | OutcomeRecord) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":"), allow_nan=False)
        with self._lock:
            if self._file is None:
                raise ValueError(f"{self.path}: the nemesis log is closed")
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> NemesisLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_nemesis_log(path: Path) -> list[NemesisRecord]:
    """Every change record of a log file (outcome records are left out: see
    `read_toxic_outcomes`); a line that is not a `mcpLabNemesis.v1` record raises
    `ValueError` naming the file and the line."""
    return [r for r in read_all_records(path) if isinstance(r, NemesisRecord)]


def read_toxic_outcomes(path: Path) -> list[OutcomeRecord]:
    """Every `toxic_outcome` record of a log file, in file order."""
    return [r for r in read_all_records(path) if isinstance(r, OutcomeRecord)]


def read_all_records(path: Path) -> list[NemesisRecord | OutcomeRecord]:
    """Every record of a log file, in file order."""
    out: list[NemesisRecord | OutcomeRecord] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
                out.append(OutcomeRecord(**raw) if raw.get("type") == OUTCOME_TYPE else NemesisRecord(**raw))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a {SCHEMA} record: {exc}") from exc
    return out
