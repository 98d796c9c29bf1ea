"""What each fault did (lab.checker.truth.fault_outcomes): rejections, recoveries and
failed calls put under the fault kind that touched their connections, the failed calls no
fault explains, and the section and figure of the report (report.json `fault_outcomes`,
report.md, fig-fault-outcomes.png)."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.load import load_run
from lab.checker.truth.fault_outcomes import FaultOutcomes, KindOutcome, fault_outcomes, section
from lab.report.fault_figure import FILE
from lab.report.figures import draw_all
from lab.report.outputs import report_run
from tests.checker.builders import Sim, Stream


@dataclass
class Built:
    """A run folder built by hand and the figures the test checks it against."""

    sim: Sim
    latencies: tuple[float, float]
    """The two recoveries of a's call after a fault injected on its connection (s)."""


def _operation(sim: Sim, client: str, key: str, outcome: str, reason: str, start: float) -> None:
    """The client's outcome of one call (`operations`), from `start` to now."""
    sim.client_row(
        "operations",
        client_id=client,
        operation_key=key,
        tool="ledger.append",
        write=1,
        outcome=outcome,
        reason=reason,
        attempts=1,
        started_at=start,
        finished_at=sim.tick(),
        session_generation=sim.clients[client].generation,
    )


def _cut(sim: Sim, st: Stream) -> None:
    """The proxy cuts `st`'s connection (cut_stream): its next event is dropped."""
    sim.tap.append(
        {
            "type": "dropped",
            "flow": st.flow,
            "t": sim.tick(0.001),
            "index": st.index,
            "fault": "cut_stream",
            "rule": "r-cut",
            "decision": "d-cut",
        }
    )


def _injected_then_resumed(sim: Sim, onto: Stream, source: Stream, wait: float) -> float:
    """inject_foreign puts one of `source`'s events on `onto`'s connection; the client
    rejects it, drops that connection and resumes after `wait`. Returns the latency."""
    foreign = sim.notify(source, 1)[0]
    sim.forward_foreign(onto, foreign, accept=False, fault="inject_foreign")
    lost = sim.cut_and_resume(onto, after=wait)
    sim.notify(onto, 1)
    sim.recovered(onto, lost, sim.t)
    return sim.t - lost


def faulted_run() -> Built:
    """inject_foreign twice on a's call (2 rejections, 2 recoveries of different
    latency), cut_stream on b's call (a recovery that never came back, and b's call ends
    unknown), a clean call of a that fails anyway, and a call the proxy never saw."""
    sim = Sim()
    sim.initialize("a")
    sim.initialize("b")
    post_a = sim.call("a", 2, idempotency_key="op-a")
    post_b = sim.call("b", 2, idempotency_key="op-b")
    b_started = sim.t
    sim.notify(post_a, 2)
    sim.notify(post_b, 2)
    first = _injected_then_resumed(sim, post_a, post_b, 0.2)
    second = _injected_then_resumed(sim, post_a, post_b, 1.5)
    _cut(sim, post_b)
    sim.recovered(post_b, sim.tick(), None, path="abandoned")
    _operation(sim, "b", "op-b", "unknown", "gave_up_after_cut_mid_event", b_started)
    clean_started = sim.t
    clean = sim.call("a", 5, idempotency_key="op-clean")
    sim.notify(clean, 1)
    _operation(sim, "a", "op-clean", "error", "tool_error", clean_started)
    _operation(sim, "a", "op-lost", "unknown", "gave_up_after_connect_timeout", sim.tick())
    sim.tick(30.0)  # the run goes on: the lost recovery had its chance (not censored)
    return Built(sim, (first, second))


def _measure(run_dir: Path) -> FaultOutcomes:
    data = load_run(run_dir)
    return fault_outcomes(Context(data, parse_budgets(data.run)))


def _row(o: FaultOutcomes, fault: str) -> KindOutcome:
    (row,) = [k for k in o.kinds if k.fault == fault]
    return row


