"""Restart faults (`[[restarts]]`, lab.run.restarts), with every real part.

- The reference server with its sessions in memory (`store = "volatile"`), stopped mid-run
  and started again on its port: the run goes on to its end (complete), the restart is a
  line of restarts.jsonl, and the report's restart section sees it from the wire: a
  downtime, the sessions in use lost (404) and each re-handshaken by its client, none kept.
- A URL target with a restart command: the lab runs it at each restart's time, with its
  output in the run's logs, and kills one that outlives `restart_timeout` (a failed
  restart, recorded; the run goes on).
- A URL target without one: the restart is not applicable, and the report says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.livesrv import reference_server, run_scenario

pytestmark = pytest.mark.live

LOAD = """
[load]
users = 6
spawn_rate = 6
duration = "{duration}"
hard_timeout = "60s"
wait_min = "100ms"
wait_max = "300ms"

[load.mix]
read = 1
stream = 1
write = 1

[load.ticker]
count = 30
interval = "50ms"
"""


def restarts_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "restarts.jsonl").read_text().splitlines()]


def section(run: Path) -> dict[str, Any]:
    got = json.loads((run / "report.json").read_text())["restarts"]
    assert isinstance(got, dict)
    return got


def one_restart(tmp_path: Path, store: str, how: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A run of the reference server restarted once at 5 s (`store`, `how`), complete:
    (its folder, run.json, the restart's record)."""
    text = (
        f'description = "one restart"\nseed = 5\n[target]\nkind = "reference"\nstore = "{store}"\n'
        + LOAD.format(duration="14s")
        + f'[[restarts]]\nat = "5s"\nhow = "{how}"\ndown = "500ms"\n'
    )
    done, run = run_scenario(tmp_path, store, text, timeout=120)
    doc = json.loads((run / "run.json").read_text())
    assert doc["complete"], (doc["end_reason"], done.stdout[-3000:] + done.stderr[-3000:])
    (rec,) = restarts_of(run)
    return run, doc, rec


def test_a_volatile_reference_server_restarted_loses_its_sessions_and_the_clients_rehandshake(
    tmp_path: Path,
) -> None:
    run, doc, rec = one_restart(tmp_path, "volatile", "stop")
    assert rec["ok"] and rec["how"] == "stop" and rec["store"] == "volatile", rec
    assert rec["pid_before"] != rec["pid_after"] and rec["stop_sent"] < rec["stopped"] < rec["ready"]
    names = [p["name"] for p in doc["processes"]]
    assert "server" in names and "server-r1" in names, names
    r = section(run)
    assert r["planned"] == r["done"] == 1
    (row,) = r["restarts"]
    assert row["down_wire_s"] is not None and row["down_wire_s"] > 0, row
    ses = row["sessions"]
    assert ses["in_use"] > 0 and ses["lost"] > 0 and ses["kept"] == 0, ses
    assert ses["rehandshaken"] == ses["lost"], ses  # the lab's client starts a new session after a 404
    assert row["run_twice"] == 0, row
    md = (run / "report.md").read_text()
    assert "## Restarts of the target" in md and "stop, volatile store" in md
    # The restarted server is the target's, not the lab's, in the process table.
    report = json.loads((run / "report.json").read_text())
    roles = {p["part"]: p["role"] for p in report["processes"]["parts"]}
    assert roles["server"] == roles["server-r1"] == "target" and roles["mitmproxy"] == "lab", roles


def test_a_durable_reference_server_killed_keeps_its_sessions_and_nothing_private_is_left(
    tmp_path: Path,
) -> None:
    run, _, rec = one_restart(tmp_path, "durable", "crash")
    assert rec["ok"] and rec["how"] == "crash" and rec["store"] == "durable" and rec["exit_code"] == -9, rec
    assert "restored from the store" in (run / "logs" / "server-r1.log").read_text()
    (row,) = section(run)["restarts"]
    ses = row["sessions"]
    assert ses["kept"] > 0 and ses["lost"] == 0, ses  # the store kept them across a kill
    assert row["run_twice"] == 0, row
    # The store (raw session IDs) lived outside the run folder and is gone.
    assert not list(run.rglob("store*.sqlite"))


def alive(pid: int) -> bool:
    """Is `pid` a live process (not a zombie)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


RESTART_SCRIPT = """
import pathlib, subprocess, sys, time
marker = pathlib.Path(sys.argv[1])
if marker.exists():
    # A child of its own that hangs too (as a shell's would): killed with the command.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pathlib.Path(sys.argv[1] + ".child").write_text(str(child.pid))
    print("second restart: hanging", flush=True)
    time.sleep(60)
marker.write_text("restarted")
print("restarted the target", flush=True)
"""


def test_a_url_target_is_restarted_by_its_command_and_a_hanging_command_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "restart_target.py"
    script.write_text(RESTART_SCRIPT)
    marker = tmp_path / "restarted.marker"
    with reference_server(tmp_path, ledger=False) as server:
        text = (
            f'description = "restart by command"\nseed = 6\n[target]\nkind = "url"\nurl = "{server.url}"\n'
            f"restart_command = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, "
            f"{json.dumps(str(marker))}]\n"
            'restart_timeout = "1s"\n'
            + LOAD.format(duration="12s")
            + '[[restarts]]\nat = "3s"\n[[restarts]]\nat = "7s"\n'
        )
        done, run = run_scenario(tmp_path, "url", text, timeout=120)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((run / "run.json").read_text())["complete"], said
    first, second = restarts_of(run)
    assert first["ok"] and first["exit_code"] == 0 and not first["timed_out"], first
    assert (run / first["log"]).read_text().strip() == "restarted the target"
    assert marker.read_text() == "restarted"
    assert not second["ok"] and second["timed_out"], second
    assert "hanging" in (run / second["log"]).read_text()
    assert 0.9 <= second["ready"] - second["stop_sent"] < 10, second  # killed after about 1 s
    assert "restart 2: the restart command timed out after 1 s" in said
    # The hanging command's own child went with it (its process group was killed).
    child = int((tmp_path / "restarted.marker.child").read_text())
    assert not alive(child), f"the restart command's child {child} outlived the run"


def test_a_url_target_without_a_restart_command_says_not_applicable(tmp_path: Path) -> None:
    with reference_server(tmp_path, ledger=False) as server:
        text = (
            f'description = "no command"\nseed = 7\n[target]\nkind = "url"\nurl = "{server.url}"\n'
            + LOAD.format(duration="6s")
            + '[[restarts]]\nat = "2s"\n'
        )
        done, run = run_scenario(tmp_path, "na", text, timeout=120)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert "restarts are not applicable to this target" in said
    (rec,) = restarts_of(run)
    assert rec["applicable"] is False and "restart_command" in rec["why"]
    (row,) = section(run)["restarts"]
    assert row["applicable"] is False
    assert "not applicable" in (run / "report.md").read_text()
