"""Scenario files: every shipped one loads, and every kind of mistake is named with file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.faults.kinds import NAMES, Need, kind_of
from lab.faults.plan import parse_plan
from lab.scenario import SCENARIO_DIR, ScenarioError, load_scenario, scenario_names
from lab.scenario.write import scenario_toml

REQUIRED = {"smoke", "gate-100k", "storm", "chaos-day", "capacity", "clients-2000", "tcp-toxics"}
BUDGET_KEYS = {
    "reconnect_qps",
    "resume_p99_s",
    "cross_stream_max",
    "duplicate_dispatch_max",
    "missing_rehandshake_max",
    "origin_reject_rate",
    "min_events",
    "min_recoveries",
    "min_404",
    "min_illegal_origin",
    # Tolerances of gate 7, the capacity knee and the rollout (docs/scenarios.md).
    "recovery_events_ratio",
    "recovery_resume_p99_factor",
    "recovery_resume_p99_slack_s",
    "recovery_error_rate_slack",
    "min_baseline_events",
    "call_error_rate_max",
    "min_rollout_sessions",
    # Rule 16's, in a capacity check.
    "unanswered_max_share",
    "answer_p99_s",
}

MINIMAL = """
seed = 1
load = { users = 5, duration = "10s" }
"""


def family_scenario(kind: str) -> str:
    return kind.replace("_", "-")


# ---------------------------------------------------------------------- shipped scenarios


@pytest.mark.parametrize("name", scenario_names())
def test_every_shipped_scenario_loads_and_is_bounded(name: str) -> None:
    sc = load_scenario(name)
    assert sc.name == name and sc.path == SCENARIO_DIR / f"{name}.toml"
    assert sc.load.duration is not None or sc.load.event_target is not None
    assert sc.load.hard_timeout >= (sc.load.duration or 0)
    assert set(sc.budgets()) == BUDGET_KEYS
    json.dumps(sc.to_dict())  # run.json takes it as is
    plan = parse_plan(sc.fault_plan_json(1_000.0))
    assert plan.rules == sc.faults and plan.run_start == 1_000.0 and plan.seed == sc.seed
    for w in sc.fault_windows(1_000.0):
        assert 1_000.0 <= w["start"] < w["end"] <= 1_000.0 + sc.horizon
    assert sc.stages()[-1]["until"] == pytest.approx(sc.horizon)


def test_the_required_scenarios_and_one_per_fault_family() -> None:
    names = set(scenario_names())
    assert names >= REQUIRED
    for kind in NAMES:
        sc = load_scenario(family_scenario(kind))
        assert kind in {r.kind for r in sc.faults}, f"{sc.name} does not exercise {kind}"


def test_smoke_is_small_and_short() -> None:
    sc = load_scenario("smoke")
    assert 10 <= sc.load.users <= 30 and sc.duration is not None and sc.duration < 60
    assert 1 <= len(sc.faults) <= 8


def test_smoke_gives_every_gate_its_evidence() -> None:
    # `make run` must be able to pass: each gate needs a fault that makes its evidence.
    kinds = [kind_of(r.kind) for r in load_scenario("smoke").faults]
    for gate in (1, 2, 3, 4, 5):
        assert any(gate in k.feeds for k in kinds), f"no fault of smoke makes evidence for gate {gate}"


def test_smoke_needs_no_admin_control() -> None:
    # `lab run smoke --target URL` must work: its 404s come from kill_session, a real DELETE.
    sc = load_scenario("smoke")
    assert not [r.kind for r in sc.faults if Need.ADMIN_CONTROL in kind_of(r.kind).needs]
    assert "kill_session" in {r.kind for r in sc.faults} and sc.budgets()["min_404"] >= 1


def test_gate_100k_has_every_family_and_enough_events() -> None:
    sc = load_scenario("gate-100k")
    # Every kind of the gate's era (the handshake era's; the modern era's own: modern-smoke).
    assert {r.kind for r in sc.faults} == {n for n in NAMES if kind_of(n).only_modern is None}
    assert sc.toxics and sc.load.event_target is not None and sc.load.event_target >= 100_000
    assert sc.budgets()["min_events"] >= 100_000


def test_storm_has_every_shape_and_a_budget() -> None:
    sc = load_scenario("storm")
    shapes = {getattr(r.params, "shape", None) for r in sc.faults if r.kind == "storm"}
    assert shapes == {"burst", "sustained", "ramp"}
    assert sc.budgets()["reconnect_qps"] == sc.reconnect.budget_qps


def test_chaos_day_is_a_timeline_with_faults_only_in_fault_phases() -> None:
    sc = load_scenario("chaos-day")
    assert {p.kind for p in sc.phases} >= {"steady", "faults", "recovery", "quiet"}
    fault_phases = [(p.start, p.end) for p in sc.phases if p.kind == "faults"]
    for r in sc.faults:
        assert r.window is not None and (r.window.start, r.window.end) in fault_phases


def test_capacity_ramps_and_2000_clients() -> None:
    users = [s["users"] for s in load_scenario("capacity").stages()]
    assert users == sorted(users) and users[-1] > users[0]
    assert load_scenario("clients-2000").load.users >= 2000


def test_toxics_schedule_is_plain_data() -> None:
    sched = load_scenario("tcp-toxics").toxics_schedule()
    assert {t["kind"] for t in sched} == {
        "latency",
        "bandwidth",
        "slicer",
        "slow_close",
        "limit_data",
        "reset_peer",
        "timeout",
    }
    first = sched[0]
    assert first == {
        "name": "latency-0",
        "kind": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 150, "jitter": 50},
        "at": 10.0,
        "until": 30.0,
    }
    assert [t["at"] for t in sched] == sorted(t["at"] for t in sched)


def test_serve_args_follow_the_target() -> None:
    # What `lab run` gives a `lab serve` without `--config` (lab.run.serverconf).
    from lab.run.serverconf import server_settings, settings_as_flags

    args = settings_as_flags(server_settings(load_scenario("old-token").target, admin_token=None))
    (tokens,) = [a for a in args if a.startswith("--tokens=")]
    assert "alice-token=alice" in tokens


# ---------------------------------------------------------------------- mistakes


def load_text(tmp_path: Path, text: str, name: str = "bad") -> list[str]:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert e.value.path == str(path)
    for line in str(e.value).splitlines()[1:]:
        assert line.startswith(f"{path}: "), line
    return [str(p) for p in e.value.problems]


def test_restarts_of_each_target(tmp_path: Path) -> None:
    ref = load_scenario("restart")
    assert ref.target.store == "durable" and [(r.at, r.how, r.down) for r in ref.restarts] == [
        (15.0, "stop", 1.0),
        (30.0, "stop", 1.0),
    ]
    assert load_scenario("restart-volatile").target.store == "volatile"
    assert ref.to_dict()["restarts"] == [
        {"at": 15.0, "how": "stop", "down": 1.0},
        {"at": 30.0, "how": "stop", "down": 1.0},
    ]
    path = tmp_path / "url.toml"
    path.write_text(
        MINIMAL
        + '[target]\nkind = "url"\nurl = "http://127.0.0.1:1/mcp"\nrestart_command = ["docker", "restart", "x"]\n'
        + 'restart_timeout = "20s"\n[[restarts]]\nat = "5s"\n'
    )
    url = load_scenario(path)
    assert url.target.restart_command == ("docker", "restart", "x") and url.target.restart_timeout == 20.0
    assert [r.at for r in url.restarts] == [5.0]


def test_minimal_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "mini.toml"
    path.write_text(MINIMAL)
    sc = load_scenario(path)
    assert sc.load.hard_timeout == 80.0 and sc.load.spawn_rate == 5.0 and sc.faults == ()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('colour = "red"', "colour: unknown key"),
        ("seeed = 2", "seeed: unknown key (did you mean 'seed'?)"),
        ('[target]\nkind = "remote"', "target.kind: expected one of 'reference', 'url', got 'remote'"),
        ('[target]\nkind = "url"', "target.url: required when kind = 'url'"),
        (
            '[target]\nkind = "url"\nurl = "http://x/mcp"\ndelete = "refuse"',
            "target.delete: only for kind = 'reference'",
        ),
        ('[target]\nurl = "http://x/mcp"', "target.url: only for kind = 'url'"),
        (
            '[target]\nprotocol_version = "2026-07-28"',
            'target.protocol_version: 2026-07-28 is the modern era\'s revision: set era = "modern"',
        ),
        (
            '[target]\nprotocol_version = "2024-01-01"',
            "target.protocol_version: expected one of '2025-03-26'",
        ),
        (
            '[target]\nera = "future"',
            "target.era: expected one of 'handshake', 'modern', 'both', got 'future'",
        ),
        (
            '[target]\nera = "modern"\n[[faults]]\nkind = "drop_priming"\nrate = 0.1',
            "faults[0].kind: drop_priming has no meaning in the modern era (2026-07-28 has no priming event)",
        ),
        ('[target.tokens]\n"bad token" = "x"', "target.tokens.bad token: expected a bearer token"),
        ("[reconnect]\nbudget_qps = 0", "reconnect.budget_qps: expected a number > 0, got 0"),
        (
            '[reconnect]\nbackoff_base = "2s"\nbackoff_cap = "1s"',
            "reconnect.backoff_cap: must be >= backoff_base",
        ),
        (
            "[budgets]\norigin_reject_rate = 1.5",
            "budgets.origin_reject_rate: expected a number in 0..1, got 1.5",
        ),
        ('[budgets]\nresume_p99_s = "fast"', "budgets.resume_p99_s: expected a duration like"),
        ("[budgets]\nmin_events = -1", "budgets.min_events: expected an integer >= 0, got -1"),
        ('[[faults]]\nkind = "storm"\nrate = 1.5', "faults[0].rate: expected a number in 0..1, got 1.5"),
        (
            '[[faults]]\nkind = "storm"\nrate = "often"',
            "faults[0].rate: expected a number in 0..1, got 'often'",
        ),
        ('[[faults]]\nkind = "meteor"\nrate = 0.1', "faults[0].kind: unknown fault 'meteor'"),
        (
            '[[faults]]\nkind = "storm"\nrate = 0.1\nwindow = { start = "5 seconds" }',
            "faults[0].window.start: expected a duration like '30s'",
        ),
        (
            '[[faults]]\nkind = "storm"\nrate = 0.1\nwindow = { start = "20s" }',
            "faults[0].window: never active: it starts at 20s and the run lasts 10s",
        ),
        (
            '[[faults]]\nkind = "storm"\nrate = 0.1\nphase = "x"',
            "faults[0].phase: unknown phase 'x' (phases: none",
        ),
        (
            '[[faults]]\nkind = "cut_stream"\nrate = 0.1\nparams = { min_index = "one" }',
            "faults[0].params.min_index: expected an integer >= 0, got 'one'",
        ),
        (
            '[[faults]]\nkind = "expiry_race"\nrate = 0.1\n[target]\nkind = "url"\nurl = "http://127.0.0.1:1/mcp"',
            "faults[0].kind: expiry_race needs the reference server",
        ),
        (
            '[[faults]]\nkind = "old_token"\nrate = 0.1',
            "faults[0].kind: old_token needs target.tokens with at least two subjects",
        ),
        ('[[toxics]]\nkind = "latency"', "toxics[0].attributes.latency: required for a latency toxic"),
        (
            '[[toxics]]\nkind = "latency"\nattributes = { latency = 5, jiter = 1 }',
            "toxics[0].attributes.jiter: unknown key (did you mean 'jitter'?)",
        ),
        (
            '[[toxics]]\nkind = "latency"\ntoxicity = 0\nattributes = { latency = 5 }',
            "toxics[0].toxicity: 0 is not allowed",
        ),
        ('[[toxics]]\nkind = "earthquake"', "toxics[0].kind: expected one of 'latency'"),
        (
            '[[toxics]]\nkind = "slicer"\nattributes = { average_size = 4, size_variation = 4 }',
            "toxics[0].attributes: slicer.size_variation (4) must be smaller than slicer.average_size (4)",
        ),
        (
            '[[toxics]]\nkind = "bandwidth"\nstream = "sideways"\nattributes = { rate = 1 }',
            "toxics[0].stream: expected one of 'downstream', 'upstream'",
        ),
        (
            '[[toxics]]\nkind = "timeout"\nat = "5s"\nuntil = "2s"\nattributes = { timeout = 1 }',
            "toxics[0].until: must be after at",
        ),
        ('[[restarts]]\nhow = "stop"', "restarts[0].at: required"),
        ('[[restarts]]\nat = "2s"\nhow = "reboot"', "restarts[0].how: expected one of 'stop', 'crash'"),
        ('[[restarts]]\nat = "12s"', "restarts[0].at: never happens: the run lasts 10s"),
        (
            '[[restarts]]\nat = "2s"\n[[restarts]]\nat = "4s"',
            "restarts[1].at: must be at least 4s after the previous restart's at (2s)",
        ),
        (
            '[[restarts]]\nat = "2s"\nhow = "crash"\n[target]\nkind = "url"\nurl = "http://127.0.0.1:1/mcp"',
            "restarts[0].how: only for target.kind = 'reference'",
        ),
        (
            '[target]\nstore = "disk"',
            "target.store: expected one of 'volatile', 'durable', 'shared', got 'disk'",
        ),
        (
            '[target]\nkind = "url"\nurl = "http://127.0.0.1:1/mcp"\nstore = "durable"',
            "target.store: only for kind = 'reference'",
        ),
        ('[target]\nrestart_command = ["true"]', "target.restart_command: only for kind = 'url'"),
        ("[target]\nreplicas = 3", "target.affinity: required with replicas > 1"),
        ('[target]\nreplicas = 0\naffinity = "none"', "target.replicas: expected an integer in 1..16, got 0"),
        ('[target]\nstore = "shared"', "target.store: 'shared' needs replicas > 1"),
        ('[target]\naffinity = "session"', "target.affinity: only with replicas > 1"),
        (
            '[target]\nreplicas = 2\naffinity = "none"\n[[restarts]]\nat = "2s"',
            "restarts[0].at: restarts of replicas are not supported yet",
        ),
        (
            '[target]\nkind = "url"\nurl = "http://127.0.0.1:1/mcp"\nrestart_command = "docker restart x"',
            "target.restart_command: expected a non-empty list",
        ),
    ],
)
def test_each_mistake_is_named(tmp_path: Path, extra: str, expected: str) -> None:
    got = load_text(tmp_path, MINIMAL + "\n" + extra + "\n")
    assert any(p.startswith(expected) for p in got), got


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[load]\nusers = 5\nduration = "10s"', "seed: required"),
        ('seed = 1\n[load]\nusers = "5"\nduration = "10s"', "load.users: expected an integer >= 1, got '5'"),
        (
            'seed = 1\n[load]\nusers = true\nduration = "10s"',
            "load.users: expected an integer >= 1, got true",
        ),
        ("seed = 1\n[load]\nusers = 5", "load.duration: give a duration, an event_target, or both"),
        (
            'seed = 1\n[load]\nusers = 5\nduration = "1m"\nhard_timeout = "30s"',
            "load.hard_timeout: must be >= the duration",
        ),
        (
            'seed = 1\n[load]\nusers = 5\nduration = "1m"\nworkers = 9',
            "load.workers: more workers (9) than users (5)",
        ),
        (
            'seed = 1\n[load]\nusers = 5\nduration = "1m"\n[load.mix]\nread = 0\nstream = 0\nwrite = 0',
            "load.mix.read: the task mix needs",
        ),
        (
            'seed = 1\nname = "other"\n[load]\nusers = 5\nduration = "1m"',
            "name: must match the file name 'bad'",
        ),
        ("seed = 1\n[load\nusers = 5", "not valid TOML"),
        ("seed = 1\nload = 5", "load: expected a table, got 5"),
        ("seed = 1\n[[faults]]\n[load]\nusers = 5\nduration = '1m'", "faults[0].kind: required"),
        (
            "seed = 1\n[[faults]]\nkind = 'cut_steam'\n[load]\nusers = 5\nduration = '1m'",
            "faults[0].kind: unknown fault 'cut_steam' (did you mean 'cut_stream'?); expected one of",
        ),
        # The user's file, not the lab, when it nests too deeply for the parser (it was a
        # RecursionError, exit 4 "the lab failed"): the key and the line are named.
        (
            "seed = 1\n[load]\nusers = " + "[" * 5000 + "]" * 5000 + "\nduration = '1m'",
            "load.users: nested too deeply (5000 levels at line 3)",
        ),
        (
            "seed = 1\n[[faults]]\nkind = 'cut_stream'\nparams = " + "{a=" * 5000 + "1" + "}" * 5000,
            "faults.params: nested too deeply (5000 levels at line 4)",
        ),
    ],
)
def test_whole_file_mistakes(tmp_path: Path, text: str, expected: str) -> None:
    got = load_text(tmp_path, text)
    assert any(p.startswith(expected) for p in got), got


def test_contradicting_fault_windows(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + """
[[faults]]
kind = "storm"
rate = 0.2
window = { start = "0s", end = "6s" }
[[faults]]
kind = "storm"
rate = 0.9
window = { start = "5s", end = "8s" }
"""
    )
    got = load_text(tmp_path, text)
    assert got == [
        "faults[1].window: overlaps faults[0] ('storm#0'): two storm rules with the same match and overlapping "
        "windows contradict each other; make the windows disjoint or the matches different"
    ]


def test_faults_in_a_quiet_phase_contradict_it(tmp_path: Path) -> None:
    text = """
