"""Reading the process monitor's file (`lab.checker.health.processes`): per-process figures,
saturation of a lab process or of the box, Locust's own CPU warnings, a damaged file."""

from __future__ import annotations

import json
from pathlib import Path

from lab.checker.health.processes import load_samples, saturated, section, summary
from lab.checker.rules.rollout import share_band
from tests.phases.world import T0, write_samples


def test_summary_and_saturation_of_lab_processes_not_the_target(tmp_path: Path) -> None:
    write_samples(
        tmp_path, {"worker-0": [(0, 10, 0.2), (10, 20, 0.95)], "server": [(0, 10, 0.99), (10, 20, 0.6)]}
    )
    s = load_samples(tmp_path)
    assert s.status == "ok" and s.cpus == 2
    rows = {r["part"]: r for r in summary(s)}
    assert rows["worker-0"]["role"] == "lab" and rows["server"]["role"] == "target"
    assert rows["worker-0"]["cpu_max"] == 0.95 and rows["worker-0"]["saturated_share"] == 0.5
    assert rows["server"]["rss_max"] == 50_000_000
    # The second half: the worker saturated. The first: only the server, which is the
    # target, never the lab (and the box had a core to spare).
    assert [x.part for x in saturated(s, T0 + 10, T0 + 20)] == ["worker-0"]
    assert saturated(s, T0, T0 + 10) == []


def test_the_box_is_saturated_by_everything_on_it(tmp_path: Path) -> None:
    write_samples(tmp_path, {"worker-0": [(0, 10, 0.3)]})
    with (tmp_path / "processes.jsonl").open("a") as f:
        for sec in range(10):  # other programs keep the machine's two cores busy
            f.write(
                json.dumps({"type": "host", "t": T0 + sec + 0.5, "cpu": 1.95, "cpus": 2, "load1": 5.2}) + "\n"
            )
    s = load_samples(tmp_path)
    assert [x.part for x in saturated(s, None, None)] == ["box"]
    doc = section(s)
    assert doc["box"] == {
        "source": "host",
        "cpu_mean": 1.95,
        "cpu_p95": 1.95,
        "cpu_max": 1.95,
        "load1_max": 5.2,
    }


def test_locust_cpu_warnings_are_surfaced(tmp_path: Path) -> None:
    write_samples(tmp_path, {"worker-0": [(0, 5, 0.5)]})
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker-0.log").write_text(
        "[2026] host/WARNING/root: CPU usage above 90%! This may constrain your throughput\nother\n"
    )
    (tmp_path / "logs" / "master.log").write_text("fine\n")
    warnings = section(load_samples(tmp_path))["locust_cpu_warnings"]
    assert isinstance(warnings, list) and len(warnings) == 1
    assert warnings[0] == {
        "part": "worker-0",
        "count": 1,
        "first": "[2026] host/WARNING/root: CPU usage above 90%! This may constrain your throughput",
    }


def test_a_missing_or_damaged_file_is_said_not_raised(tmp_path: Path) -> None:
    assert load_samples(tmp_path).status == "missing"
    (tmp_path / "processes.jsonl").write_text('{"type": "sample", "t": 1}\nnot json\n')
    s = load_samples(tmp_path)
    assert s.status == "error" and s.error is not None and "line" in s.error


def test_share_band_is_three_standard_errors_plus_one_session() -> None:
    assert share_band(0.5, 100) == 3 * 0.05 + 0.01
    assert share_band(1.0, 50) == 0.02  # f = 1: only 1/n of slack
    assert share_band(0.01, 0) == float("inf")
