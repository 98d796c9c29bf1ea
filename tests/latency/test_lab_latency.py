"""The lab's own latency per hop, from built ledgers: the figures, the warning (and its
absence), the process it names, latency toxics, phases, resume latency net of the lab's
delay, and what is said when a hop cannot be measured."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lab.checker import judge
from lab.checker.context import Context, parse_budgets
from lab.checker.health.lab_latency import NOTE_PREFIX, section
from lab.report import markdown
from lab.report.document import document, rules_of
from tests.latency.world import T0, World, latency_toxic
from tests.phases.world import write_samples


def lab_latency(world: World, run_dir: Path | None = None) -> dict[str, Any]:
    data = world.run_data()
    if run_dir is not None:
        data.run_dir = run_dir
    out: dict[str, Any] = section(Context(data, parse_budgets(data.run)))
    return out


def hop(sec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(h for h in sec["hops"] if h["hop"] == name)
    return found


def gate5(world: World) -> dict[str, Any]:
    doc: Any = document(judge(world.run_data(), witness_limit=5))
    found: dict[str, Any] = next(g for g in rules_of(doc) if g["number"] == 5)
    return found


def slow_tail(worker: int, every: int, seconds: float) -> Any:
    """Delivery: 2 ms, but every `every`-th event of `worker`'s clients takes `seconds`."""
    return lambda w, i, _t: seconds if w == worker and i % every == 0 else 0.002


def test_each_hop_is_measured_per_event_and_per_request() -> None:
    # Event i of every client takes i ms: nearest-rank p50 is the 50th of 100, p99 the 99th.
    sec = lab_latency(
        World(delivery=lambda _w, i, _t: (i + 1) / 1000.0, request=lambda w, _t: 0.01 * (w + 1))
    )
    delivery = hop(sec, "delivery")
    assert delivery["count"] == 600 and delivery["unmatched"] == 0
    assert math.isclose(delivery["p50_s"], 0.050, abs_tol=1e-4)
    assert math.isclose(delivery["p99_s"], 0.099, abs_tol=1e-4)
    assert math.isclose(delivery["max_s"], 0.100, abs_tol=1e-4)
    assert {w["part"] for w in delivery["by_worker"]} == {"worker-0", "worker-1"}
    request = hop(sec, "request")
    assert request["count"] == 6 and math.isclose(request["max_s"], 0.02, abs_tol=1e-4)
    assert [w["p99_s"] for w in request["by_worker"]] == [0.01, 0.02]
    assert hop(sec, "nemesis")["why_not"] == "no nemesis log"
    assert hop(lab_latency(World(nemesis=[])), "nemesis")["why_not"] == "no latency toxic was in place"
    assert sec["warnings"] == [] and sec["warn_above_s"] == 0.5


def test_a_slow_worker_raises_the_warning_naming_it_and_gate_5_carries_it() -> None:
    slow = World(delivery=slow_tail(worker=1, every=10, seconds=0.8))
    sec = lab_latency(slow)
    (warned,) = sec["warnings"]
    assert warned["hop"] == "delivery" and warned["process"] == "worker-1", warned
    assert warned["p99_s"] == 0.8 and "its clients' p99" in warned["basis"]
    g = gate5(slow)
    assert any(n.startswith(NOTE_PREFIX) and "worker-1" in n and "'delivery'" in n for n in g["notes"]), g[
        "notes"
    ]
    # The same run with a fast worker: no warning, and gate 5 says nothing of the lab.
    clean = World(delivery=slow_tail(worker=1, every=10, seconds=0.02))
    assert lab_latency(clean)["warnings"] == []
    g_clean = gate5(clean)
    assert not any(n.startswith(NOTE_PREFIX) for n in g_clean["notes"])
    assert g["verdict"] == g_clean["verdict"]  # the warning never changes the verdict


def test_the_warning_follows_the_budget() -> None:
    # 0.8 s is 16 % of a 5 s budget (warned), 8 % of a 10 s one (not).
    assert lab_latency(World(delivery=slow_tail(1, 10, 0.8), budgets={"resume_p99_s": 5.0}))["warnings"]
    assert not lab_latency(World(delivery=slow_tail(1, 10, 0.8), budgets={"resume_p99_s": 10.0}))["warnings"]


