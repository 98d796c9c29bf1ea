"""A replay, end to end: build its scenario, run it as `lab run` would, compare (lab.replay)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lab.exitcodes import ExitCode
from lab.replay.build import replay_scenario
from lab.replay.compare import FILE, replay_json, summary_lines
from lab.replay.recorded import ReplayError, read_json_object, read_recorded, read_triggers
from lab.runfolder import replace_file
from lab.scenario.write import scenario_toml


def replay_run(
    run_dir: Path,
    *,
    clients: Sequence[str] | None = None,
    faults: Sequence[str] | None = None,
    target: str | None = None,
    out: Path = Path("results"),
    quiet: bool = False,
) -> int:
    from lab.run.options import RunError, RunOptions
    from lab.run.orchestrator import Run
    from lab.scenario import ScenarioError, load_scenario

    rec = read_recorded(run_dir)
    client = rec.client  # the replay runs the same client (its scenario says it too)
    doc, sel = replay_scenario(rec, clients, faults)
    path = out / "replays" / f"replay-{rec.run_id}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, scenario_toml(doc))
    try:
        scenario = load_scenario(str(path))
    except ScenarioError as e:
        raise ReplayError(f"the replay's scenario {path} was refused:\n{e}") from None
    if target is None:
        target = rec.target
    say = (lambda _: None) if quiet else print
    say(
        f"replaying {rec.run_id}: {len(sel.clients)} clients"
        + (f" (client under test: {client})" if client != "lab" else "")
        + f", {sel.pinned} fault firings pinned to their "
        f"triggers{', the toxics on their time windows' if sel.toxics else ''}; scenario {path}"
    )
    run = Run(
        RunOptions(
            scenario=scenario, target=target, workers=1, out=out, quiet=quiet, figures=False, client=client
        )
    )
    try:
        code = run.execute()
    except RunError as e:
        raise ReplayError(f"the replay run was refused: {e}") from None
    new_dir = run.dir
    report = read_json_object(new_dir / "report.json")
    doc_out = replay_json(
        rec.run_id,
        new_dir.name,
        rec.report,
        report,
        sel.triggers,
        read_triggers(new_dir) if report is not None else [],
        clients=sel.clients,
        pinned=sel.pinned,
        by_time=sel.by_time,
        not_replayed=sel.not_replayed,
    )
    doc_out["scenario_file"] = str(path)
    replace_file(new_dir / FILE, json.dumps(doc_out, indent=2) + "\n")
    for line in summary_lines(doc_out):
        print(f"replay: {line}")
    print(f"replay: {new_dir / FILE}")
    return code if report is not None or code != ExitCode.PASS else ExitCode.INCONCLUSIVE
