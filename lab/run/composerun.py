"""The two lab commands of a compose run (compose.yaml's `prepare` and `toxics` services).

- `prepare`: one-shot. A fresh run folder (an earlier one is moved aside), then its
  inputs: the fault plan, the Locust settings, an empty `nemesis.jsonl`, run.json.
- `watch`: long-running, until the scenario's horizon, counted from when the Locust
  master starts the load (it says so in `load-started.json`). The toxics schedule through the
  Toxiproxy API, every add/remove and its outcome in `nemesis.jsonl`; the same watch as
  `lab run` (stall, failed removal, event target: it then asks the Locust master to stop
  through the run folder's `stop-requested`); and run.json completed at the end.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab import topology
from lab.run.compose import prepare_folder
from lab.run.options import PROXY_NAME, client_origin, wait_for_load_start
from lab.run.progress import JsonLines
from lab.run.record import RunRecord
from lab.run.watch import ToxicOutcomes, Watcher, describe_outcome, start_schedule
from lab.runfolder import RunFolderError, read_run_json
from lab.scenario import Scenario, load_scenario

COMPOSE_TOXIPROXY = "toxiproxy (compose)"


def prepare(sc: Scenario, out: Path, *, client_url: str, workers: int, tokens: dict[str, str]) -> Path | None:
    """Write a compose run's inputs into a fresh `out`; the folder an earlier run was
    moved to, if any. RunFolderError when the folder cannot be written."""
    moved = prepare_folder(out)
    record = RunRecord(sc, workers, "reference", COMPOSE_TOXIPROXY)
    record.start(out)
    record.client_url = client_url
    record.proxy_name = PROXY_NAME
    try:
        for sub in ("clients", "server", "proxy", "logs"):
            (out / sub).mkdir(exist_ok=True)
        plan = out / topology.PLAN_FILE
        record.write_plan(plan, record.run_start)
        settings = replace(
            sc.load_settings(client_url, str(out)),
            origin=client_origin(sc.target.allowed_origins),
            tokens=tuple(sorted(tokens.items())),
            workers=workers,
            plan_file=str(plan),
        )
        (out / "locust-settings.json").write_text(settings.to_json(), encoding="utf-8")
        (out / "nemesis.jsonl").touch()
    except OSError as e:
        raise RunFolderError(f"cannot write the inputs into {out}: {e.strerror or e}") from None
    record.write()
    return moved


LOAD_START_WAIT = 180.0
"""Seconds `watch` waits for the Locust master to start the load: containers start, and
the compose master waits up to 60 s for its workers."""


def watch(
    run_dir: Path,
    toxiproxy: str,
    *,
    say: Any = print,
    poll: float = 1.0,
    load_start_wait: float = LOAD_START_WAIT,
) -> int:
    """Carry out a prepared compose run's toxics and watch it until its horizon; complete
    run.json. 0 when the run ended complete, 2 when not. The scenario's times count from
    the moment the Locust master starts the load, as in `lab run`; if it does not say so
    within `load_start_wait` s, from `prepare`."""
    from lab.nemesis.client import ToxiproxyClient, wait_until_up
    from lab.nemesis.log import NemesisLog

    doc = read_run_json(run_dir)
    if doc is None:
        raise RunFolderError(f"{run_dir}/run.json is missing or unreadable: run `lab prepare` first")
    sc = load_scenario(str(doc.get("scenario_file") or doc.get("scenario", {}).get("name", "")))
    record = RunRecord(sc, int(doc.get("workers", 1)), "reference", COMPOSE_TOXIPROXY)
    record.dir = run_dir
    record.run_start = float(doc.get("started_at", time.time()))
    record.client_url = str(doc.get("client_url", ""))
    record.proxy_name = PROXY_NAME
    (run_dir / "nemesis.jsonl").touch()
    client = ToxiproxyClient(toxiproxy, log=NemesisLog(run_dir / "nemesis.jsonl"))
    wait_until_up(client, within=60.0)
    at = wait_for_load_start(run_dir, load_start_wait)
    if at is None:
        say(f"lab watch: the load did not start within {load_start_wait:.0f} s; times count from prepare")
    else:
        record.run_start = at
    outcomes = ToxicOutcomes(JsonLines(run_dir / "nemesis.jsonl"))
    schedule = start_schedule(sc, client, PROXY_NAME, record.run_start, run_dir / "nemesis.jsonl")
    outcomes.runner = schedule.runner if schedule is not None else None
    watcher = Watcher(run_dir, sc, record.run_start, outcomes)
    stop = threading.Event()
    try:
        while not stop.wait(poll):
            now = time.time()
            text, reason, complete = watcher.tick(now)
            say(text)
            if reason is not None:
                record.end(reason, complete=complete)
                break
            if now - record.run_start >= sc.horizon + 5:
                short = watcher.shape_not_reached()
                record.end(short or "duration", complete=short is None)
                break
    except KeyboardInterrupt:
        record.end("interrupted")
    finally:
        (run_dir / "stop-requested").touch()  # the Locust master quits, the stack ends
        if schedule is not None:
            schedule.stop()
        outcomes.update()
        record.toxic_outcomes = outcomes.records
        failed = outcomes.failed_removal()
        if failed is not None:
            record.spoil(f"toxic removal failed: {describe_outcome(failed)}")
        record.finish()
        record.write()
    return 0 if record.complete else 2