def test_with_one_worker_the_busiest_process_on_the_path_is_named(tmp_path: Path) -> None:
    write_samples(
        tmp_path,
        {
            "worker-0": [(0, 12, 0.3)],
            "mitmproxy": [(0, 12, 0.95)],
            "nemesis": [(0, 12, 0.1)],
            "server": [(0, 12, 1.5)],
        },
    )
    sec = lab_latency(World(workers=1, delivery=slow_tail(0, 10, 0.9)), run_dir=tmp_path)
    (warned,) = sec["warnings"]
    assert warned["process"] == "mitmproxy" and "by CPU" in warned["basis"], warned  # never the server
    no_samples = lab_latency(World(workers=1, delivery=slow_tail(0, 10, 0.9)), run_dir=tmp_path / "none")
    assert "no process samples" in no_samples["warnings"][0]["basis"]


def test_the_upstream_hop_server_send_to_proxy(tmp_path: Path) -> None:
    # The server's sends reach the proxy 0.6 s late for every 20th event: mitmdump lags.
    write_samples(
        tmp_path, {"worker-0": [(0, 12, 0.99)], "mitmproxy": [(0, 12, 0.5)], "server": [(0, 12, 1.9)]}
    )
    world = World(upstream=lambda _w, i: 0.6 if i % 20 == 0 else 0.003)
    sec = lab_latency(world, run_dir=tmp_path)
    up = hop(sec, "upstream")
    assert up["count"] == 600 and up["p50_s"] == 0.003 and up["p99_s"] == 0.6 and up["by_worker"] == []
    (warned,) = sec["warnings"]
    # Only mitmdump is on this hop: never the busier worker, never the server (the target).
    assert warned["hop"] == "upstream" and warned["process"] == "mitmproxy", warned
    fast = lab_latency(World(upstream=lambda _w, _i: 0.003), run_dir=tmp_path)
    assert hop(fast, "upstream")["p99_s"] == 0.003 and fast["warnings"] == []
    assert "no server ledger" in hop(lab_latency(World()), "upstream")["why_not"]


def test_a_slow_request_hop_is_warned_too() -> None:
    sec = lab_latency(World(request=lambda w, _t: 0.9 if w == 0 else 0.001, clients_per_worker=30))
    (warned,) = sec["warnings"]
    assert warned["hop"] == "request" and warned["process"] == "worker-0", warned


def test_delay_inside_a_latency_toxic_is_the_faults_not_the_labs() -> None:
    # Events forwarded in [3, 5) s take 1.5 s (the toxic's configured 1500 ms); others 2 ms.
    inside = World(
        delivery=lambda _w, _i, t: 1.5 if T0 + 3 <= t < T0 + 5 else 0.002,
        nemesis=latency_toxic(3, 5, 1500, 100),
    )
    sec = lab_latency(inside)
    delivery = hop(sec, "delivery")
    assert delivery["p99_s"] == 1.5 and delivery["outside_toxics"]["p99_s"] == 0.002
    assert sec["warnings"] == []
    nemesis = hop(sec, "nemesis")
    assert nemesis["configured_max_s"] == 1.6 and nemesis["measured"] is False
    (window,) = nemesis["windows"]
    assert window["latency_ms"] == 1500 and window["start_s"] == 3 and window["end_s"] == 5
    # The same delay with no toxic in place is the lab's own: warned.
    assert lab_latency(World(delivery=lambda _w, _i, t: 1.5 if T0 + 3 <= t < T0 + 5 else 0.002))["warnings"]


def test_per_phase_figures() -> None:
    phases = [
        {"name": "calm", "kind": "steady", "start": 0, "duration": 6},
        {"name": "busy", "kind": "fault", "start": 6, "duration": 6},
    ]
    sec = lab_latency(World(phases=phases, delivery=lambda _w, _i, t: 0.3 if t >= T0 + 6 else 0.001))
    by_name = {p["name"]: p for p in sec["phases"]}
    assert by_name["calm"]["delivery"]["p99_s"] == 0.001 and by_name["busy"]["delivery"]["p99_s"] == 0.3
    assert by_name["calm"]["request"]["count"] == 6 and by_name["busy"]["request"]["count"] == 0
    assert lab_latency(World())["phases"] == []  # one implicit phase: the run's figures only


