"""Scripted clients (`[[load.clients]]`): what loads, every mistake named by file, key and
expectation, the settings that reach the Locust workers, a script's steps, and how `lab run`'s
watcher ends (or does not end) a scripted run. The run itself: tests/run/test_scripted_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.load.settings import ClientScript, LoadSettings, ScriptCursor
from lab.run.admission import check_load
from lab.run.options import RunError, RunOptions
from lab.run.orchestrator import Run
from lab.run.progress import JsonLines
from lab.run.watch import SCRIPTS_DONE, ToxicOutcomes, Watcher
from lab.scenario import ScenarioError, load_scenario
from lab.scenario.size import peak_clients, size_of

SCRIPTED = """
seed = 3

[load]
duration = "60s"

[[load.clients]]
id = "w0-u4"
ops = ["stream", "write", "read"]
at = [0.5, 2.25, 4.0]

[[load.clients]]
id = "idle.client_1"
ops = []
at = []
"""

CLIENT = '\n[[load.clients]]\nid = "{id}"\nops = {ops}\nat = {at}\n'
"""One more client table, appended to a file whose last table is [load] or a client."""


def scripted(tmp_path: Path, text: str = SCRIPTED, name: str = "scripted") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    """Every problem of `text`, each checked to name the file (as the loader says them)."""
    path = scripted(tmp_path, text, "bad")
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert e.value.path == str(path)
    for line in str(e.value).splitlines()[1:]:
        assert line.startswith(f"{path}: "), line
    return [str(p) for p in e.value.problems]


def only(tmp_path: Path, text: str) -> str:
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    return got[0]


# ---------------------------------------------------------------------- what loads


def test_a_scripted_scenario_loads_in_file_order(tmp_path: Path) -> None:
    sc = load_scenario(scripted(tmp_path))
    assert sc.load.clients == (
        ClientScript("w0-u4", ("stream", "write", "read"), (0.5, 2.25, 4.0)),
        ClientScript("idle.client_1", (), ()),
    )
    # users: the number of clients; all started at once; one worker.
    assert sc.load.users == 2 and sc.load.spawn_rate == 2.0 and sc.load.workers == 1
    assert sc.stages() == [{"until": 60.0, "users": 2, "spawn_rate": 2.0}]
    assert peak_clients(sc) == 2 and "until its 2 scripted clients are done" in size_of(sc).line()
    doc = json.loads(json.dumps(sc.to_dict()))  # run.json takes it as is
    assert doc["load"]["clients"][0] == {
        "id": "w0-u4",
        "ops": ["stream", "write", "read"],
        "at": [0.5, 2.25, 4.0],
    }


def test_users_may_be_given_when_it_is_the_number_of_clients(tmp_path: Path) -> None:
    text = SCRIPTED.replace('duration = "60s"', 'duration = "60s"\nusers = 2\nspawn_rate = 5\nworkers = 1')
    sc = load_scenario(scripted(tmp_path, text))
    assert sc.load.users == 2 and sc.load.spawn_rate == 5.0


def test_integer_times_are_seconds_too(tmp_path: Path) -> None:
    text = SCRIPTED + CLIENT.format(id="c", ops='["read", "read"]', at="[1, 1]")
    sc = load_scenario(scripted(tmp_path, text))
    assert sc.load.clients[-1] == ClientScript("c", ("read", "read"), (1.0, 1.0))


def test_the_settings_carry_the_scripts_to_the_workers(tmp_path: Path) -> None:
    sc = load_scenario(scripted(tmp_path))
    settings = sc.load_settings("http://127.0.0.1:1/mcp", str(tmp_path))
    assert settings.clients == sc.load.clients
    assert LoadSettings.from_json(settings.to_json()) == settings
    plain = load_scenario(scripted(tmp_path, 'seed = 1\nload = { users = 5, duration = "10s" }\n', "plain"))
    assert plain.load_settings("u", "r").clients == ()


# ---------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            CLIENT.format(id="c", ops='["read", "wirte"]', at="[1, 2]"),
            "load.clients[2].ops[1]: expected one of 'read', 'stream', 'write', got 'wirte' (did you mean 'write'?)",
        ),
        (
            CLIENT.format(id="c", ops='["read", "write"]', at="[1.5]"),
            "load.clients[2].at: 1 time(s) for 2 op(s): expected one time per op (a list as long as ops)",
        ),
        (
            CLIENT.format(id="c", ops='["read", "write"]', at="[2.5, 1]"),
            "load.clients[2].at[1]: expected a time >= the one before (2.5), got 1: ops start in order",
        ),
        (
            CLIENT.format(id="w0-u4", ops="[]", at="[]"),
            "load.clients[2].id: duplicate client id 'w0-u4' (also load.clients[0]): expected one script per client",
        ),
        (
            CLIENT.format(id="no spaces", ops="[]", at="[]"),
            "load.clients[2].id: expected a client ID of letters, digits and _.- (1..64 characters), got 'no spaces'",
        ),
        (
            CLIENT.format(id="c", ops='["read"]', at="[-1]"),
            "load.clients[2].at[0]: expected a number of seconds >= 0, got -1",
        ),
        (
            CLIENT.format(id="c", ops='["read"]', at='["1s"]'),
            "load.clients[2].at[0]: expected a number of seconds >= 0, got '1s'",
        ),
        (
            CLIENT.format(id="c", ops='["read"]', at="[60]"),
            "load.clients[2].at[0]: never reached: expected a time before the run's end (60s), got 60",
        ),
        (
            CLIENT.format(id="c", ops='"read"', at="[1]"),
            "load.clients[2].ops: expected a list of operations, each one of 'read', 'stream', 'write', got 'read'",
        ),
        (
            '\n[[load.clients]]\nid = "c"\nat = []\n',
            "load.clients[2].ops: required: a list of operations, each one of 'read', 'stream', 'write' ([] for none)",
        ),
        (
            '\n[[load.clients]]\nid = "c"\nops = []\n',
            "load.clients[2].at: required: a list of start times, seconds since the load's start, one per op",
        ),
        ("\n[[load.clients]]\nops = []\nat = []\n", "load.clients[2].id: required: the client ID to use"),
        (
            '\n[[load.clients]]\nid = "c"\nops = []\nat = []\nwhen = 3\n',
            "load.clients[2].when: unknown key",
        ),
    ],
)
def test_each_mistake_in_a_client_is_named(tmp_path: Path, extra: str, expected: str) -> None:
    assert only(tmp_path, SCRIPTED + extra).startswith(expected)


@pytest.mark.parametrize(
    ("load_keys", "expected"),
    [
        (
            "workers = 2",
            "load.workers: scripted clients ([[load.clients]]) run in one worker: expected 1 (or leave it out), got 2",
        ),
        (
            "users = 3",
            "load.users: 3 given, but [[load.clients]] lists 2 client(s): expected 2 (or leave users out",
        ),
        ("spawn_rate = 1", "load.spawn_rate: scripted clients all start at once"),
    ],
)
def test_each_load_key_that_contradicts_the_scripts_is_named(
    tmp_path: Path, load_keys: str, expected: str
) -> None:
    text = SCRIPTED.replace('duration = "60s"', f'duration = "60s"\n{load_keys}')
    assert only(tmp_path, text).startswith(expected)


def test_phases_and_scripted_clients_are_refused_together(tmp_path: Path) -> None:
    text = SCRIPTED.replace(
        '[load]\nduration = "60s"', '[load]\nusers = 2\n\n[[phases]]\nkind = "steady"\nduration = "60s"'
    )
    assert only(tmp_path, text).startswith(
        "load.clients: scripted clients cannot be combined with [[phases]] (the phases set the load shape"
    )


def test_an_empty_list_of_clients_is_refused(tmp_path: Path) -> None:
    text = 'seed = 1\n[load]\nusers = 1\nduration = "10s"\nclients = []\n'
    assert only(tmp_path, text).startswith("load.clients: an empty list: give at least one [[load.clients]]")


def test_every_problem_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    text = SCRIPTED.replace('duration = "60s"', 'duration = "60s"\nworkers = 2') + CLIENT.format(
        id="w0-u4", ops='["read", "stream"]', at="[3, 1, 2]"
    )
    got = problems(tmp_path, text)
    assert sorted(p.split(": ")[0] for p in got) == [
        "load.clients[2].at",  # 3 times for 2 ops
        "load.clients[2].at[1]",  # 1 after 3
        "load.clients[2].at[2]",  # 2 after 3
        "load.clients[2].id",  # w0-u4 again
        "load.workers",
    ]
    assert any(
        p.startswith("load.clients[2].at[1]: expected a time >= the one before (3), got 1") for p in got
    )


def test_a_command_line_override_is_checked_against_the_scripts(tmp_path: Path) -> None:
    path = scripted(tmp_path)
    with pytest.raises(ScenarioError) as e:
        load_scenario(path, overrides={"load.users": 5})
    assert [str(p) for p in e.value.problems] == [
        "load.users: 5 given, but [[load.clients]] lists 2 client(s): expected 2 "
        "(or leave users out: it is then the number of clients)"
    ]
    with pytest.raises(ScenarioError) as e:
        load_scenario(path, overrides={"load.duration": "3s"})  # the first client's last op is at 4 s
    assert any(str(p).startswith("load.clients[0].at[2]: never reached") for p in e.value.problems)


@pytest.mark.parametrize("client", ["python-sdk", "typescript-sdk", "cmd:python my_adapter.py"])
def test_scripted_clients_may_be_a_client_under_test(tmp_path: Path, client: str) -> None:
    # Each script is then one client inside the worker's adapter (lab/load/scripted.py).
    text = SCRIPTED.replace('duration = "60s"', f'duration = "60s"\nclient = "{client}"')
    sc = load_scenario(scripted(tmp_path, text))
    assert sc.load.client == client and len(sc.load.clients) == 2
    settings = sc.load_settings("http://127.0.0.1:1/mcp", str(tmp_path))
    assert (settings.client, settings.clients) == (client, sc.load.clients)
    assert LoadSettings.from_json(settings.to_json()) == settings


def test_lab_run_takes_scripts_with_a_client_under_test(tmp_path: Path) -> None:
    # `lab run --client python-sdk` of a scripted scenario: nothing refuses it before the
    # run (the adapter is resolved here: the `mcp` SDK is among the dependencies).
    sc = load_scenario(scripted(tmp_path))
    run = Run(RunOptions(scenario=sc, target="reference", client="python-sdk", out=tmp_path / "out"))
    run.check()
    assert run.client.under_test and run.client.spec == "python-sdk"


def test_lab_run_refuses_more_than_one_worker_for_scripts(tmp_path: Path) -> None:
    sc = load_scenario(scripted(tmp_path))
    check_load(sc, 1)
    with pytest.raises(RunError, match=r"run in one worker: --workers must be 1, got 2"):
        check_load(sc, 2)


# ---------------------------------------------------------------------- a script's steps


def test_a_script_connects_at_its_first_time_then_runs_each_op_then_leaves() -> None:
    cursor = ScriptCursor(ClientScript("c", ("stream", "write"), (0.5, 2.25)))
    seen = []
    while True:
        seen.append((cursor.next_step(), cursor.due()))
        if cursor.next_step() == "leave":
            break
        cursor.advance()
    assert seen == [("connect", 0.5), ("stream", 0.5), ("write", 2.25), ("leave", 0.0)]


def test_a_script_without_ops_connects_at_once_and_leaves() -> None:
    cursor = ScriptCursor(ClientScript("c"))
    assert (cursor.next_step(), cursor.due()) == ("connect", 0.0)
    cursor.advance()
    assert (cursor.next_step(), cursor.due()) == ("leave", 0.0)


# ---------------------------------------------------------------------- the run's end


def watcher_of(tmp_path: Path, text: str = SCRIPTED) -> Watcher:
    sc = load_scenario(scripted(tmp_path, text))
    return Watcher(tmp_path, sc, 1000.0, ToxicOutcomes(JsonLines(tmp_path / "nemesis.jsonl")))


def progress(tmp_path: Path, **counters: int) -> None:
    (tmp_path / "progress.json").write_text(json.dumps(counters))


def test_the_run_ends_complete_once_every_script_is_done(tmp_path: Path) -> None:
    watcher = watcher_of(tmp_path)
    progress(tmp_path, users=2, scripted=2, scripted_started=2, scripted_done=1, calls_ok=3)
    assert watcher.tick(1001.0)[1:] == (None, False)
    progress(tmp_path, users=0, scripted=2, scripted_started=2, scripted_done=2, calls_ok=3)
    assert watcher.tick(1002.0)[1:] == (SCRIPTS_DONE, True)


def test_a_duration_over_before_the_scripts_are_done_is_incomplete(tmp_path: Path) -> None:
    watcher = watcher_of(tmp_path)
    progress(tmp_path, users=1, scripted=2, scripted_started=2, scripted_done=1, calls_ok=3)
    watcher.tick(1001.0)
    assert watcher.shape_not_reached() == (
        "scripts not finished: 1 of the 2 scripted clients played their script to the end (2 started) "
        "before the run's duration ran out"
    )
    progress(tmp_path, users=0, scripted=2, scripted_started=2, scripted_done=2, calls_ok=3)
    watcher.tick(1002.0)
    assert watcher.shape_not_reached() is None


def test_scripts_that_wait_for_their_time_are_not_a_stall(tmp_path: Path) -> None:
    # Two clients, one waiting for an op 200 s later: 30 s without traffic is its script.
    text = SCRIPTED.replace('duration = "60s"', 'duration = "300s"\nstall_timeout = "20s"').replace(
        "at = [0.5, 2.25, 4.0]", "at = [0.5, 2.25, 200.0]"
    )
    watcher = watcher_of(tmp_path, text)
    for i in range(30):
        progress(tmp_path, users=1, scripted=2, scripted_started=2, scripted_idle=1, calls_ok=2)
        assert watcher.tick(1000.0 + i)[1] is None
    # The same silence with the client not waiting for its time: the traffic stalled.
    reasons = []
    for i in range(30, 60):
        progress(tmp_path, users=1, scripted=2, scripted_started=2, scripted_idle=0, calls_ok=2)
        reasons.append(watcher.tick(1000.0 + i)[1])
    assert any(r is not None and r.startswith("traffic stalled: no event sent") for r in reasons), reasons


def test_a_run_of_the_task_mix_is_not_ended_by_scripts(tmp_path: Path) -> None:
    watcher = watcher_of(tmp_path, 'seed = 1\nload = { users = 2, duration = "10s" }\n')
    progress(tmp_path, users=2, calls_ok=3, scripted_done=0)
    assert watcher.sc.load.clients == () and watcher.tick(1001.0)[1:] == (None, False)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Scripted clients") :]
    example = section[section.index("```toml\n") + len("```toml\n") : section.index("```\n", 1)]
    sc = load_scenario(scripted(tmp_path, "seed = 1\n" + example, "example"))
    assert [c.id for c in sc.load.clients] == ["w0-u7", "w0-u9", "idle"] and sc.load.users == 3
