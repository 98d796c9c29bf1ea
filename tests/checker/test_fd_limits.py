"""A lab process near its file-descriptor limit is saturated: the process monitor records
each process's soft RLIMIT_NOFILE (`fd_limit`, lab/run/monitor.py) and the checker names
a lab process whose open fds reached 80 % of it (`lab.checker.health.processes`). Real processes,
with a real (lowered) limit."""

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

from lab.checker.health.processes import FDS, load_samples, saturated, summary
from lab.run.monitor import SCHEMA, Sampler, parse_fd_limit

LIMIT = 64
# Lowers its own limit to LIMIT, opens `n` descriptors, says so, and on a signal file
# raises its limit and opens `m` more.
HOLDER = f"""
import os, resource, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, hard))
n, m, ready, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.02)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
held += [os.open(os.devnull, os.O_RDONLY) for _ in range(m)]
open(ready + ".more", "w").close()
time.sleep(30)
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], Path, Path]]]:
    """`hungry` holds 56 of its 64 fds; `calm` a handful; both then raise their limit when told."""
    procs: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}
    try:
        for name, n, m in (("hungry", 56, 0), ("calm", 0, 56)):
            ready, go = tmp_path / f"{name}.ready", tmp_path / f"{name}.go"
            proc = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(n), str(m), str(ready), str(go)],
                start_new_session=True,
            )
            procs[name] = (proc, ready, go)
        for _, ready, _ in procs.values():
            _wait_for(ready)
        yield procs
    finally:
        for proc, _, _ in procs.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def write(run_dir: Path, records: list[dict[str, object]]) -> None:
    head = {"type": "monitor", "t": time.time(), "schema": SCHEMA, "interval_s": 1.0, "cpus": os.cpu_count()}
    (run_dir / "processes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [head, *records]))


def test_a_process_near_its_fd_limit_is_named_one_far_from_it_is_not(
    tmp_path: Path, holders: dict[str, tuple[subprocess.Popen[bytes], Path, Path]]
) -> None:
    sampler = Sampler()
    named = [("nemesis", holders["hungry"][0].pid), ("mitmproxy", holders["calm"][0].pid)]
    records = sampler.sample(named)
    rows = {r["part"]: r for r in records}
    assert rows["nemesis"]["fd_limit"] == LIMIT and rows["mitmproxy"]["fd_limit"] == LIMIT
    assert rows["nemesis"]["fds"] >= 56 > rows["mitmproxy"]["fds"]
    write(tmp_path, records)
    s = load_samples(tmp_path)
    found = saturated(s, None, None)
    assert [(x.part, x.reason) for x in found] == [("nemesis", FDS)]
    assert found[0].short(s.cpus) == f"nemesis: {rows['nemesis']['fds']:,} of {LIMIT} file descriptors"
    parts = {r["part"]: r for r in summary(s)}
    assert parts["nemesis"]["fd_limit"] == LIMIT and parts["mitmproxy"]["fds_max"] == rows["mitmproxy"]["fds"]


def test_a_limit_the_process_raised_itself_is_read_again_before_it_is_blamed(
    tmp_path: Path, holders: dict[str, tuple[subprocess.Popen[bytes], Path, Path]]
) -> None:
    # Read once (64); the process then raises its own limit and opens 56 more: the monitor
    # reads the limit again as the fds near the old one, and nothing is saturated.
    proc, ready, go = holders["calm"]
    sampler = Sampler()
    first = sampler.sample([("worker-0", proc.pid)])
    assert first[0]["fd_limit"] == LIMIT
    go.touch()
    _wait_for(Path(f"{ready}.more"))
    second = sampler.sample([("worker-0", proc.pid)])
    assert second[0]["fds"] >= 56 and second[0]["fd_limit"] == 1024
    write(tmp_path, first + second)
    assert saturated(load_samples(tmp_path), None, None) == []


def test_the_limit_is_read_from_the_proc_limits_text() -> None:
    text = (
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max processes             96365                96365                processes \n"
        "Max open files            20000                524288               files     \n"
    )
    assert parse_fd_limit(text) == 20000
    assert parse_fd_limit(text.replace("20000 ", "unlimited")) is None
    assert parse_fd_limit("garbage") is None