def test_resume_latency_net_of_the_labs_delivery_delay() -> None:
    # Lost at T0 + 2.0; the event that ended it (index 20) was forwarded at T0 + 3.0 and
    # accepted 0.6 s later: 1.6 s measured, 1.0 s without the lab's delay.
    world = World(
        workers=1,
        clients_per_worker=1,
        delivery=lambda _w, i, _t: 0.6 if i == 20 else 0.001,
        recoveries=[(0, 0, 2.0, 20)],
    )
    resume = lab_latency(world)["resume"]
    assert resume["recoveries"] == 1 and resume["joined"] == 1
    assert math.isclose(resume["p99_s"], 1.6, abs_tol=1e-3) and math.isclose(
        resume["net_p99_s"], 1.0, abs_tol=1e-3
    )
    assert math.isclose(gate5(world)["measured"]["p99_s"], 1.6, abs_tol=1e-3)  # the gate's own, unchanged


def test_hops_the_ledgers_cannot_show_are_said_not_measured() -> None:
    sec = lab_latency(World(t_request=False))
    request = hop(sec, "request")
    assert request["measured"] is False and "t_request" in request["why_not"]
    data = World().run_data()
    data.tap = None
    no_tap: dict[str, Any] = section(Context(data, parse_budgets(data.run)))
    assert all(not h["measured"] for h in no_tap["hops"]) and no_tap["warnings"] == []
    assert "no proxy record (proxy/tap.jsonl" in hop(no_tap, "delivery")["why_not"]


def test_report_md_shows_the_section_and_its_warning() -> None:
    doc: Any = document(judge(World(delivery=slow_tail(1, 10, 0.8)).run_data(), witness_limit=5))
    text = markdown.render(doc)
    assert "## Lab latency" in text
    assert (
        "Warning: the lab's own latency on one step of the chain, proxy forwards an event → client accepts "
        "it (hop 'delivery'), has p99 0.800 s" in text
    )
    assert "| proxy forwards an event → client accepts it | 600 | 0.002 s | 0.800 s | 0.800 s |" in text
    assert "| delivery | worker-1 |" in text  # the per-worker table
    clean: Any = document(judge(World().run_data(), witness_limit=5))
    clean_text = markdown.render(clean)
    assert "## Lab latency" in clean_text and "Warning:" not in clean_text


def keys(value: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out |= {k} | keys(v)
    elif isinstance(value, list):
        for v in value:
            out |= keys(v)
    return out


def test_every_field_of_the_section_is_documented() -> None:
    phases = [{"name": "calm", "kind": "steady", "start": 0, "duration": 6}]
    world = World(
        delivery=slow_tail(1, 10, 0.8),
        nemesis=latency_toxic(3, 5, 100),
        phases=phases,
        recoveries=[(0, 0, 2, 20)],
    )
    doc: Any = document(judge(world.run_data(), witness_limit=5))
    names = keys(doc["lab_latency"])
    documented = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in documented)
    assert not missing, f"docs/report.md does not document {missing}"
    assert {"windows", "outside_toxics", "by_worker", "net_p99_s", "warnings"} <= names


def test_gate_5_failing_on_latency_while_the_lab_adds_half_the_budget_is_inconclusive() -> None:
    """Slow recoveries fail gate 5. When the lab's own hops on a resumption's path add half
    the budget or more at p99, the latency is mostly the lab's: inconclusive, saying so;
    with a fast lab the same recoveries FAIL."""
    slow = [(w, c, 1.0, 80) for w in range(2) for c in range(3)]  # each recovered ~8 s later
    fast_lab = gate5(World(recoveries=slow))
    assert fast_lab["verdict"] == "fail", fast_lab["summary"]
    assert "limited by the lab" not in fast_lab["summary"]
    slow_lab = gate5(World(recoveries=slow, request=lambda _w, _t: 3.0))
    assert slow_lab["verdict"] == "inconclusive", slow_lab["summary"]
    assert "limited by the lab: its own steps of the chain add p99 3." in slow_lab["summary"]
    assert "(client send → proxy sees the request 3." in slow_lab["summary"]
    assert any(e["name"] == "lab latency" and not e["ok"] for e in slow_lab["evidence"])
