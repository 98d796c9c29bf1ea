"""The capacity knee of a stepped ramp, on synthetic ramps that bend (or do not), and a
knee that coincides with a saturated lab process reported as the lab's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.checker.timeline.capacity import step_misses
from lab.checker.timeline.phases import Metrics
from tests.phases.world import Stretch, judged, phase, run_data, write_samples

RAMP = [
    phase("ramp-10", "ramp", 0, 10, users=10),
    phase("hold-10", "steady", 10, 40, users=10),
    phase("ramp-20", "ramp", 40, 50, users=20),
    phase("hold-20", "steady", 50, 80, users=20),
    phase("ramp-40", "ramp", 80, 90, users=40),
    phase("hold-40", "steady", 90, 120, users=40),
    phase("ramp-80", "ramp", 120, 130, users=80),
    phase("hold-80", "steady", 130, 160, users=80),
]


def ramp(*, last_latency: float = 9.0, last_events: float = 320, last_errors: float = 0.0) -> list[Stretch]:
    return [
        Stretch(0, 40, events_per_s=40, latency_s=0.2),
        Stretch(40, 80, events_per_s=80, latency_s=0.25),
        Stretch(80, 120, events_per_s=160, latency_s=0.4),
        Stretch(120, 160, events_per_s=last_events, latency_s=last_latency, error_share=last_errors),
    ]


def capacity(data: Any) -> dict[str, Any]:
    section = judged(data).sections["capacity"]
    assert isinstance(section, dict)
    return section


def test_knee_is_the_last_step_before_the_first_that_breaks_a_budget() -> None:
    cap = capacity(run_data(ramp(), RAMP))
    assert [s["users"] for s in cap["steps"]] == [10, 20, 40, 80]
    assert [s["holds"] for s in cap["steps"]] == [True, True, True, False]
    assert cap["knee_users"] == 40 and cap["knee_step"] == "ramp-40" and cap["knee_passed"] is True
    assert cap["past_knee"]["users"] == 80 and cap["past_knee"]["missed"] == ["resume_p99_s"]
    assert cap["past_knee"]["resume_p99_s"] == 9.0  # the metrics of the first step past it
    assert cap["bent_first"] == ["resume_p99_s"] and cap["bent_first_step"] == "ramp-80"
    assert cap["limited_by"] == "target" and "knee at 40 clients" in cap["text"]
    # Each step is judged on its hold, once its clients have arrived.
    assert cap["steps"][1]["judged_start"] - cap["steps"][1]["start"] == 10


def test_gate5_of_a_ramp_past_its_knee_is_judged_up_to_the_knee() -> None:
    gates = {g.gate: g for g in judged(run_data(ramp(), RAMP)).gates}
    assert gates["resume_p99"].verdict.value == "pass"  # the 9 s step past the knee found the knee
    assert "judged up to the capacity ramp's first step past its knee" in gates["resume_p99"].summary
    # A ramp whose first step already breaks the budget has no knee: gate 5 fails.
    first_fails = [Stretch(0, 40, events_per_s=40, latency_s=9.0), *ramp()[1:]]
    gates = {g.gate: g for g in judged(run_data(first_fails, RAMP)).gates}
    assert gates["resume_p99"].verdict.value == "fail"


def test_which_metric_bent_first_can_come_before_the_knee() -> None:
    # Events per client fall already at 40 clients (flat 80 events/s), errors break at 80.
    stretches = ramp(last_latency=0.4, last_events=80, last_errors=0.05)
    stretches[2] = Stretch(80, 120, events_per_s=80, latency_s=0.4)
    cap = capacity(run_data(stretches, RAMP))
    assert cap["knee_users"] == 40 and cap["past_knee"]["missed"] == ["call_error_rate"]
    assert cap["bent_first"] == ["events_per_client_s"] and cap["bent_first_step"] == "ramp-40"


def test_a_ramp_that_never_bends_has_no_knee_passed() -> None:
    cap = capacity(run_data(ramp(last_latency=0.5), RAMP))
    assert cap["knee_users"] == 80 and cap["knee_passed"] is False and cap["past_knee"] is None
    assert "no knee" in cap["text"]


def test_no_capacity_section_without_ramp_phases() -> None:
    assert judged(run_data([Stretch(0, 30)], [phase("steady", "steady", 0, 30)])).sections["capacity"] is None


def test_a_knee_found_while_a_worker_was_saturated_is_the_labs(tmp_path: Path) -> None:
    write_samples(
        tmp_path,
        {
            "worker-0": [(0, 120, 0.2), (120, 160, 0.98)],
            "mitmproxy": [(0, 160, 0.4)],
            "server": [(0, 160, 0.3)],
        },
    )
    cap = capacity(run_data(ramp(), RAMP, run_dir=tmp_path))
    assert cap["limited_by"] == "lab" and "limited by the lab (worker-0)" in cap["text"]
    lab = cap["limited_by_lab"]
    # 0.2 cores for 40 clients -> 0.4 for 80 -> one worker at 70 % is not enough: 2 needed.
    assert lab["processes"] == ["worker-0"] and lab["workers_needed"] == 2
    assert "millicores per client" in lab["basis"]
    assert cap["past_knee"]["lab_saturated"] == ["worker-0"]


def test_step_misses_is_the_live_rule() -> None:
    base: dict[str, Any] = dict(
        start=0.0,
        end=1.0,
        events=1,
        events_per_s=1.0,
        calls=100,
        calls_per_s=1.0,
        call_errors=0,
        call_error_rate=0.0,
        recoveries=10,
        never_recovered=0,
        resume_p50_s=0.1,
        resume_p99_s=0.5,
        resume_p99_unbounded=False,
        reconnects=5,
        reconnect_qps_peak=5,
        status_4xx=0,
        status_5xx=0,
        clients_max=1,
        faults={},
        lab_cpu_peak={},
        lab_saturated=(),
    )
    rules = {"resume_p99_s": 5.0, "call_error_rate_max": 0.01, "reconnect_qps": 10.0}
    assert step_misses(Metrics(**base), **rules) == []
    never = Metrics(**{**base, "resume_p99_s": None, "resume_p99_unbounded": True, "call_error_rate": 0.02})
    assert step_misses(never, **rules) == ["resume_p99_s", "call_error_rate"]
    assert step_misses(Metrics(**{**base, "reconnect_qps_peak": 11}), **rules) == ["reconnect_qps"]
