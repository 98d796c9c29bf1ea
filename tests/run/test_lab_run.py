"""`lab run` with every real part: the ledgers of a short run, an interrupted run, refusals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.fast_path import fast_path_outcomes
from tests.helpers.once import once
from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live
HERE = Path(__file__).resolve().parent


def run_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent just has not reaped it).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_bad_scenario_is_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('seed = "x"\n[load]\nusers = -3\n[[faults]]\nkind = "drop_priming"\nrate = 7\n')
    out = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", str(bad), "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert str(bad) in proc.stderr and "nothing was started" in proc.stderr
    for key in ("seed", "load.users", "faults[0].rate"):
        assert key in proc.stderr, f"the error should name {key}"
    assert run_folders(out) == []


def test_budget_below_the_workers_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", str(HERE / "mini.toml"), "--workers", "11", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3 and "budget_qps" in proc.stderr
    assert run_folders(out) == []


def test_the_nemesiss_own_toxics_are_refused_through_a_real_toxiproxy(tmp_path: Path) -> None:
    # A real Toxiproxy has no idle_timeout (nor buffer): refused before anything starts,
    # not at the moment the schedule would add it. (The port is never reached.)
    out = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", "proxy-profiles", "--toxiproxy", "http://127.0.0.1:9", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert "idle_timeout" in proc.stderr and "real Toxiproxy does not have" in proc.stderr
    assert run_folders(out) == []


SIZE_FLAGS = ["--users", "3", "--duration", "10s", "--seed", "77"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    def make(base: Path) -> dict[str, object]:
        argv = [
            LAB,
            "run",
            str(HERE / "mini.toml"),
            "--workers",
            "2",
            "--out",
            str(base / "results"),
            "--no-report",
            *SIZE_FLAGS,
        ]
        # The size flags on top of mini.toml (4 users, 14 s, seed 7), as a k6 user would.
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return {"args": argv, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    # One run for the module's tests, whichever workers run them (tests.helpers.once).
    base, got = once(tmp_path_factory, "lab-run-short", make)
    (folder,) = run_folders(base / "results")
    return folder, subprocess.CompletedProcess(got["args"], got["returncode"], got["stdout"], got["stderr"])


def test_short_run_completes_and_stops_everything(
    short_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    folder, proc = short_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((folder / "run.json").read_text())
    assert run["schema"] == "mcpLabRun.v1" and run["complete"] is True and run["end_reason"] == "duration"
    names = {p["name"] for p in run["processes"]}
    assert {"server", "mitmproxy", "nemesis", "master", "worker-0", "worker-1"} == names
    for p in run["processes"]:
        assert p["exit_code"] == 0, p
        assert not pid_alive(p["pid"]), f"{p['name']} ({p['pid']}) is still running"
    assert "[" in proc.stdout and "events" in proc.stdout  # progress lines were shown


def test_the_size_flags_change_the_run_and_say_so(
    short_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    folder, _ = short_run
    run = json.loads((folder / "run.json").read_text())
    assert run["overrides"] == {"load.users": 3, "load.duration": "10s", "seed": 77}
    assert run["seed"] == 77 and run["scenario"]["load"]["users"] == 3
    assert run["scenario"]["load"]["duration"] == 10.0 and run["scenario"]["load"]["hard_timeout"] == 80.0


def test_two_workers_split_the_budget(short_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    folder, _ = short_run
    run = json.loads((folder / "run.json").read_text())
    splits = run["budget_split"]
    assert any(s["workers"] == 2 and s["shares"] == [5.0, 5.0] for s in splits), splits


def test_the_runs_clock_starts_with_the_load(
    short_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    # Fault windows (the addon's plan), toxics, phases and the load shape all count from
    # run.json's started_at, which is when the master started the load, not when the
    # processes were launched: on a busy box that was seconds earlier, and a fault window
    # of the first seconds fell before the first request (lab.load.clock).
    folder, _ = short_run
    start = json.loads((folder / "run.json").read_text())["started_at"]
    tap = [json.loads(line) for line in (folder / "proxy" / "tap.jsonl").read_text().splitlines()]
    plans = [rec for rec in tap if rec["type"] == "plan"]
    assert plans[-1]["run_start"] == start, [p["run_start"] - start for p in plans]
    first = min(rec["t_request"] for rec in tap if rec["type"] == "flow")
    assert start <= first < start + 2.0, f"the first request came {first - start:.2f} s after the run start"


def test_injected_failures_are_counted_apart_from_unexpected_ones(
    short_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    # mini.toml's rewrite_origin makes half of the writes fail with the server's 403, on
    # purpose: the clients count those as injected (the proxy marks its doing on the
    # response, `x-lab-fault`), Locust shows them under a type of their own and not among
    # its failures, and the progress line says "failed as injected".
    folder, proc = short_run
    progress = json.loads((folder / "progress.json").read_text())
    assert progress["calls_injected"] >= 1, progress
    assert progress["calls_failed"] == 0, progress
    refused = 0
    for path in (folder / "clients").glob("worker-*.sqlite"):
        with contextlib.closing(sqlite3.connect(path)) as db:
            refused += db.execute("SELECT count(*) FROM operations WHERE reason = 'http_403'").fetchone()[0]
    assert refused >= 1
    stats = json.loads((folder / "locust.json").read_text())
    injected = [s for s in stats if s["method"] == "MCP injected fault"]
    assert injected and all(s["num_failures"] == 0 for s in injected), injected
    assert all("ledger.append" in s["name"] and "http_403" in s["name"] for s in injected), injected
    assert "failed as injected" in proc.stdout and "unexpected: failed" in proc.stdout


def test_ledgers_show_every_part_of_the_protocol(
    short_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    folder, _ = short_run
    rows: list[tuple[str, str, int | None, int, str | None, float, float, str]] = []
    for db_path in sorted((folder / "clients").glob("worker-*.sqlite")):
        db = sqlite3.connect(db_path)
        rows += db.execute(
            "SELECT client_id, purpose, status, carried_session, last_event_id, started_at, ended_at, method"
            " FROM http_exchanges"
        ).fetchall()
    purposes = {r[1] for r in rows}
    assert {"initialize", "initialized", "standalone", "call", "resume", "delete"} <= purposes
    assert any(r[1] == "resume" and r[4] and r[7] == "GET" for r in rows), (
        "a resume is a GET with Last-Event-ID"
    )
    assert any(r[1] == "delete" and r[2] == 200 for r in rows), "clients DELETE their sessions when they stop"
    # A 404 to a request that carried a session ID is followed by a new initialize: the
    # first request *started after the 404 arrived* (requests already in flight then do
    # not count) is an initialize without a session ID.
    by_client: dict[str, list[tuple[float, float, str, int | None, int]]] = {}
    for r in rows:
        by_client.setdefault(r[0], []).append((r[5], r[6], r[1], r[2], r[3]))
    run = json.loads((folder / "run.json").read_text())
    load_end = run["started_at"] + run["scenario"]["load"]["duration"]
    saw_404 = 0
    for exchanges in by_client.values():
        exchanges.sort()
        for _started, ended, purpose, status, carried in exchanges:
            if status == 404 and carried and purpose != "delete":
                saw_404 += 1
                later = [e for e in exchanges if e[0] >= ended]  # the core re-initializes at once
                if not later and ended >= load_end - 1.0:
                    continue  # the 404 came as the load ended: the client was stopped first
                assert later and later[0][2] == "initialize" and later[0][4] == 0, later[:3]
    assert saw_404 > 0, "no request that carried a session got a 404 (expiry_race)"
    server = sqlite3.connect(folder / "server" / "ledger.sqlite")
    deleted = server.execute("SELECT COUNT(*) FROM sessions WHERE end_reason = 'deleted'").fetchone()[0]
    assert deleted > 0, "the server ended no session by DELETE"
    replayed = server.execute("SELECT COUNT(*) FROM events_sent WHERE replay = 1").fetchone()[0]
    assert replayed > 0, "the server replayed no event to a resume"
    tap = [json.loads(line) for line in (folder / "proxy" / "tap.jsonl").read_text().splitlines()]
    fired = {f["fault"] for rec in tap if rec["type"] == "flow" for f in rec.get("faults") or ()}
    fired |= {rec.get("fault") for rec in tap if rec["type"] in ("forwarded", "dropped", "fault")}
    assert {"cut_stream", "expiry_race"} <= fired


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_interrupted_run_stops_everything_and_keeps_its_ledgers(tmp_path: Path) -> None:
    # With --metrics-port: the run's counters are scraped while it goes (Prometheus text);
    # with --metrics-file, the same appended as JSON lines, kept up to the interrupt.
    out = tmp_path / "results"
    port = free_port()
    stream = tmp_path / "metrics" / "run.jsonl"
    proc = subprocess.Popen(
        [
            LAB,
            "run",
            str(HERE / "long.toml"),
            "--out",
            str(out),
            "--no-report",
            "--metrics-port",
            str(port),
            "--metrics-file",
            str(stream),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            folders = run_folders(out)
            if folders and (folders[0] / "progress.json").exists():
                progress = json.loads((folders[0] / "progress.json").read_text() or "{}")
                if progress.get("accepted", 0) > 20:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the run did not get going")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    assert "SIGINT" in output
    assert f"metrics: http://127.0.0.1:{port}/metrics" in output
    counters = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(("lab_events_total", "lab_reconnects_total"))
    }
    assert counters["lab_events_total"] > 0 and "lab_reconnects_total" in counters, metrics
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert len(lines) >= 2 and {r["schema"] for r in lines} == {"mcpLabMetrics.v1"}
    assert [r["events"] for r in lines] == sorted(r["events"] for r in lines) and lines[-1]["events"] > 0
    assert set(lines[-1]["calls"]) == {"ok", "failed", "unknown", "injected"}
    assert lines[-1]["t"] > lines[0]["t"] and lines[-1]["run_id"] == lines[0]["run_id"]
    (folder,) = run_folders(out)
    run = json.loads((folder / "run.json").read_text())
    assert run["complete"] is False and run["end_reason"] == "interrupted"
    for p in run["processes"]:
        assert not pid_alive(p["pid"]), f"{p['name']} ({p['pid']}) was left behind"
    client = sqlite3.connect(next((folder / "clients").glob("worker-*.sqlite")))
    assert client.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] > 0
    assert client.execute("SELECT COUNT(*) FROM http_exchanges").fetchone()[0] > 0
    server = sqlite3.connect(folder / "server" / "ledger.sqlite")
    assert server.execute("SELECT COUNT(*) FROM events_sent").fetchone()[0] > 0
    assert (folder / "proxy" / "tap.jsonl").stat().st_size > 0


def test_lab_run_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lab.cli", "run", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0 and "exit with the verdict" in out.stdout.replace("\n", " ")


def test_the_ledgers_the_lab_writes_are_read_on_the_fast_path(
    short_run: tuple[Path, subprocess.CompletedProcess[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every record type and field the lab's own writers put in the tap and the nemesis log
    # is known to the checker's fast reader (lab.checker.inputs.jsonl_fast): a field it does
    # not know sends its whole piece down the general path, which is right but slower.
    from lab.checker.inputs.jsonl import read_jsonl
    from lab.checker.inputs.schemas import NEMESIS_RECORDS, NEMESIS_SCHEMA, TAP_RECORDS, TAP_SCHEMA

    folder, _ = short_run
    outcomes = fast_path_outcomes(monkeypatch)
    tap = read_jsonl(folder / "proxy" / "tap.jsonl", "tap", TAP_RECORDS, TAP_SCHEMA)
    nemesis = read_jsonl(folder / "nemesis.jsonl", "nemesis", NEMESIS_RECORDS, NEMESIS_SCHEMA)
    assert outcomes and all(outcomes), f"{outcomes.count(False)} piece(s) read by the general path"
    assert len(tap.frames["sent"]) > 0 and tap.notes == [] and nemesis.notes == []
