"""The run's clock starts when the load does.

A scenario's times (fault windows, toxics' `at`, phases, the duration) count from one
moment, the run start. Locust's load shape counts from the moment its master starts the
test, once the workers have connected, which is seconds after `lab run` launched the
processes (two here; more on a busy box, or when a client under test starts a process of
its own). So the run start is that moment: when the master starts the test it

1. picks `start = now + SETTLE_S`,
2. rewrites the fault plan with `run_start = start` (the addon re-reads it within its poll,
   0.2 s by default),
3. writes `load-started.json` `{"at": start}` (`lab run` waits for it, then starts the
   toxics, the phases and its own clock from `at`),
4. waits until `start` before the first user is spawned.

Pure file work, no Locust import: the master's `test_start` hook calls `start_the_clock`
and sleeps the time it returns (lab/load/locustfile.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from lab.faults.plan import PlanError, parse_plan
from lab.load.settings import ClientScript
from lab.runfolder import RunFolderError, replace_file

LOAD_STARTED_FILE = "load-started.json"
"""`{"at": epoch s}`: when the load starts, the run's zero (read by lab.run.options.load_started)."""
SETTLE_S = 0.5
"""Between the files and the first user: the addon's plan poll (0.2 s) and `lab run`'s
poll of load-started.json (0.05 s) both fit, so faults, toxics and phases at 0 s are in
place when the first request comes."""
log = logging.getLogger(__name__)


def start_the_clock(run_dir: Path, plan_file: str, now: float, settle: float = SETTLE_S) -> float:
    """Set the run start to `now + settle` in the fault plan (if `plan_file`) and in
    `run_dir/load-started.json`; return it. A plan that cannot be read or written is
    logged and left as it is: the addon keeps the clock it has (the one `lab run` wrote
    when it launched the processes), which shifts windows but loses no record."""
    start = now + settle
    if plan_file:
        path = Path(plan_file)
        try:
            plan = parse_plan(path.read_text(encoding="utf-8"), name=str(path))
            replace_file(path, replace(plan, run_start=start).to_json())
        except (OSError, PlanError, RunFolderError) as e:
            log.error("the fault plan keeps its clock: %s", e)
    replace_file(run_dir / LOAD_STARTED_FILE, json.dumps({"at": start}))
    return start


def load_started_at(run_dir: Path) -> float | None:
    """When the master says the load starts (`load-started.json` `at`, epoch s), once it
    has said so; None before that, or for a file that is not the master's form."""
    try:
        doc = json.loads((run_dir / LOAD_STARTED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    at = doc.get("at") if isinstance(doc, dict) else None
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


class LoadZero:
    """The load's start (epoch s) as a worker's scripted clients count their `at` from it:
    the master's `load-started.json`, written before it spawns the first user. Without it
    (the locustfile run alone), the first time it is asked, which is when the first user
    spawns. A file older than the worker (`created_at`) is an earlier run's. Asked once,
    then kept: every script of the worker counts from the same moment."""

    __slots__ = ("_at", "created_at", "run_dir")

    def __init__(self, run_dir: Path, created_at: float) -> None:
        self.run_dir = run_dir
        self.created_at = created_at
        self._at: float | None = None

    def __call__(self, now: float) -> float:
        if self._at is None:
            at = load_started_at(self.run_dir)
            self._at = at if at is not None and at >= self.created_at else now
        return self._at


class ScriptBook:
    """A worker's scripted clients (`[[load.clients]]`): the scripts no user has taken yet,
    in file order, and the load's zero their `at` count from. The lab's own worker
    (lab.load.user.WorkerContext) and a client under test's (lab.load.sut_user.AdapterHub)
    hold one each."""

    __slots__ = ("_left", "_zero")

    def __init__(self, scripts: Sequence[ClientScript], zero: Callable[[float], float]) -> None:
        self._left = deque(scripts)
        self._zero = zero
        """`LoadZero` (or a test's fixed zero): the load's start, given the time now."""

    def claim(self) -> ClientScript | None:
        """The next script no user has taken (file order); None when all are taken."""
        return self._left.popleft() if self._left else None

    def zero(self) -> float:
        """The load's start (epoch s), from which scripted clients count their `at`."""
        return self._zero(time.time())
