"""Nothing of `lab run`'s own is random per run but the run's folder name, HMAC key and
admin token: every input it gives the parts is drawn from the scenario (its seed) and the
addresses of this run. Two preparations of one scenario give the same fault plan, the
same Locust settings and the same nemesis seed; a different seed changes them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from lab import topology
from lab.scenario import load_scenario
from tests.livesrv import LAB


def prepared(tmp_path: Path, name: str, scenario: str) -> dict[str, Any]:
    out = tmp_path / name
    subprocess.run(
        [LAB, "prepare", scenario, "--out", str(out), "--client-url", "http://127.0.0.1:1/mcp"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    plan = json.loads((out / "proxy" / "plan.json").read_text())
    plan.pop("run_start")
    settings = json.loads((out / "locust-settings.json").read_text())
    settings.pop("run_dir")
    settings.pop("plan_file")  # in the run folder, like run_dir
    return {"plan": plan, "settings": settings}


def test_two_preparations_of_one_scenario_give_the_parts_the_same_inputs(tmp_path: Path) -> None:
    first, second = prepared(tmp_path, "a", "smoke"), prepared(tmp_path, "b", "smoke")
    assert first == second
    assert first["plan"]["seed"] == first["settings"]["seed"] == load_scenario("smoke").seed
    other = prepared(tmp_path, "c", "storm")
    assert other["settings"]["seed"] != first["settings"]["seed"]


def test_the_nemesis_gets_the_scenarios_seed() -> None:
    argv = topology.nemesis(topology.LOCAL, "/tmp/run", seed=4242).argv
    assert argv[argv.index("--seed") + 1] == "4242"
