"""`lab run`'s progress line says what gate 6 will say: the same per-second bins of the
same ledger rows, against the same budget (run.json `budgets.reconnect_qps`)."""

from __future__ import annotations

import re
from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Verdict
from lab.run.progress import SETTLE_S, ProgressLine, TapCounter
from tests.checker.builders import Sim, clean_run


def _burst(sim: Sim, second: float, n: int) -> None:
    """n reconnects of different clients within one second (a 503 storm)."""
    for i in range(n):
        sim.client_row(
            "reconnects",
            client_id=f"c{i}",
            kind="reopen",
            stream_key="get:1",
            cause="http_503",
            advised_delay=None,
            planned_delay=0.5,
            lost_at=second - 0.5,
            sent_at=second + 0.9 * i / n,
            waited=0.5,
            attempt=0,
            conn_id=9,
            session_generation=1,
        )


def _line(run_dir: Path, now: float, budget_qps: float = 99.0) -> str:
    # budget_qps: what the orchestrator passes (the scenario's client budget); the line must
    # use run.json's budgets.reconnect_qps instead, as gate 6 does.
    line = ProgressLine(budget_qps, 60.0, None)
    tap = TapCounter(run_dir / "proxy" / "tap.jsonl")
    tap.update()
    return line.render(1.0, now, {}, tap, 0)


def test_the_progress_line_uses_gate_6s_bins_and_budget(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.budgets["reconnect_qps"] = 12.0
    second = float(int(sim.t) + 3)
    # 13 reconnects spread over two seconds, 0.6 s apart from their first: a rate computed
    # from counters over a sliding interval can read it as ~20/s; the 1 s bins see 7 and 6.
    _burst(sim, second + 0.5, 13)
    run_dir = sim.write(tmp_path / "over")
    _, report = judge_dir(run_dir)
    g6 = next(g for g in report.gates if g.gate == "reconnect_qps")
    text = _line(run_dir, now=second + 10)
    peak = int(re.search(r"peak (\d+)/s", text).group(1))  # type: ignore[union-attr]
    assert peak == g6.measured["peak_per_s"]
    assert "(budget 12/s)" in text
    assert ("OVER BUDGET" in text) == (g6.verdict is Verdict.FAIL)
    assert g6.verdict is Verdict.PASS and "OVER BUDGET" not in text

    sim.budgets["reconnect_qps"] = 6.0  # now the busiest second (7) is over: both say so
    run_dir = sim.write(tmp_path / "under")
    _, report = judge_dir(run_dir)
    g6 = next(g for g in report.gates if g.gate == "reconnect_qps")
    text = _line(run_dir, now=second + 10)
    assert g6.verdict is Verdict.FAIL and "OVER BUDGET" in text and "(budget 6/s)" in text


def test_the_progress_line_waits_for_a_second_to_be_whole(tmp_path: Path) -> None:
    sim = clean_run().sim
    second = float(int(sim.t) + 3)
    _burst(sim, second, 4)
    run_dir = sim.write(tmp_path / "run")
    assert "reconnects 0/s, peak 1/s" in _line(run_dir, now=second + SETTLE_S - 0.5)  # clean run's own resume
    assert "reconnects 4/s, peak 4/s" in _line(run_dir, now=second + SETTLE_S + 0.5)


def test_the_tap_counter_counts_what_a_json_reading_counts(tmp_path: Path) -> None:
    """The counter reads the SSE pipe's `sent` records by their bytes: it must count what
    parsing every line counts, for those and for records written in any other form."""
    import json

    from lab.faults.pipeline import SsePipe

    sink: list[str | dict[str, object]] = []
    pipe = SsePipe("f1", "s_x", sink, lambda: 1.0)
    pipe.feed(
        b'id: a0\ndata: \n\nid: a1\ndata: {"x": 1}\n\n: keep-alive\n\nid: a2\ndata: {"y": "\\u00e9"}\n\n'
    )
    pipe.feed(b"retry: 500\n\n")
    lines = [r if isinstance(r, str) else json.dumps(r) for r in sink]
    lines += [
        json.dumps({"type": "sent", "flow": "f2", "has_data": True, "priming": False}),  # another form
        json.dumps({"type": "sent", "flow": "f2", "has_data": True, "priming": True}),
        json.dumps({"type": "flow", "flow": "f2", "faults": [{"fault": "storm"}, {"fault": "old_token"}]}),
        json.dumps({"type": "dropped", "flow": "f1", "fault": "cut_stream"}),
        json.dumps({"type": "dropped", "flow": "f1", "fault": "cut_stream"}),  # the same line twice
        json.dumps({"flow": "f4", "type": "sent", "has_data": True, "priming": False}, separators=(",", ":")),
        json.dumps({"type": "flow_end", "flow": "f1"}),
        '{"type":"sent","flow":"f3","has_data":true,"priming":false,',  # torn (being written)
    ]
    path = tmp_path / "tap.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    parsed = []
    for line in lines[:-1]:  # the torn last line is not read yet
        parsed.append(json.loads(line))
    expected = sum(1 for r in parsed if r["type"] == "sent" and r.get("has_data") and not r.get("priming"))
    tap = TapCounter(path)
    tap.update()
    assert tap.events == expected == 4
    assert dict(tap.faults) == {"storm": 1, "old_token": 1, "cut_stream": 2}


def test_the_progress_line_names_the_phase_under_way() -> None:
    from lab.scenario import load_scenario

    sc = load_scenario("chaos-short")
    line = ProgressLine(
        50.0, sc.horizon, None, phases=tuple((p.name, p.kind, p.start, p.end) for p in sc.phases)
    )
    names = [(p.name, p.kind) for p in sc.phases]
    assert len(names) == 3
    for i, p in enumerate(sc.phases, start=1):
        assert line.phase_at(p.start + 0.5) == f" phase {p.name} ({p.kind}, {i} of 3) |"
    assert line.phase_at(sc.phases[-1].end + 1) == "" and ProgressLine(50.0, 60.0, None).phase_at(5.0) == ""