def test_a_fault_that_caused_rejections_and_recoveries_has_them_in_its_row(tmp_path: Path) -> None:
    built = faulted_run()
    o = _measure(built.sim.write(tmp_path / "run"))
    assert [k.fault for k in o.kinds] == ["cut_stream", "inject_foreign"]
    injected = _row(o, "inject_foreign")
    assert (injected.fired, injected.rejected, injected.recoveries, injected.recovered) == (2, 2, 2, 2)
    fast, slow = sorted(built.latencies)
    assert slow - fast > 1.0  # two latencies far apart: p50 and p99 must tell them apart
    assert injected.resume_p50_s == pytest.approx(fast) and injected.resume_p99_s == pytest.approx(slow)
    assert injected.attributed_by == "flow" and injected.errors == 0
    cut = _row(o, "cut_stream")
    assert (cut.fired, cut.rejected, cut.recoveries, cut.recovered, cut.censored) == (1, 0, 1, 0, 0)
    assert math.isinf(cut.resume_p50_s) and math.isinf(cut.resume_p99_s)  # never came back
    assert o.recoveries == 3 and o.recoveries_unattributed == 0


def test_a_failed_call_on_a_faulted_flow_is_explained_one_on_a_clean_flow_is_not(tmp_path: Path) -> None:
    o = _measure(faulted_run().sim.write(tmp_path / "run"))
    assert _row(o, "cut_stream").errors == 1  # b's call: its stream was cut
    c = o.calls
    assert (c.total, c.explained, c.unexplained, c.without_flows) == (3, 1, 2, 1)
    assert c.unexplained_by_reason == {"error: tool_error": 1, "unknown: gave_up_after_connect_timeout": 1}


def test_a_toxic_counts_by_its_window_in_time(tmp_path: Path) -> None:
    """A toxic touches no flow: the call that ran while it was in place is its, the one
    after it closed is unexplained."""
    sim = Sim()
    sim.initialize("a")
    during = sim.t
    sim.nemesis.append(_toxic("toxic_added", sim.tick()))
    st = sim.call("a", 2, idempotency_key="op-1")
    sim.notify(st, 1)
    _operation(sim, "a", "op-1", "unknown", "gave_up_after_read_timeout", during)
    sim.nemesis.append(_toxic("toxic_removed", sim.tick()))
    after = sim.tick(1.0)
    st = sim.call("a", 3, idempotency_key="op-2")
    sim.notify(st, 1)
    _operation(sim, "a", "op-2", "error", "tool_error", after)
    o = _measure(sim.write(tmp_path / "run"))
    (down,) = o.kinds
    assert (down.fault, down.attributed_by, down.fired, down.errors) == ("toxic:down", "time", 1, 1)
    assert down.rejected is None  # a toxic never explains a rejection: not known, not zero
    assert (o.calls.explained, o.calls.unexplained) == (1, 1)
    assert o.calls.unexplained_by_reason == {"error: tool_error": 1}


def _toxic(what: str, t: float) -> dict[str, Any]:
    return {
        "type": what,
        "t": t,
        "proxy": "mcp",
        "toxic": "down",
        "kind": "down",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {},
    }


@pytest.mark.parametrize(("delete_status", "explained"), [(200, 1), (405, 0)])
def test_a_session_race_reaches_the_later_flows_of_the_session_it_ended(
    tmp_path: Path, delete_status: int, explained: int
) -> None:
    """kill_session raced one flow; a later call of that session failed: its doing, unless
    the target refused the DELETE (405: nothing ended)."""
    sim = Sim()
    sim.initialize("a")
    raced = sim.call("a", 2, idempotency_key="op-raced")
    sim.respond(raced)
    session = sim.clients["a"].session
    sim.tap.append(
        {
            "type": "fault",
            "t": sim.tick(),
            "fault": "kill_session",
            "rule": "r-kill",
            "decision": "d-kill",
            "flow": raced.flow,
            "detail": {"delete_status": delete_status, "session": session, "order": "before"},
        }
    )
    started = sim.tick()
    later = sim.call("a", 3, idempotency_key="op-later")
    sim.notify(later, 1)
    _operation(sim, "a", "op-later", "unknown", "session_not_found", started)
    o = _measure(sim.write(tmp_path / "run"))
    assert _row(o, "kill_session").errors == explained
    assert (o.calls.explained, o.calls.unexplained) == (explained, 1 - explained)