seed = 1
[load]
users = 5
[[phases]]
name = "calm"
kind = "steady"
duration = "10s"
[[phases]]
name = "chaos"
kind = "faults"
duration = "10s"
[[faults]]
kind = "cut_stream"
rate = 0.1
[[faults]]
kind = "drop_priming"
rate = 0.1
phase = "chaos"
[[toxics]]
kind = "latency"
at = "5s"
attributes = { latency = 10 }
[[toxics]]
kind = "latency"
phase = "chaos"
attributes = { latency = 10 }
"""
    got = load_text(tmp_path, text)
    assert any(
        p.startswith("faults[0].window: active during the steady phase 'calm' (0s..10s)") for p in got
    ), got
    assert any(p.startswith("toxics[0].at: active during the steady phase 'calm'") for p in got), got
    assert any(p.startswith("toxics[1].at: overlaps toxics[0] ('latency-0')") for p in got), got
    assert not any(p.startswith("faults[1]") for p in got), got


def test_phases_set_the_duration(tmp_path: Path) -> None:
    text = """
seed = 1
[load]
users = 5
duration = "30s"
[[phases]]
kind = "steady"
duration = "10s"
[[phases]]
kind = "warp"
duration = "10s"
users = 50
"""
    got = load_text(tmp_path, text)
    assert (
        "phases[1].kind: expected one of 'steady', 'ramp', 'faults', 'recovery', 'quiet', got 'warp'" in got
    )
    assert any(p.startswith("load.duration: 30s disagrees with the phases (20s in all)") for p in got), got
    assert any(p.startswith("load.users: a phase asks for 50 users") for p in got), got


def test_all_problems_at_once(tmp_path: Path) -> None:
    text = """
