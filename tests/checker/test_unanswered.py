"""Unanswered requests by hop (`lab.checker.health.unanswered`) and the lab's limit on them
(`lab.checker.health.lab_limits.unanswered_limit`), on runs built by hand from the ledgers'
real record shapes (tests/checker/builders.py; docs/ledgers.md):

- every request left without an answer is counted at the hop where it was lost, and
  what is not unanswered (closed early by its client, lost to an injected fault) is not;
- a collapse while a lab part is saturated (a nemesis out of file descriptors, mitmdump
  at a full core, connections failing before the proxy) makes a failing gate 5
  inconclusive, the part and the reason named; the same collapse with no saturated part
  leaves gate 5 failing, the hop named; a wire violation by the server stays a failure;
- a clean run counts 0 of its requests, with no note.
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path
from typing import Any

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import GateResult, RunReport, Verdict
from lab.report.markdown import render
from lab.report.outputs import report_run
from tests.checker.builders import Sim, clean_run
from tests.helpers.process_samples import samples, write_samples

BUDGET_S = 5.0


def check(sim: Sim, run_dir: Path, samples: list[dict[str, Any]] | None = None) -> RunReport:
    sim.write(run_dir)
    if samples is not None:
        write_samples(run_dir, samples)
    _, report = judge_dir(run_dir)
    return report


def gate5(report: RunReport) -> GateResult:
    return next(g for g in report.gates if g.gate == "resume_p99")


def section(report: RunReport) -> dict[str, Any]:
    found = report.sections["unanswered"]
    assert isinstance(found, dict), report.problems
    return found


def lost(
    sim: Sim,
    client: str,
    hop: str,
    *,
    at: float,
    wait: float = 20.0,
    error: str = "read_timeout",
    faults: list[dict[str, Any]] | None = None,
    purpose: str = "call",
) -> None:
    """One request of `client` that got no answer, lost at `hop`, as each part writes it:
    the client's exchange (status NULL), the tap's flow (none before the proxy; status
    null, or the one the proxy passed) with its end, the server's answer where it gave one."""
    conn_id = sum(1 for r in sim.client_rows.get("http_exchanges", []) if r["client_id"] == client) + 1
    conn = f"{client}:{conn_id}"
    sim.client_row(
        "http_exchanges",
        client_id=client,
        conn_id=conn_id,
        purpose=purpose,
        method="POST",
        stream_key=f"post:{conn_id}" if purpose == "call" else None,
        status=None,
        session=None,
        session_generation=1,
        carried_session=0,
        started_at=at,
        ended_at=at + wait,
        error=error,
        last_event_id=None,
    )
    if hop == "client_to_proxy":
        return
    sim.flows += 1
    flow = f"lost{sim.flows}"
    status = 200 if hop == "proxy_to_client" else None
    sim.flow_record(flow, conn, "POST", None, status=status, faults=faults or [], t_request=at + 0.01)
    sim.tap[-1]["t"] = at + (0.02 if status else wait)
    sim.tap.append({"type": "flow_end", "flow": flow, "t": at + wait, "reason": "client_gone"})
    if hop in ("server_to_proxy", "proxy_to_client"):
        sim.server_row(
            "requests",
            at=at + 0.015,
            method="POST",
            conn=conn,
            session=None,
            status=200,
            reason=None,
            origin=None,
            origin_allowed=None,
            protocol_version=None,
            last_event_id=None,
            cursor_verdict=None,
        )


def never_recovered(sim: Sim, client: str, lost_at: float) -> None:
    sim.client_row(
        "recoveries",
        client_id=client,
        stream_key="post:1",
        operation_key=f"{client}/k1",
        cause="read_timeout",
        lost_at=lost_at,
        recovered_at=None,
        path="abandoned",
        attempts=3,
        reinitialized=0,
    )


def collapse(sim: Sim, n: int = 30, hop: str = "client_to_proxy", error: str = "read_timeout") -> float:
    """`n` clients whose calls are lost at `hop` within one 10 s bin and never recover;
    the run goes on long enough that none of it is censored. Returns when it began."""
    start = sim.t + 1.0
    for i in range(n):
        lost(sim, f"c{i}", hop, at=start + i * 0.1, error=error)
        never_recovered(sim, f"c{i}", start + i * 0.1 + 20.0)
    sim.t = start + 60.0
    return start


