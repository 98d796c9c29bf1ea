"""`lab shrink`'s parts on their own (lab.replay.shrink): delta debugging finds the smallest
failing subset and never tries a candidate twice for nothing; removing operations
renumbers the pins that follow; the witnesses' clients are found by connection, ID and
session; a run that failed nothing, or a bad flag, is refused with exit 3."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lab.load.settings import ClientScript
from lab.replay.recorded import Recorded
from lab.replay.shrink import Candidate, ddmin, nearest_requests, triggers_of, without_ops, witness_clients
from tests.livesrv import LAB, ROOT


def counting(needs: set[int]) -> tuple[list[list[int]], Any]:
    asked: list[list[int]] = []

    def still_fails(items: Sequence[int]) -> bool:
        asked.append(list(items))
        return needs <= set(items)

    return asked, still_fails


@pytest.mark.parametrize("needs", [set(), {5}, {3, 7}, {0, 15}, {1, 2, 3}, set(range(16))])
def test_ddmin_finds_the_smallest_failing_subset(needs: set[int]) -> None:
    asked, still_fails = counting(needs)
    assert ddmin(list(range(16)), still_fails) == sorted(needs)
    assert asked[0] == []  # nothing at all is tried first
    assert len(asked) <= 40, len(asked)


def test_ddmin_keeps_at_least_what_it_is_told() -> None:
    asked, still_fails = counting(set())
    assert ddmin(["a", "b", "c"], still_fails, least=1) == ["a"]
    asked, still_fails = counting({1})
    assert ddmin([1], still_fails, least=1) == [1] and asked == []  # nothing smaller to try


def trigger(client: str, request: str, ordinal: int, event: int | None = None) -> dict[str, Any]:
    return {"fault": "cut_stream", "rule": "cut_stream#0", "by": "event", "client": client,
            "request": request, "ordinal": ordinal, "event_index": event}  # fmt: skip


def test_removing_operations_renumbers_the_pins_of_the_calls_that_follow() -> None:
    script = ClientScript("w0-u1", ("stream", "read", "stream", "write", "stream"), (0.1, 0.2, 0.3, 0.4, 0.5))
    ticker = "POST tools/call ticker"
    cand = Candidate(
        (script, ClientScript("w0-u2", ("stream",), (0.1,))),
        (
            trigger("w0-u1", ticker, 3, 4),
            trigger("w0-u1", ticker, 1, 2),
            trigger("w0-u1", "GET resume", 2),
            trigger("w0-u2", ticker, 1, 3),
        ),
    )
    shrunk = without_ops(cand, "w0-u1", [1, 2, 4])  # the 1st ticker call and the write go
    assert shrunk.scripts[0] == ClientScript("w0-u1", ("read", "stream", "stream"), (0.2, 0.3, 0.5))
    assert shrunk.scripts[1] == cand.scripts[1]
    assert [(t["client"], t["request"], t["ordinal"]) for t in shrunk.triggers] == [
        ("w0-u1", ticker, 2),  # the 3rd ticker call is now the 2nd
        # (the pin on the 1st ticker call went with it)
        ("w0-u1", "GET resume", 2),  # other kinds are left as they are
        ("w0-u2", ticker, 1),  # another client's pins are untouched
    ]
    assert shrunk.ops == 4 and cand.with_clients([script]).triggers == cand.triggers[:3]


def recorded(tmp_path: Path, report: dict[str, Any], sessions: list[tuple[str, str]] = ()) -> Recorded:  # type: ignore[assignment]
    (tmp_path / "clients").mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(tmp_path / "clients" / "worker-0.sqlite")
    db.execute("CREATE TABLE IF NOT EXISTS sessions (client_id TEXT, session TEXT)")
    db.executemany("INSERT INTO sessions (client_id, session) VALUES (?, ?)", [(c, s) for s, c in sessions])
    db.commit()
    db.close()
    scripts = tuple(ClientScript(f"w0-u{i}", ("read",), (0.1,)) for i in (1, 2, 3, 10, 11))
    triggers = (
        trigger("w0-u1", "POST tools/call echo", 1),
        trigger("w0-u11", "GET", 1),
        {"fault": "toxic:latency", "by": "time"},
    )
    return Recorded(tmp_path, {"run_id": "r"}, tmp_path / "s.toml", {}, scripts, triggers, report)


def test_the_witnesses_clients_by_connection_id_and_session(tmp_path: Path) -> None:
    report = {
        "rules": {
            "cross_stream": {
                "witnesses": [
                    {
                        "explanation": "the server sent ... on connection w0-u1:7, stream s_aaaaaaaaaaaaaaaaaaaa|g1"
                    },
                    {"row": {"session": "s_bbbbbbbbbbbbbbbbbbbb", "client_id": "w0-u11"}},
                ]
            }
        }
    }
    rec = recorded(
        tmp_path, report, [("s_bbbbbbbbbbbbbbbbbbbb", "w0-u3"), ("s_cccccccccccccccccccc", "w0-u2")]
    )
    # w0-u1 by its connection (not w0-u10 or w0-u11, which begin alike); w0-u3 by its session.
    assert witness_clients(rec, "cross_stream") == [["w0-u1"], ["w0-u3", "w0-u11"]]
    assert triggers_of(rec, {"w0-u11"}) == (rec.triggers[1], rec.triggers[2])  # and the toxics, by time


def lab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_run_that_failed_nothing_or_bad_flags_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    recorded(run, {})
    scenario = tmp_path / "s.toml"
    scenario.write_text((ROOT / "scenarios" / "smoke.toml").read_text())
    (run / "run.json").write_text(json.dumps({"run_id": "r", "scenario_file": str(scenario)}))
    db = sqlite3.connect(run / "clients" / "worker-0.sqlite")
    db.execute("CREATE TABLE operations (client_id TEXT, tool TEXT, started_at REAL)")
    db.execute("INSERT INTO operations VALUES ('w0-u1', 'echo', 1.0)")
    db.commit()
    db.close()
    refused = lab("shrink", str(run), "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "no report.json: run `lab report" in refused.stderr
    rules = {
        "cross_stream": {"number": 1, "verdict": "pass"},
        "resume_p99": {"number": 5, "verdict": "inconclusive"},
    }
    (run / "report.json").write_text(json.dumps({"verdict": "inconclusive", "rules": rules}))
    refused = lab("shrink", str(run), "--out", str(tmp_path / "out"))
    assert refused.returncode == 3, refused.stderr
    assert "the run failed no rule (verdict inconclusive): there is no failure to shrink" in refused.stderr
    rules["cross_stream"]["verdict"] = "fail"
    (run / "report.json").write_text(json.dumps({"verdict": "fail", "rules": rules}))
    refused = lab("shrink", str(run), "--rule", "resume_p99", "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "not a rule the run failed (it failed: cross_stream)" in refused.stderr
    refused = lab("shrink", str(run), "--k", "3", "--n", "2", "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "--k 3 is more than --n 2" in refused.stderr
    refused = lab("shrink", str(run), "--budget-s", "1")
    assert refused.returncode == 3 and "10..86400 seconds" in refused.stderr
    assert not (tmp_path / "out").exists()  # nothing was started


def test_the_firings_nearest_the_first_witness_come_first(tmp_path: Path) -> None:
    by_conn = {
        "rules": {
            "missing_rehandshake": {
                "witnesses": [{"explanation": "a GET carrying it (connection w0-u1:10) got 400 at T+1.6 s"}]
            }
        }
    }
    rec = recorded(tmp_path, by_conn)

    def at(fault: str, conn: str, at_s: float) -> dict[str, Any]:
        return {"fault": fault, "client": conn.split(":")[0], "conn": conn, "at_s": at_s}

    fired = [at("cut_stream", "w0-u1:4", 0.2), at("kill_session", "w0-u1:9", 1.4), at("drop_priming", "w0-u1:8", 1.2),
             at("drop_priming", "w0-u1:12", 2.0), at("kill_session", "w0-u2:9", 1.5)]  # fmt: skip
    groups = nearest_requests(rec, "missing_rehandshake", fired)
    # Before the witness's connection on its client, nearest first; later ones and other clients' not at all.
    assert [[t["conn"] for t in g] for g in groups] == [["w0-u1:9"], ["w0-u1:8"], ["w0-u1:4"]]
    by_time = {
        "rules": {
            "duplicate_dispatch": {
                "witnesses": [
                    {"explanation": "request 2 got result a at T+0.090 s; request 3 got b at T+0.344 s"}
                ]
            }
        }
    }
    fired = [at("drop_priming", "w0-u3:5", 0.344), at("executed_then_lost", "w0-u3:4", 0.09),
             at("drop_priming", "w0-u3:4", 0.09), at("kill_session", "w0-u3:9", 2.0)]  # fmt: skip
    groups = nearest_requests(recorded(tmp_path, by_time), "duplicate_dispatch", fired)
    # Nearest any time it names, the earlier on a tie: the write's two firings together.
    assert [[t["conn"] for t in g] for g in groups] == [["w0-u3:4", "w0-u3:4"], ["w0-u3:5"], ["w0-u3:9"]]
    assert nearest_requests(recorded(tmp_path, {}), "duplicate_dispatch", fired) == []
