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

Used by the embedded nemesis (server side) and by `lab.nemesis.client` when it drives a
real Toxiproxy (client side; the time is then when the API answered). Thread-safe.
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

    def write(self, record: NemesisRecord) -> None:
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
    """Every record of a log file; a line that is not a `mcpLabNemesis.v1` record raises
    `ValueError` naming the file and the line."""
    out: list[NemesisRecord] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
                out.append(NemesisRecord(**raw))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a {SCHEMA} record: {exc}") from exc
    return out