CALM = {"mitmproxy": (0.3, 200, 20_000), "worker-0": (0.4, 120, 20_000), "server": (0.2, 80, 20_000)}


# ---------------------------------------------------------------------------- the hops


def test_each_unanswered_request_is_counted_at_the_hop_where_it_was_lost(tmp_path: Path) -> None:
    sim = clean_run().sim
    t = sim.t + 1.0
    for n, hop in enumerate(("client_to_proxy", "proxy_to_server", "server_to_proxy", "proxy_to_client")):
        lost(sim, f"h{n}", hop, at=t + n)
    # Not unanswered: a request its client closed at its exit after 0.5 s, one whose
    # response a proxy fault withheld, one sent while a nemesis toxic reset connections.
    lost(sim, "early", "proxy_to_server", at=t + 5, wait=0.5, error="client_stopped")
    withheld = [{"fault": "lose_delete_response", "rule": "r1", "decision": "d-1"}]
    lost(sim, "faulted", "proxy_to_client", at=t + 6, faults=withheld)
    toxic = {"proxy": "mcp", "toxic": "reset", "kind": "reset_peer", "stream": "downstream", "toxicity": 1.0}
    sim.nemesis += [
        {"type": "toxic_added", "t": t + 29.9, "listen": "x", "upstream": "y", "attributes": {}, **toxic},
        {"type": "toxic_removed", "t": t + 31, "listen": "x", "upstream": "y", "attributes": {}, **toxic},
    ]
    # (After the others gave up: a request in flight while such a toxic was in place is the
    # fault's, however long it waited.)
    lost(sim, "toxic", "client_to_proxy", at=t + 30, wait=0.5, error="connection_reset")
    sim.t = t + 60
    report = check(sim, tmp_path / "run")
    un = section(report)
    assert un["status"] == "ok" and un["sources"] == ["client", "tap", "server"]
    assert un["unanswered"] == 4
    assert un["by_hop"] == {
        "client_to_proxy": 1,
        "proxy_to_server": 1,
        "server_to_proxy": 1,
        "proxy_to_client": 1,
    }
    assert un["closed_early"] == 1
    assert un["by_fault"] == {
        "client_to_proxy": 1,
        "proxy_to_server": 0,
        "server_to_proxy": 0,
        "proxy_to_client": 1,
    }
    assert un["sent"] == un["answered_at_client"] + 4 + 1 + 2
    assert un["reached_proxy"] == un["sent"] - 2  # the two lost before the proxy
    witnessed = {w["hop"]: w for w in un["witnesses"]}
    assert set(witnessed) == set(un["by_hop"])
    assert "the proxy never saw it" in witnessed["client_to_proxy"]["explanation"]
    assert "the server answered 200 (its ledger)" in witnessed["server_to_proxy"]["explanation"]
    assert witnessed["proxy_to_client"]["refs"][1].startswith("proxy/tap.jsonl:")
    assert witnessed["client_to_proxy"]["refs"] == [
        f"clients/worker-1.sqlite#http_exchanges/{_rowid(tmp_path / 'run', 'h0')}"
    ]
    lost_bins = [b for b in un["bins"] if b["unanswered"]]
    assert sum(b["unanswered"] for b in lost_bins) == 4 and all(b["start_s"] >= 0 for b in lost_bins)


def _rowid(run_dir: Path, client: str) -> int:
    db = sqlite3.connect(run_dir / "clients" / "worker-1.sqlite")
    try:
        (rowid,) = db.execute("SELECT rowid FROM http_exchanges WHERE client_id = ?", (client,)).fetchone()
    finally:
        db.close()
    return int(rowid)


def test_a_clean_run_counts_zero_unanswered_and_notes_nothing(tmp_path: Path) -> None:
    report = check(clean_run().sim, tmp_path / "run")
    un = section(report)
    assert un["status"] == "ok" and un["sent"] > 10
    assert un["unanswered"] == 0 and un["sent"] == un["answered_at_client"] == un["reached_proxy"]
    assert un["many"] is False and un["lab_limit"] is None and un["witnesses"] == []
    assert report.verdict is Verdict.PASS
    assert report.liveness is not None and not any("unanswered" in n for n in report.liveness.notes)
    assert not any("limited by the lab" in n for n in gate5(report).notes)


# ---------------------------------------------------------------------------- the verdict


