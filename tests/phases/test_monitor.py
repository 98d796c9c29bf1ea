"""The process monitor (`lab.run.monitor`) against real processes: a part that burns a
core, one that sleeps, and a descendant found through the part's session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.run.monitor import SCHEMA, ProcessMonitor, Sampler, parse_stat

BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
# A part that starts a child of its own (in its session) and sleeps.
PARENT = "import subprocess, sys, time\nsubprocess.Popen(['sleep', '30'])\ntime.sleep(30)\n"


@pytest.fixture
def parts() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True),
        subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True),
    ]
    try:
        time.sleep(0.5)  # the parent has started its child
        yield procs
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_parse_stat_counts_fields_after_the_last_parenthesis() -> None:
    # A command name with spaces and a ')' (proc(5): it is the 2nd field, in parentheses).
    rest = " ".join(str(n) for n in range(3, 53))
    line = f"4242 (we) ird (x) {rest.replace('3', 'S', 1)}\n"
    st = parse_stat(4242, line)
    assert st is not None
    assert st.comm == "we) ird (x"
    assert st.session == 6  # field 6
    assert st.cpu_ticks == 14 + 15  # utime + stime
    assert st.threads == 20
    assert st.start_ticks == 22
    assert parse_stat(1, "garbage") is None


def test_samples_show_cpu_rss_and_descendants(parts: list[subprocess.Popen[bytes]]) -> None:
    burn, parent = parts
    sampler = Sampler()
    named = [("worker-0", burn.pid), ("server", parent.pid)]
    sampler.sample(named)
    time.sleep(1.5)
    rows = {r["part"]: r for r in sampler.sample(named)}
    # A busy loop gets whatever share of a core the (shared) box leaves it; a sleeper nothing.
    assert rows["worker-0"]["cpu"] > 0.1, rows
    assert rows["worker-0"]["cpu"] > 10 * rows["server"]["cpu"], rows
    assert rows["server/sleep"]["pid"] != parent.pid  # the descendant, under its part's name
    for r in rows.values():
        assert r["rss"] > 100_000 and r["threads"] >= 1 and r["fds"] >= 1, r


def test_monitor_writes_the_contract_and_stops(tmp_path: Path, parts: list[subprocess.Popen[bytes]]) -> None:
    burn, _ = parts
    path = tmp_path / "processes.jsonl"
    monitor = ProcessMonitor(path, lambda: [("worker-0", burn.pid)], interval=0.3)
    monitor.start()
    time.sleep(1.2)
    monitor.stop()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["type"] == "monitor" and lines[0]["schema"] == SCHEMA and lines[0]["cpus"] >= 1
    samples = [r for r in lines[1:] if r["type"] == "sample"]
    parts_seen = {r["part"] for r in samples}
    hosts = [r for r in lines if r["type"] == "host"]
    assert hosts and all(0 <= r["cpu"] <= r["cpus"] + 0.5 for r in hosts)  # a busy loop runs: some is busy
    assert max(r["cpu"] for r in hosts) > 0.1
    assert parts_seen == {"worker-0", "lab-run"}
    assert set(samples[0]) == {"type", "t", "part", "pid", "cpu", "rss", "fds", "fd_limit", "threads"}
    count = len(lines)
    time.sleep(0.5)
    assert len(path.read_text().splitlines()) == count  # stopped: nothing more is written
