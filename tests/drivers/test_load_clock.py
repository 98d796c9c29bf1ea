"""The run's clock starts when the load does (lab.load.clock): the files the Locust master
writes at the start of the test, and what `lab run` reads back. Real files, no Locust."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lab.faults.plan import parse_plan
from lab.load.clock import LOAD_STARTED_FILE, start_the_clock
from lab.run.options import load_started
from lab.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_and_the_run_learn_the_same_start(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "tests" / "run" / "mini.toml")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(sc.fault_plan_json(1000.0), encoding="utf-8")  # as lab run wrote it at launch
    before = parse_plan(plan_file.read_text(encoding="utf-8"))

    start = start_the_clock(tmp_path, str(plan_file), now=1004.25, settle=0.5)

    assert start == 1004.75
    after = parse_plan(plan_file.read_text(encoding="utf-8"))
    assert after.run_start == start and before.run_start == 1000.0
    assert after.rules == before.rules and after.seed == before.seed  # only the clock moved
    assert load_started(tmp_path) == start
    assert not list(tmp_path.glob("*.tmp"))  # replaced atomically, nothing left over


def test_without_a_plan_only_the_start_is_written(tmp_path: Path) -> None:
    assert load_started(tmp_path) is None  # not yet said
    assert start_the_clock(tmp_path, "", now=50.0, settle=0.0) == 50.0
    assert load_started(tmp_path) == 50.0


def test_an_unreadable_plan_is_logged_and_kept_and_the_load_still_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.ERROR, logger="lab.load.clock"):
        start = start_the_clock(tmp_path, str(plan_file), now=10.0, settle=0.5)
    assert plan_file.read_text(encoding="utf-8") == "{not json"  # the addon keeps the clock it has
    assert load_started(tmp_path) == start == 10.5
    assert any("keeps its clock" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("text", ["", "[]", '{"at": "soon"}', '{"at": true}', "{"])
def test_a_start_file_without_a_number_says_nothing(tmp_path: Path, text: str) -> None:
    (tmp_path / LOAD_STARTED_FILE).write_text(text, encoding="utf-8")
    assert load_started(tmp_path) is None


def test_the_start_file_is_json_with_the_moment(tmp_path: Path) -> None:
    start_the_clock(tmp_path, "", now=123.5, settle=0.25)
    assert json.loads((tmp_path / LOAD_STARTED_FILE).read_text(encoding="utf-8")) == {"at": 123.75}