def test_a_collapse_while_the_nemesis_runs_out_of_fds_is_the_labs_not_the_targets(tmp_path: Path) -> None:
    sim = clean_run().sim
    start = collapse(sim)
    full = samples(start - 5, start + 30, nemesis=(0.3, 1_950, 2_000), **CALM)
    report = check(sim, tmp_path / "run", full)
    g = gate5(report)
    assert g.verdict is Verdict.INCONCLUSIVE, g.summary
    assert "limited by the lab (nemesis)" in g.summary
    assert "nemesis: 1,950 of 2,000 file descriptors" in g.summary
    assert any(e.name == "lab not saturated" and not e.ok for e in g.evidence)
    assert report.verdict is not Verdict.FAIL
    un = section(report)
    assert un["by_hop"]["client_to_proxy"] == 30 and un["many"] is True
    assert un["lab_limit"]["parts"] == ["nemesis"]
    assert un["lab_limit"]["reasons"] == ["nemesis: 1,950 of 2,000 file descriptors"]
    # The same collapse, the nemesis far from its limit: nothing excuses the failure.
    sim = clean_run().sim
    start = collapse(sim)
    report = check(sim, tmp_path / "calm", samples(start - 5, start + 30, nemesis=(0.3, 300, 2_000), **CALM))
    g = gate5(report)
    assert g.verdict is Verdict.FAIL and "limited by the lab" not in g.summary
    assert section(report)["lab_limit"] is None and report.verdict is Verdict.FAIL


def test_mitmproxy_at_a_full_core_makes_the_upstreams_silence_the_labs(tmp_path: Path) -> None:
    sim = clean_run().sim
    start = collapse(sim, hop="proxy_to_server")
    hot = {**CALM, "mitmproxy": (0.98, 400, 20_000)}
    report = check(sim, tmp_path / "run", samples(start - 5, start + 30, nemesis=(0.2, 300, 20_000), **hot))
    g = gate5(report)
    assert g.verdict is Verdict.INCONCLUSIVE and "mitmproxy: CPU 0.98 core" in g.summary
    assert section(report)["lab_limit"]["by_hop"]["proxy_to_server"] == 30
    # A nemesis out of fds does not carry the proxy's upstream: the target's silence stays
    # the target's.
    sim = clean_run().sim
    start = collapse(sim, hop="proxy_to_server")
    report = check(
        sim, tmp_path / "nemesis", samples(start - 5, start + 30, nemesis=(0.2, 1_950, 2_000), **CALM)
    )
    g = gate5(report)
    assert g.verdict is Verdict.FAIL and section(report)["lab_limit"] is None
    assert section(report)["lab_saturated"] == ["nemesis: 1,950 of 2,000 file descriptors"]
    md = render(_doc(tmp_path / "nemesis"))
    assert "most were lost at proxy → server" in md and "do not carry the hops that dropped them" in md
    # And with no lab part saturated at all, the section says that too.
    sim = clean_run().sim
    start = collapse(sim, hop="proxy_to_server")
    report = check(sim, tmp_path / "calm", samples(start - 5, start + 30, **CALM))
    assert gate5(report).verdict is Verdict.FAIL
    assert "no lab part was saturated" in render(_doc(tmp_path / "calm"))


def test_connections_failing_before_the_proxy_name_the_first_hop_unless_a_toxic_did_it(
    tmp_path: Path,
) -> None:
    sim = clean_run().sim
    collapse(sim, error="connection_reset")
    report = check(sim, tmp_path / "run")  # no process samples at all: the ledgers say it
    g = gate5(report)
    assert g.verdict is Verdict.INCONCLUSIVE
    assert "nemesis: 30 connections failed before the proxy (connection_reset 30)" in g.summary
    assert section(report)["connection_errors"] == 30
    # The same resets while a reset_peer toxic was in place: the fault's, counted apart.
    sim = clean_run().sim
    start = collapse(sim, error="connection_reset")
    toxic = {"proxy": "mcp", "toxic": "r", "kind": "reset_peer", "stream": "upstream", "toxicity": 1.0}
    sim.nemesis += [
        {"type": "toxic_added", "t": start - 1, "listen": "x", "upstream": "y", "attributes": {}, **toxic},
        {"type": "toxic_removed", "t": start + 25, "listen": "x", "upstream": "y", "attributes": {}, **toxic},
    ]
    report = check(sim, tmp_path / "toxic")
    un = section(report)
    assert un["unanswered"] == 0 and un["by_fault"]["client_to_proxy"] == 30 and un["lab_limit"] is None
    assert gate5(report).verdict is Verdict.FAIL


