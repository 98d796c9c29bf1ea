"""`lab run --metrics-port`: the run's counters as Prometheus text over real HTTP on
127.0.0.1. Live, during a real run: tests/run/test_lab_run.py (the interrupted run)."""

from __future__ import annotations

import urllib.request

import pytest

from lab.run.cli import _port
from lab.run.metrics import MetricsServer, snapshot


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        return str(r.read().decode())


def test_the_last_snapshot_is_served_as_prometheus_text() -> None:
    server = MetricsServer(0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert "lab_events" not in scrape(server.url)  # nothing before the first look at the run
        progress = {"accepted": 40, "users": 3, "calls_ok": 7, "calls_failed": 1, "calls_unknown": 0}
        server.update(
            snapshot(
                "run-1", 2.5, progress, events=52, reconnects=4, reconnect_peak=2, faults={"drop_priming": 3}
            )
        )
        server.update(
            snapshot(
                "run-1",
                3.5,
                progress,
                events=60,
                reconnects=5,
                reconnect_peak=2,
                faults={"drop_priming": 3, "toxic": 1},
            )
        )
        text = scrape(server.url)
    finally:
        server.close()
    lines = set(text.splitlines())
    assert 'lab_events_total{run="run-1"} 60.0' in lines  # the last snapshot, not the first
    assert 'lab_events_accepted_total{run="run-1"} 40.0' in lines
    assert 'lab_reconnects_total{run="run-1"} 5.0' in lines
    assert 'lab_faults_total{kind="toxic",run="run-1"} 1.0' in lines
    assert 'lab_calls_total{outcome="failed",run="run-1"} 1.0' in lines
    assert 'lab_clients{run="run-1"} 3.0' in lines
    assert {
        "# TYPE lab_reconnects counter",
        "# TYPE lab_reconnects_total counter",
    } & lines  # as versions write it


def test_a_port_is_0_to_65535() -> None:
    assert _port("0") == 0 and _port("9464") == 9464
    for bad in ("-1", "65536", "http"):
        with pytest.raises(Exception, match="TCP port"):
            _port(bad)