def _quiet_run() -> Sim:
    """No fault of any kind; one call fails all the same."""
    sim = Sim()
    sim.initialize("a")
    started = sim.t
    st = sim.call("a", 2, idempotency_key="op-1")
    sim.notify(st, 2)
    _operation(sim, "a", "op-1", "error", "tool_error", started)
    return sim


def _report(run_dir: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    report_run(run_dir, figures=True, quiet=True, out=out, err=err)
    doc: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return doc


def _md_section(run_dir: Path) -> list[str]:
    """The lines of report.md's section "What each fault did" (blank lines left out, and
    the two spaces of a markdown line break)."""
    md = (run_dir / "report.md").read_text(encoding="utf-8").split("\n## ")
    (part,) = [p for p in md if p.startswith("What each fault did")]
    return [line.rstrip() for line in part.splitlines()[1:] if line.strip()]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # figures fork
def test_a_run_without_faults_says_so_in_one_line_and_draws_nothing(tmp_path: Path) -> None:
    run_dir = _quiet_run().write(tmp_path / "run")
    doc = _report(run_dir)
    fo = doc["fault_outcomes"]
    assert fo["status"] == "no_faults" and fo["kinds"] == []
    assert fo["failed_calls"] == 1 and fo["failed_calls_unexplained"] == 1
    assert _md_section(run_dir) == [
        "No fault fired in this run: nothing to attribute; 1 call(s) did not end ok."
    ]
    assert not (run_dir / FILE).exists()
    assert FILE not in [f["file"] for f in doc["figures"]]
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert (
        '<h2 id="fault_outcomes">What each fault did</h2>' in page
        and "<th>recoveries caused</th>" not in page
    )


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # figures fork
def test_the_report_shows_the_table_and_the_figure_when_faults_fired(tmp_path: Path) -> None:
    run_dir = faulted_run().sim.write(tmp_path / "run")
    doc = _report(run_dir)
    fo = doc["fault_outcomes"]
    assert fo["status"] == "ok" and [k["fault"] for k in fo["kinds"]] == ["cut_stream", "inject_foreign"]
    cut = fo["kinds"][0]
    # JSON has no infinity: a p99 that never came back is null and says so.
    assert cut["resume_p99_s"] is None and cut["resume_p99_unbounded"] is True
    lines = _md_section(run_dir)
    assert lines[0] == (
        "3 call(s) did not end ok: 1 with an injected fault on their flows, 2 with none (unexplained: "
        "1 never reached the proxy; error: tool_error 1, unknown: gave_up_after_connect_timeout 1)."
    )
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[2].startswith("| cut_stream | 1 | 0 | 1 | 0 of 1 | never | never | 1 |")
    assert rows[3].startswith("| inject_foreign | 2 | 2 | 2 | 2 of 2 |")
    assert rows[4].startswith("| no injected fault (unexplained) | — | — | 0 | — | — | — | 2 |")
    png = run_dir / FILE
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 10_000
    assert {"name": "fault_outcomes", "file": FILE, "title": "What each fault did"} in doc["figures"]
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'alt="What each fault did"' in page and "<td>no injected fault (unexplained)</td>" in page


def test_the_figure_is_drawn_from_the_section_and_only_with_faults(tmp_path: Path) -> None:
    faulted = load_run(faulted_run().sim.write(tmp_path / "faulted"))
    ctx = Context(faulted, parse_budgets(faulted.run))
    written, errors, _ = draw_all(faulted, tmp_path, specs=(), sections={"fault_outcomes": section(ctx)})
    assert errors == [] and [f["file"] for f in written] == [FILE] and (tmp_path / FILE).is_file()
    (tmp_path / FILE).unlink()
    quiet = load_run(_quiet_run().write(tmp_path / "quiet"))
    ctx = Context(quiet, parse_budgets(quiet.run))
    written, errors, _ = draw_all(quiet, tmp_path, specs=(), sections={"fault_outcomes": section(ctx)})
    assert written == [] and errors == [] and not (tmp_path / FILE).exists()