def test_a_wire_violation_or_recoveries_failing_on_their_own_stay_the_targets(tmp_path: Path) -> None:
    starved = {**CALM, "nemesis": (0.3, 1_990, 2_000)}
    # The server started a 2025-11-25 POST stream without its priming event.
    sim = clean_run().sim
    st = sim.call("a", 40)
    sim.tap[:] = [r for r in sim.tap if not (r["type"] == "sent" and r["flow"] == st.flow and r["priming"])]
    sim.respond(st)
    for r in sim.tap:
        if r["type"] == "flow":
            r["protocol_version_out"] = "2025-11-25"
    start = collapse(sim)
    report = check(sim, tmp_path / "wire", samples(start - 5, start + 30, **starved))
    g = gate5(report)
    assert g.verdict is Verdict.FAIL and g.measured["no_priming"] == 1
    assert any("limited by the lab (nemesis)" in n for n in g.notes)  # said, but no excuse
    # Clients the collapse never touched failed to recover too: the failure stands.
    sim = clean_run().sim
    start = collapse(sim)
    for i in range(5):
        never_recovered(sim, f"untouched{i}", start + 2)
    report = check(sim, tmp_path / "untouched", samples(start - 5, start + 30, **starved))
    g = gate5(report)
    assert g.verdict is Verdict.FAIL
    assert any("the failure stands" in n for n in g.notes), g.notes


# ---------------------------------------------------------------------------- every output


def _doc(run_dir: Path) -> dict[str, Any]:
    """The run's report.json, writing every output first (as `lab report` does)."""
    report_run(run_dir, figures=False, out=io.StringIO(), err=io.StringIO())
    doc: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return doc


def test_the_section_and_the_note_reach_every_output(tmp_path: Path) -> None:
    sim = clean_run().sim
    start = collapse(sim)
    run_dir = tmp_path / "run"
    sim.write(run_dir)
    write_samples(run_dir, samples(start - 5, start + 30, nemesis=(0.3, 1_950, 2_000), **CALM))
    doc = _doc(run_dir)
    assert doc["unanswered"]["unanswered"] == 30
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    for text in (md, html):
        assert "Unanswered requests by hop" in text
        assert "nemesis: 1,950 of 2,000 file descriptors" in text
    assert "30 of " in md and "most at client → proxy" in md
    assert "requests went unanswered, most at client → proxy" in md  # the liveness line
    # A clean run shows the section too, with its zero.
    clean = tmp_path / "clean"
    clean_run().sim.write(clean)
    _doc(clean)
    md = (clean / "report.md").read_text(encoding="utf-8")
    assert "## Unanswered requests by hop" in md and "0 of " in md and "Verdict note" not in md


def test_what_the_ledgers_cannot_say_is_said_never_all_answered(tmp_path: Path) -> None:
    # No request at all: "no requests", not "0 unanswered".
    report = check(Sim(), tmp_path / "empty")
    assert section(report)["status"] == "no_requests"
    md = render(_doc(tmp_path / "empty"))
    assert 'No request in the ledgers: nothing to count (inconclusive, not "all answered")' in md
    assert "requests went unanswered" not in md
    # No tap: the client's unanswered requests are counted, no hop is.
    sim = clean_run().sim
    collapse(sim, n=3, hop="proxy_to_server")
    sim.write(tmp_path / "no-tap", tap=False)
    _, report = judge_dir(tmp_path / "no-tap")
    un = section(report)
    assert un["status"] == "tap_missing" and un["unanswered"] == 3 and un["reached_proxy"] is None
    assert set(un["by_hop"].values()) == {None} and un["lab_limit"] is None
    # No client ledger (a client under test): the tap's flows, from the proxy on.
    sim = clean_run().sim
    collapse(sim, n=3, hop="proxy_to_server")
    run_dir = sim.write(tmp_path / "no-client")
    for f in (run_dir / "clients").iterdir():
        f.unlink()
    _, report = judge_dir(run_dir)
    un = section(report)
    assert un["status"] == "client_unknown" and un["sent"] is None
    assert un["by_hop"]["proxy_to_server"] == 3 and un["by_hop"]["client_to_proxy"] is None
