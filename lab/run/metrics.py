"""`lab run --metrics-port PORT`: the running run's counters as Prometheus text, at
`http://127.0.0.1:PORT/metrics`, for a dashboard or an alert while a long run goes; and
`lab run --metrics-file FILE`: the same, one JSON object per second appended to FILE
(`MetricsFile`, schema `mcpLabMetrics.v1`, docs/report.md).

The figures are the progress line's (`lab.run.progress`), read from the files the parts
write, once a second, by the same `Watcher`: the tap's events and faults, the clients'
reconnects (gate 6's rows), the Locust master's sums (clients, events accepted, calls).
`prometheus_client` serves them; a collector hands it the last snapshot on each scrape,
so a scrape costs the run nothing but the text. Only 127.0.0.1 is listened on.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The counters of one look at the run (monotonic, except the gauges)."""

    run_id: str
    elapsed_s: float = 0.0
    events: int = 0
    accepted: int = 0
    reconnects: int = 0
    reconnect_peak: int = 0
    clients: int = 0
    calls: Mapping[str, int] = field(default_factory=dict)
    """outcome -> calls: ok; failed and unknown (not explained by a fault the lab
    injected); injected (failed after a response the lab's proxy marked, `x-lab-fault`)."""
    faults: Mapping[str, int] = field(default_factory=dict)
    """fault kind (and `toxic` for the nemesis' toxics) -> times fired."""


class _RunCollector(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Snapshot | None = None

    def set(self, snap: Snapshot) -> None:
        with self._lock:
            self._last = snap

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            s = self._last
        if s is None:
            return
        run = {"run": s.run_id}

        def counter(name: str, doc: str, value: float) -> Metric:
            m = CounterMetricFamily(name, doc, labels=list(run))
            m.add_metric(list(run.values()), value)
            return m

        def gauge(name: str, doc: str, value: float) -> Metric:
            m = GaugeMetricFamily(name, doc, labels=list(run))
            m.add_metric(list(run.values()), value)
            return m

        yield counter("lab_events", "Events the server sent, as the proxy tap counts them", s.events)
        yield counter("lab_events_accepted", "Events the lab's clients accepted", s.accepted)
        yield counter("lab_reconnects", "Reconnect attempts of the clients (gate 6's rows)", s.reconnects)
        calls = CounterMetricFamily("lab_calls", "Tool calls by outcome", labels=["run", "outcome"])
        for outcome, n in sorted(s.calls.items()):
            calls.add_metric([s.run_id, outcome], n)
        yield calls
        faults = CounterMetricFamily(
            "lab_faults", "Faults the lab injected, by kind (expected, not failures)", labels=["run", "kind"]
        )
        for kind, n in sorted(s.faults.items()):
            faults.add_metric([s.run_id, kind], n)
        yield faults
        yield gauge("lab_clients", "Clients running now", s.clients)
        yield gauge(
            "lab_reconnects_peak_per_second",
            "The busiest whole second of reconnects so far",
            s.reconnect_peak,
        )
        yield gauge("lab_run_elapsed_seconds", "Seconds since the run started", s.elapsed_s)


class MetricsServer:
    """The endpoint, on a thread of its own; `update` after each look at the run."""

    def __init__(self, port: int) -> None:
        self._collector = _RunCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        self.port: int = self._server.server_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def update(self, snap: Snapshot) -> None:
        self._collector.set(snap)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


METRICS_SCHEMA = "mcpLabMetrics.v1"


class MetricsSink(Protocol):
    def update(self, snap: Snapshot) -> None: ...

    def close(self) -> None: ...


class MetricsFile:
    """`--metrics-file FILE`: each snapshot as one JSON line, appended and flushed at once
    (a `tail -f`, a log shipper or a crash loses nothing written). Fields: `schema`, `t`
    (epoch s) and the `Snapshot`'s (`run_id`, `elapsed_s`, `events`, `accepted`,
    `reconnects`, `reconnect_peak`, `clients`, `calls` by outcome, `faults` by kind)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("a", encoding="utf-8", buffering=1)

    def update(self, snap: Snapshot, now: float | None = None) -> None:
        row = {"schema": METRICS_SCHEMA, "t": round(time.time() if now is None else now, 3), **asdict(snap)}
        self._f.write(json.dumps(row, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._f.close()


def snapshot(run_id: str, elapsed_s: float, progress: Mapping[str, Any], **counts: Any) -> Snapshot:
    """A `Snapshot` from progress.json's sums (`progress`) and the watcher's own counts."""

    def num(key: str) -> int:
        v = progress.get(key, 0)
        return int(v) if isinstance(v, int | float) else 0

    return Snapshot(
        run_id=run_id,
        elapsed_s=elapsed_s,
        accepted=num("accepted"),
        clients=num("users"),
        calls={
            "ok": num("calls_ok"),
            "failed": num("calls_failed"),
            "unknown": num("calls_unknown"),
            "injected": num("calls_injected"),
        },
        **counts,
    )