colour = 1
[load]
users = 0
duration = "forever"
[[faults]]
kind = "storm"
rate = 7
[[faults]]
kind = "nope"
rate = 0.5
[[toxics]]
kind = "latency"
toxicity = 0
"""
    got = load_text(tmp_path, text)
    keys = {p.split(": ", 1)[0] for p in got}
    assert keys >= {
        "colour",
        "seed",
        "load.users",
        "load.duration",
        "faults[0].rate",
        "faults[1].kind",
        "toxics[0].toxicity",
        "toxics[0].attributes.latency",
    }


def test_a_name_resolves_to_the_scenarios_folder_and_unknown_names_list_the_known(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario("no-such-scenario")
    assert "no such scenario file (known scenarios: " in str(e.value) and "smoke" in str(e.value)
    assert str(e.value).count("scenarios/no-such-scenario.toml") >= 1
    with pytest.raises(ScenarioError) as e:
        load_scenario("smok")
    assert "no such scenario file (did you mean 'smoke'?) (known scenarios: " in str(e.value)


@pytest.mark.parametrize("name", [n for n in scenario_names() if load_scenario(n).toxics])
def test_toxics_are_ones_the_nemesis_accepts(name: str) -> None:
    from lab.nemesis.schedule import ScheduledToxic, plan_steps
    from lab.nemesis.toxics import make_toxic

    entries = [
        ScheduledToxic(
            "mcp",
            make_toxic(
                t["kind"], stream=t["stream"], name=t["name"], toxicity=t["toxicity"], **t["attributes"]
            ),
            t["at"],
            t["until"],
        )
        for t in load_scenario(name).toxics_schedule()
    ]
    assert plan_steps(entries)


def test_load_settings_for_the_locust_processes() -> None:
    from lab.load.settings import LoadSettings

    sc = load_scenario("chaos-day")
    settings = sc.load_settings("http://127.0.0.1:1/mcp", "/tmp/run")
    assert LoadSettings.from_json(settings.to_json()) == settings
    assert settings.ticker == {"count": 40, "interval_ms": 50, "close_after": 15, "retry_ms": 500}
    assert settings.tokens == (("alice-token", "alice"), ("bob-token", "bob"))
    assert settings.stages[-1] == (630.0, 0, 1.0) and settings.reconnect_qps == 60
    assert load_scenario("smoke").ticker_arguments()["close_after"] is None


def test_fault_windows_name_toxics_as_the_checker_counts_them() -> None:
    windows = load_scenario("gate-100k").fault_windows(0.0)
    assert {"toxic:latency", "toxic:limit_data", "toxic:reset_peer"} <= {w["fault"] for w in windows}


def test_the_size_of_each_scenario_warns_of_heavy_and_long_runs() -> None:
    from lab.scenario.size import size_of

    smoke, gate, crowd, ramp = (
        size_of(load_scenario(n)) for n in ("smoke", "gate-100k", "clients-10k", "capacity")
    )
    assert (smoke.heavy, smoke.long, smoke.length, smoke.peak_clients) == (False, False, "30 s", 20)
    assert smoke.line() == "30 s, 20 clients at most, 1 worker, 7 fault rules"
    assert gate.heavy and not gate.long and gate.events == 100_000
    assert gate.line().startswith("until 100,000 events (at most 5 min), 38 clients at most")
    assert gate.line().endswith("+ 3 TCP toxics; HEAVY: more than one core")
    assert crowd.heavy and crowd.long and crowd.peak_clients == 6000 and crowd.length == "9 min"
    assert ramp.peak_clients == 1600 and ramp.length.startswith("until one step past the knee")


def test_lab_scenarios_prints_each_size_under_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    from lab.cli import main

    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("clients-10k "))
    assert "6,000 concurrent" in lines[at] and lines[at + 1].lstrip().startswith("9 min, 6,000 clients")
    assert lines[at + 1].endswith("HEAVY: more than one core, LONG")
    assert len(lines) == 2 * len(scenario_names())


def test_overrides_are_checked_like_the_file_and_phases_refuse_them() -> None:
    sc = load_scenario("smoke", overrides={"load.users": 7, "load.duration": "12s", "load.event_target": 500})
    assert (sc.load.users, sc.load.duration, sc.load.event_target, sc.load.hard_timeout) == (
        7,
        12.0,
        500,
        84.0,
    )
    assert sc.overrides == {"load.users": 7, "load.duration": "12s", "load.event_target": 500}
    assert load_scenario("smoke").overrides == {} and load_scenario("smoke").load.users == 20
    with pytest.raises(ScenarioError) as e:
        load_scenario("smoke", overrides={"load.users": 0, "seed": -1, "load.spawn_rate": 0})
    said = {(p.key, p.message.split(",")[0]) for p in e.value.problems}
    assert said == {
        ("load.users", "expected an integer >= 1"),
        ("seed", "expected an integer >= 0"),
        ("load.spawn_rate", "expected a number > 0"),
    }, said
    with pytest.raises(ScenarioError) as e:
        load_scenario("chaos-day", overrides={"load.users": 5, "seed": 3})
    (problem,) = e.value.problems
    assert problem.key == "load.users" and "set by the scenario's [[phases]]" in problem.message


def test_a_capacity_check_refuses_faults_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cap.toml"
    path.write_text('check = "capacity"\n' + MINIMAL)
    sc = load_scenario(path)
    assert sc.check == "capacity" and sc.to_dict()["check"] == "capacity"
    again = tmp_path / "again.toml"
    again.write_text(scenario_toml(sc))
    assert load_scenario(again).check == "capacity"
    assert load_scenario("smoke").check == "gates" and "\ncheck = " not in scenario_toml(
        load_scenario("smoke")
    )
    chaos = (
        'check = "capacity"\n' + MINIMAL + '[[faults]]\nkind = "cut_stream"\nrate = 0.1\n'
        '[[toxics]]\nkind = "latency"\nattributes = { latency = 10 }\n'
    )
    got = load_text(tmp_path, chaos)
    assert any(
        p.startswith(
            "check: 'capacity' judges a run with no faults by design, and this scenario has "
            "1 [[faults]], 1 [[toxics]]"
        )
        for p in got
    ), got
    assert any(
        p.startswith("check: expected one of 'gates', 'capacity', got 'load'")
        for p in load_text(tmp_path, 'check = "load"\n' + MINIMAL)
    )
