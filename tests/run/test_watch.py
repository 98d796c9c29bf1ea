"""The run's watch over its nemesis and its traffic: toxic outcomes, real fault windows,
the stall detector (pure), and compose's `lab watch` against the embedded nemesis (live)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.load.clock import start_the_clock
from lab.run.options import wait_for_load_start
from lab.run.progress import JsonLines
from lab.run.watch import (
    StallDetector,
    ToxicOutcomes,
    Watcher,
    active_windows,
    lab_limits,
    outcome_record,
    real_fault_windows,
)
from lab.scenario import load_scenario
from tests.helpers.process_samples import samples, write_samples
from tests.livesrv import LAB, wait_for_line

HERE = Path(__file__).resolve().parent


def rec(action: str, outcome: str, t: float, toxic: str = "latency-0") -> dict[str, Any]:
    return {
        "type": "toxic_outcome",
        "t": t,
        "proxy": "mcp",
        "toxic": toxic,
        "kind": "latency",
        "action": action,
        "outcome": outcome,
        "detail": "" if outcome == "ok" else "timed out",
    }


def outcomes_of(tmp_path: Path, records: list[dict[str, Any]]) -> ToxicOutcomes:
    log = tmp_path / "nemesis.jsonl"
    other = {"type": "toxic_added", "t": 1.0, "proxy": "mcp", "toxic": "latency-0"}
    log.write_text("".join(json.dumps(r) + "\n" for r in [other, *records]) + '{"torn": ')
    out = ToxicOutcomes(JsonLines(log))
    out.update()
    return out


def test_a_failed_removal_is_found_and_an_ok_one_is_not(tmp_path: Path) -> None:
    good = outcomes_of(tmp_path, [rec("add", "ok", 1.0), rec("remove", "ok", 3.0)])
    assert good.failed_removal() is None and good.in_place() == []
    bad = outcomes_of(tmp_path, [rec("add", "ok", 1.0), rec("remove", "timeout", 8.0)])
    assert bad.failed_removal() == rec("remove", "timeout", 8.0)
    assert bad.in_place() == ["latency-0 (latency)"]


def test_outcome_records_from_the_runner_name_timeouts() -> None:
    r = outcome_record(
        t=2.0,
        proxy="p",
        toxic="x",
        kind="timeout",
        action="remove",
        ok=False,
        unknown=True,
        error="Timed out",
    )
    assert r["outcome"] == "timeout" and r["type"] == "toxic_outcome"
    r = outcome_record(
        t=2.0, proxy="p", toxic="x", kind="k", action="add", ok=False, unknown=False, error="409"
    )
    assert r["outcome"] == "failed"


def test_fault_windows_say_when_a_toxic_really_ended_or_that_it_never_did() -> None:
    planned = [
        {"fault": "toxic:latency", "rule": "latency-0", "start": 101.0, "end": 103.0},
        {"fault": "cut_stream", "rule": "r1", "start": 100.0, "end": 110.0},
    ]
    ended = real_fault_windows(planned, [rec("add", "ok", 101.2), rec("remove", "ok", 103.4)], 110.0)
    assert ended[0]["start"] == 101.2 and ended[0]["end"] == 103.4 and ended[0]["ended"] is True
    assert ended[0]["planned_end"] == 103.0 and ended[1] == planned[1]
    stuck = real_fault_windows(planned, [rec("add", "ok", 101.2), rec("remove", "failed", 108.0)], 110.0)
    assert stuck[0]["ended"] is False and stuck[0]["end"] == 110.0 and stuck[0]["removal"] == "failed"
    never = real_fault_windows(planned, [rec("add", "ok", 101.2)], 109.0)
    assert never[0]["removal"] == "never attempted" and never[0]["ended"] is False


def test_the_stall_detector_fires_on_silence_with_clients_and_not_otherwise() -> None:
    d = StallDetector(after=5.0)
    assert d.observe(0.0, events=10, calls_ok=1, clients=3) is None
    for t in (1.0, 2.0, 3.0, 4.0):
        assert d.observe(t, events=10, calls_ok=1, clients=3) is None
    assert d.observe(5.0, events=10, calls_ok=1, clients=3) == 5.0
    moving = StallDetector(after=5.0)
    for t in range(20):  # events move: never a stall
        assert moving.observe(float(t), events=t, calls_ok=0, clients=3) is None
    idle = StallDetector(after=5.0)
    for t in range(20):  # nothing moves, but no client is active: not a stall
        assert idle.observe(float(t), events=0, calls_ok=0, clients=0) is None
    calls = StallDetector(after=5.0)
    for t in range(20):  # only completed calls move (a quiet tool mix): not a stall
        assert calls.observe(float(t), events=0, calls_ok=t, clients=2) is None


def write_run(run_dir: Path, t0: float, seconds: int, *, exhausted: str | None, at: int) -> None:
    """processes.jsonl of a quiet run: `exhausted` (a part) holds all its descriptors from
    second `at` on; every CPU figure is low."""
    calm = {part: (0.05, 300, 20_000) for part in ("server", "mitmproxy", "nemesis", "worker-0")}
    spent = calm | ({exhausted: (0.05, 20_000, 20_000)} if exhausted else {})
    write_samples(run_dir, samples(t0, t0 + at, **calm) + samples(t0 + at, t0 + seconds, **spent))


def test_the_lab_limits_of_a_stall_name_a_proxy_out_of_descriptors_and_nothing_else(tmp_path: Path) -> None:
    write_run(tmp_path, 1000.0, 60, exhausted="nemesis", at=40)
    (hit,) = lab_limits(tmp_path, 1030.0, 1060.0)
    assert hit.startswith("nemesis had 20,000 file descriptors open of its limit of 20,000"), hit
    assert lab_limits(tmp_path, 1000.0, 1035.0) == []  # before it ran out
    write_run(tmp_path, 1000.0, 60, exhausted="server", at=40)
    assert lab_limits(tmp_path, 1030.0, 1060.0) == []  # the target's limits are the target's
    assert lab_limits(tmp_path / "nowhere", 0.0, 2e9) == []  # compose: no processes.jsonl


def test_a_stall_while_a_proxy_was_out_of_descriptors_says_so(tmp_path: Path) -> None:
    sc = load_scenario(HERE.parent / "robustness" / "stall.toml")  # stalls after 4 quiet seconds
    t0 = 1000.0
    (tmp_path / "progress.json").write_text(json.dumps({"users": 4, "calls_ok": 7}))
    watcher = Watcher(tmp_path, sc, t0, ToxicOutcomes(JsonLines(tmp_path / "nemesis.jsonl")))
    reasons = {}
    for exhausted in (None, "mitmproxy"):
        write_run(tmp_path, t0, 30, exhausted=exhausted, at=10)
        watcher.stall = StallDetector(sc.load.stall_timeout)
        found = [watcher.tick(t0 + 20 + i)[1] for i in range(6)]
        reasons[exhausted] = next(r for r in found if r is not None)
    assert reasons[None].startswith("traffic stalled: no event sent") and "limits" not in reasons[None]
    assert reasons["mitmproxy"].startswith(
        reasons[None] + "; the lab's own processes at their limits meanwhile: "
    )
    assert "mitmproxy had 20,000 file descriptors open" in reasons["mitmproxy"]


def test_active_windows() -> None:
    w = [{"fault": "cut_stream", "rule": "r", "start": 10.0, "end": 20.0}]
    assert active_windows(w, 15.0) == ["cut_stream (r)"] and active_windows(w, 25.0) == []


def test_a_compose_run_counts_from_the_load_start_once_the_master_says_it(tmp_path: Path) -> None:
    assert wait_for_load_start(tmp_path, within=0.1, poll=0.01) is None  # no master: prepare's time
    start_the_clock(tmp_path, "", now=1234.0, settle=0.5)
    assert wait_for_load_start(tmp_path, within=0.1, poll=0.01) == 1234.5


# ---------------------------------------------------------------------------- live


@pytest.fixture
def nemesis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    from lab.nemesis.client import ToxiproxyClient

    log = tmp_path / "nemesis-own.log"
    out = tmp_path / "nemesis.out"
    with out.open("w") as f:
        proc = subprocess.Popen(
            [LAB, "nemesis", "--api-port", "0", "--log", str(log)],
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        api = wait_for_line(proc, out, "lab-nemesis api ")
        ToxiproxyClient(api).create_proxy("mcp", upstream="127.0.0.1:9", listen="127.0.0.1:0")
        yield api, proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.live
def test_lab_watch_carries_out_the_toxics_and_completes_run_json(
    tmp_path: Path, nemesis: tuple[str, subprocess.Popen[str]]
) -> None:
    api, _ = nemesis
    run = tmp_path / "compose"
    prep = [LAB, "prepare", str(HERE / "toxics.toml"), "--out", str(run), "--client-url", "http://x:1/mcp"]
    subprocess.run(prep, check=True, capture_output=True, timeout=60)
    start_the_clock(run, "", time.time(), settle=0.0)  # what the Locust master does
    proc = subprocess.run(
        [LAB, "watch", str(run), "--toxiproxy", api], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((run / "run.json").read_text())
    assert doc["status"] == "finished" and doc["complete"] is True and doc["end_reason"] == "duration"
    assert [(o["action"], o["outcome"]) for o in doc["toxic_outcomes"]] == [("add", "ok"), ("remove", "ok")]
    (window,) = [w for w in doc["fault_windows"] if w["fault"] == "toxic:latency"]
    assert window["ended"] is True and window["planned_end"] - window["planned_start"] == pytest.approx(1.0)
    # The real times: never early (a late step acts at once), and the removal after the add.
    assert window["planned_start"] <= window["start"] < window["end"]
    assert window["end"] >= window["planned_end"] - 0.05
    logged = [json.loads(line)["type"] for line in (run / "nemesis.jsonl").read_text().splitlines()]
    assert "toxic_added" in logged and "toxic_removed" in logged, "compose runs report their toxics"
    assert (run / "stop-requested").exists()


@pytest.mark.long
@pytest.mark.live
def test_lab_watch_ends_the_run_incomplete_when_a_removal_fails(
    tmp_path: Path, nemesis: tuple[str, subprocess.Popen[str]]
) -> None:
    api, nem = nemesis
    run = tmp_path / "compose"
    # The toxic stays 24 s, not 1: the schedule counts from the load's start (said here,
    # right after `lab prepare`), and on a loaded box `lab watch` may start many seconds
    # late and then add and remove at once, before the nemesis is stopped below (seen
    # with 8 s in CI).
    scenario = tmp_path / "toxics-long.toml"
    text = (HERE / "toxics.toml").read_text(encoding="utf-8")
    scenario.write_text(
        text.replace('until = "2s"', 'until = "25s"').replace('duration = "3s"', 'duration = "26s"'),
        encoding="utf-8",
    )
    prep = [LAB, "prepare", str(scenario), "--out", str(run), "--client-url", "http://x:1/mcp"]
    subprocess.run(prep, check=True, capture_output=True, timeout=60)
    start_the_clock(run, "", time.time(), settle=0.0)  # what the Locust master does
    watch = subprocess.Popen(
        [LAB, "watch", str(run), "--toxiproxy", api],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while b"toxic_added" not in (run / "nemesis.jsonl").read_bytes():
            assert time.monotonic() < deadline, "the toxic was never added"
            time.sleep(0.1)
        os.kill(nem.pid, signal.SIGSTOP)  # the nemesis stops answering: the removal at 25 s cannot happen
        started = time.monotonic()
        _, err = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 2, err
    doc = json.loads((run / "run.json").read_text())
    assert doc["complete"] is False and doc["end_reason"].startswith(
        "toxic removal failed: remove of toxic latency-0"
    )
    (window,) = [w for w in doc["fault_windows"] if w["fault"] == "toxic:latency"]
    assert window["ended"] is False
    # The removal waits the runner's API timeout (longer than Toxiproxy's own), and once more
    # when the runner cleans up: bounded all the same (the removal is due 25 s in).
    assert time.monotonic() - started < 90


def test_a_run_whose_clients_never_all_ran_is_not_complete(tmp_path: Path) -> None:
    # stall.toml asks for 4 clients. Its duration is over: with 4 running at some second
    # it is complete; with at most 3 (a box that could not start them) it is not, and says
    # how many ran.
    sc = load_scenario(HERE.parent / "robustness" / "stall.toml")
    t0 = 1000.0
    watcher = Watcher(tmp_path, sc, t0, ToxicOutcomes(JsonLines(tmp_path / "nemesis.jsonl")))
    for i, users in enumerate((1, 3, 2)):
        (tmp_path / "progress.json").write_text(json.dumps({"users": users, "calls_ok": i}))
        watcher.tick(t0 + i)
    short = watcher.shape_not_reached()
    assert short is not None and short.startswith("load shape not reached: at most 3 of the 4 clients")
    (tmp_path / "progress.json").write_text(json.dumps({"users": 4, "calls_ok": 9}))
    watcher.tick(t0 + 5)
    assert watcher.shape_not_reached() is None
