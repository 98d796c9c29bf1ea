"""The lab's locustfile: MCP users, the distributed reconnect budget, progress to `lab run`.

Started by `lab run` (`locust -f lab/load/locustfile.py ...` with LAB_LOCUST_SETTINGS and
LAB_LEDGER_KEY in the environment). It also runs by hand, with default settings, against
Locust's `--host` (e.g. `lab serve` on its default address):

    locust -f lab/load/locustfile.py --host http://127.0.0.1:8000/mcp --headless -u 5 -t 20s

- Every worker keeps one durable inbox/outbox + client ledger file,
  `<run>/clients/worker-<name>.sqlite` (the index `lab run` gives, or the host name),
  group-committed every 200 ms and at exit.
- The master splits the global reconnect budget across the connected workers (whole
  shares, `split_budget`) and re-splits when workers join or leave; each worker's token
  bucket takes its share (`lab_budget` message). Splits are logged to
  `<run>/budget_split.jsonl`.
- Workers send their counters every second (`lab_progress`); the master writes the sum
  to `<run>/progress.json` for `lab run` to show.
- `lab run` ends the load early by creating `<run>/stop-requested`: the master quits
  the Locust way (users stop and DELETE their sessions, workers exit).
- With the web UI (`lab run --ui`), the end of the load is the end of the run: STOP in
  the UI (or the load shape running out) quits the master, which writes
  `<run>/load-ended.json` (`{"reason": "stopped_in_ui" | "load_complete", "at": t}`)
  first, so `lab run` goes on to the report at once instead of waiting for its hard
  timeout.
- A worker's `quitting` handler stops every client (each writes its last records) and
  then, whatever happened, commits the last batch and closes the file.
- With scripted clients (the settings' `clients`, a scenario's `[[load.clients]]`), the
  users are `ScriptUser`s (lab/load/scripted.py) instead of `LabUser`s, or
  `SdkScriptUser`s with a client under test: each plays one script under the script's
  client ID and then stops; the workers count the scripts played to the end
  (`scripted_done`) for `lab run` to end the run.
- With a client under test (`lab run --client python-sdk|typescript-sdk|cmd:...`, the
  settings' `client`), the users are `lab.load.sut_user`'s instead: each worker starts one
  adapter process, each user is one client inside it, and the worker's `quitting` handler
  stops the adapter by its PID; no client ledger is written (the adapter's application
  log, `<run>/clients/app-<name>.jsonl`, is the client's record).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gevent
import gevent.monkey
from locust import LoadTestShape, between, events, task
from locust.env import Environment
from locust.rpc import Message
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from lab.client import ReconnectBudget
from lab.inbox import InboxDatabase
from lab.load import sut_user
from lab.load.clock import start_the_clock
from lab.load.locust_spawn import cache_default_args
from lab.load.overload import OverloadWatch
from lab.load.resolver import install_numeric_first_resolver
from lab.load.scripted import ScriptedSutUser, ScriptedUser
from lab.load.settings import LoadSettings, ledger_key, split_budget
from lab.load.user import WORKER, McpUser, WorkerContext
from lab.logscrub import scrub_stderr
from lab.runfolder import replace_file

scrub_stderr()  # no token or session ID in a worker's log, whoever prints it (gevent's hub)
cache_default_args()  # a spawn message no longer builds ~60 argument parsers (lab.load.locust_spawn)
install_numeric_first_resolver()  # connecting to 127.0.0.1 skips gevent's thread pool (lab.load.resolver)

STOP_FILE = "stop-requested"
"""Created in the run folder by `lab run` to end the load gracefully."""
QUIT_MESSAGE = "lab_quit"
"""Master -> worker: the load is over, quit (see `end_the_load`)."""
QUIT_WAIT_S = 0.5
"""How long the master waits for its workers to quit (their last reports), as Locust's own
quit does, but no longer than they take."""
LOAD_ENDED_FILE = "load-ended.json"
"""Written by the master when the web UI's STOP ended the load (see the module docstring)."""
TEST_LOOP_STALL = "LAB_TEST_LOOP_STALL_MS"
"""TEST ONLY (tests/latency): `<stall ms>[/<every ms>][@<worker index>]` makes a worker
hold its gevent loop with a synchronous (unpatched) `time.sleep` of <stall ms> every <every ms>
(default 1000), on every worker or only on the one given: a worker whose loop is blocked,
as synchronous work would block it, to show that the checker's lab-latency warning fires.
Never set in a real run."""
SETTINGS = LoadSettings.from_env()
log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one log line per request is noise at load


class LabUser(McpUser):
    """Reads, streams and writes in the scenario's proportions."""

    # With a client under test the users are SdkUser's, with scripted clients
    # ScriptUser's or SdkScriptUser's (below): Locust skips abstract ones.
    abstract = SETTINGS.client != "lab" or bool(SETTINGS.clients)
    wait_time = between(SETTINGS.wait_min, SETTINGS.wait_max)

    @task(SETTINGS.mix.read)
    def read(self) -> None:
        self.client.perform("read")

    @task(SETTINGS.mix.stream)
    def stream(self) -> None:
        self.client.perform("stream")

    @task(SETTINGS.mix.churn)
    def churn(self) -> None:
        self.rejoin()

    @task(SETTINGS.mix.write)
    def write(self) -> None:
        self.client.perform("write")


if SETTINGS.clients and SETTINGS.workers != 1:
    # `lab run` refuses it before anything starts; a settings file written by hand must
    # not have two workers play every script under the same client IDs.
    raise RuntimeError("scripted clients ([[load.clients]]) run in one worker")

if SETTINGS.clients and SETTINGS.client == "lab":

    class ScriptUser(ScriptedUser):
        """The scenario's scripted clients (`[[load.clients]]`, lab/load/scripted.py)."""

        abstract = False

elif SETTINGS.clients:

    class SdkScriptUser(ScriptedSutUser):
        """The scenario's scripted clients, each a client under test inside the worker's
        adapter process (lab/load/scripted.py, lab/load/sut_user.py)."""

        abstract = False

elif SETTINGS.client != "lab":
    # A client under test (`lab run --client ...`): each user is one client inside the
    # worker's adapter process (lab/load/sut_user.py).
    SdkUser = sut_user.sut_user_class(SETTINGS)


if SETTINGS.stages:

    class ScenarioShape(LoadTestShape):
        """The scenario's stages (phases or one ramp): users to reach by each `until`;
        the run ends after the last stage (or earlier, when `lab run` stops it)."""

        def tick(self) -> tuple[int, float] | None:
            t = self.get_run_time()  # type: ignore[no-untyped-call]
            for until, users, rate in SETTINGS.stages:
                if t < until:
                    return int(users), float(rate)
            return None


if not any((SETTINGS.mix.read, SETTINGS.mix.stream, SETTINGS.mix.write)):
    raise RuntimeError("the task mix gives every task weight 0")


def _write_json(path: Path, obj: Any) -> None:
    replace_file(path, json.dumps(obj))


@events.init.add_listener  # type: ignore[untyped-decorator]
def on_init(environment: Environment, **_: Any) -> None:
    runner = environment.runner
    settings = SETTINGS
    if settings.by_hand and environment.host:
        settings = replace(settings, url=environment.host)
    run_dir = Path(settings.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(runner, MasterRunner):
        _init_master(environment, runner, run_dir)
    elif isinstance(runner, WorkerRunner | LocalRunner):
        _init_worker(environment, runner, run_dir, settings)


# -- master ------------------------------------------------------------------------------


class ProgressBeat:
    """When a worker, ticking every 0.2 s, sends its counters to the master: every fifth
    tick (each second), and at once when a scripted client left (the last one's leaving
    ends the run: lab.run.watch)."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = 0

    def due(self, tick: int, counters: dict[str, int]) -> bool:
        done = counters.get("scripted_done", 0)
        if tick % 5 != 4 and done == self._done:
            return False
        self._done = done
        return True


def _init_master(environment: Environment, runner: MasterRunner, run_dir: Path) -> None:
    master = _Master(environment, runner, run_dir)
    runner.register_message("lab_progress", master.on_progress)
    gevent.spawn(master.loop)
    events.test_start.add_listener(master.on_test_start)  # type: ignore[no-untyped-call]
    events.test_stop.add_listener(master.on_test_stop)  # type: ignore[no-untyped-call]
    if environment.web_ui is None:
        _await_workers(runner, environment.parsed_options)


def _await_workers(runner: MasterRunner, options: Any) -> None:
    """Until the expected workers are ready (at most --expect-workers-max-wait): Locust's
    headless master looks for them once a second, so a worker ready a moment after the
    master cost every run most of a second before its load could start."""
    expected = int(getattr(options, "expect_workers", 1) or 1)
    deadline = time.monotonic() + float(getattr(options, "expect_workers_max_wait", 0) or 0)
    while len(runner.clients.ready) < expected and time.monotonic() < deadline:
        gevent.sleep(0.02)


class _Master:
    """The master's share of the run: the workers' progress summed into progress.json, the
    reconnect budget split across the workers, and the end of the load (`lab run`'s stop
    request, or the web UI's STOP)."""

    def __init__(self, environment: Environment, runner: MasterRunner, run_dir: Path) -> None:
        self.environment = environment
        self.runner = runner
        self.run_dir = run_dir
        self.progress: dict[str, dict[str, int]] = {}
        """Each worker's last counters, by node id."""
        self.shares: dict[str, float] = {}
        """The reconnect budget's split in force (reconnects/s by worker)."""
        self.ending: str | None = None
        """Why the load is ending, once `end_the_load` has been called."""
        self.started: float | None = None
        """When the load first started (the run's zero, once the clock is set)."""
        self.quitting = False
        """`quit` has begun (it runs once)."""
        self.horizon = SETTINGS.stages[-1][0] if SETTINGS.stages else None

    def on_progress(self, environment: Environment, msg: Any, **_: Any) -> None:
        before = self.progress.get(msg.node_id, {}).get("scripted_done")
        self.progress[msg.node_id] = msg.data
        if msg.data.get("scripted_done") != before:  # (the last script's end ends the run)
            _write_json(self.run_dir / "progress.json", self.total())

    def loop(self) -> None:
        """Once a second until `lab run` asks for the end: re-split the budget, write the
        progress; the stop request is looked for five times a second."""
        stop_file = self.run_dir / STOP_FILE
        for tick in range(1 << 62):
            if stop_file.exists():
                # `lab run` asks for the end (event target reached, Ctrl-C): Locust's own
                # quit stops the users on every worker (they DELETE their sessions) and
                # tells the workers to exit, which a signal to the master would not.
                self.end_the_load(None)
                return
            if tick % 5 == 0:
                self.resplit()
                _write_json(self.run_dir / "progress.json", self.total())
            gevent.sleep(0.2)

    def resplit(self) -> None:
        """Split the budget across the workers connected now, if that changes the split:
        each is told its share, and the split is logged."""
        workers = sorted(self.runner.clients.keys())
        shares = split_budget(SETTINGS.reconnect_qps, workers)
        if shares == self.shares:
            return
        self.shares.clear()
        self.shares.update(shares)
        for worker, qps in shares.items():
            self.runner.send_message("lab_budget", {"qps": qps}, client_id=worker)
        with (self.run_dir / "budget_split.jsonl").open("a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {"at": time.time(), "workers": len(workers), "shares": [shares[w] for w in workers]}
                )
                + "\n"
            )

    def total(self) -> dict[str, Any]:
        """Every worker's counters summed (progress.json)."""
        # Workers that quit keep their last report: the totals never go backwards.
        total: dict[str, Any] = {"at": time.time(), "workers": len(self.runner.clients)}
        for counters in self.progress.values():
            for k, v in counters.items():
                if isinstance(v, int | float):
                    total[k] = total.get(k, 0) + v
        return total

    def end_the_load(self, reason: str | None) -> None:
        """Quit the Locust way (once): users stop (and DELETE their sessions), workers
        exit, and the web UI (if any) closes, so the master process ends."""
        if self.ending is not None:
            return
        self.ending = reason or "stop_requested"
        if reason is not None:
            _write_json(self.run_dir / LOAD_ENDED_FILE, {"reason": reason, "at": time.time()})
        # After a stop, Locust forgets each worker until it reports ready again (after
        # the stop timeout), and its quit reaches only the workers it knows: tell every
        # worker this master has heard from to quit, known now or not.
        for worker in sorted(set(self.progress) | set(self.runner.clients.keys())):
            self.runner.send_message(QUIT_MESSAGE, None, client_id=worker)
        # Locust quits again on its way out (when its last worker quits, and in its
        # shutdown), each time sleeping half a second: once is enough.
        self.runner.quit = self.quit  # type: ignore[method-assign]
        self.quit()
        if self.environment.web_ui is not None:
            self.environment.web_ui.stop()  # type: ignore[no-untyped-call]

    def quit(self) -> None:
        """Locust's `MasterRunner.quit`, once, and without its fixed half second: the
        workers' last reports are awaited only until every worker has quit (at most
        QUIT_WAIT_S). A short run's stop was a second and a half of such sleeps."""
        if self.quitting:
            return
        self.quitting = True
        runner = self.runner
        runner.stop(send_stop_to_client=False)
        for worker in list(runner.clients.all):
            runner.server.send_to_client(Message("quit", None, worker.id))  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + QUIT_WAIT_S
        while len(runner.clients) and time.monotonic() < deadline:
            gevent.sleep(0.02)
        runner.greenlet.kill(block=True)

    def on_test_start(self, environment: Environment, **_: Any) -> None:
        # The run's zero is now (lab.load.clock): the plan and `lab run` learn it, and
        # the first user is spawned once both hold it. Runs before Locust resets the
        # shape's clock, so the shape counts from the same moment. Once: a restart from
        # the web UI is not a new run.
        if self.started is None:
            start = start_the_clock(self.run_dir, SETTINGS.plan_file, time.time())
            gevent.sleep(max(0.0, start - time.time()))
            self.started = time.time()

    def on_test_stop(self, environment: Environment, **_: Any) -> None:
        # With the web UI, Locust keeps the master up after a stop (the UI's STOP, or the
        # shape running out) until someone quits it: for the lab, the load is over.
        if environment.web_ui is None or self.ending is not None:
            return
        elapsed = time.time() - self.started if self.started is not None else 0.0
        done = self.horizon is not None and elapsed >= self.horizon - 1.0
        gevent.spawn(self.end_the_load, "load_complete" if done else "stopped_in_ui")


# -- worker ------------------------------------------------------------------------------


def _init_worker(
    environment: Environment, runner: WorkerRunner | LocalRunner, run_dir: Path, settings: LoadSettings
) -> None:
    name = _worker_name()
    if settings.client != "lab":
        _init_sut_worker(environment, runner, run_dir, settings, name)
        return
    db = InboxDatabase(run_dir / "clients" / f"worker-{name}.sqlite")
    # Until the master's split arrives, a worker takes an even whole share (never more);
    # a process run alone takes the whole budget.
    workers = 1 if isinstance(runner, LocalRunner) else max(1, settings.workers)
    share = float(max(1, int(settings.reconnect_qps) // workers))
    budget = ReconnectBudget(share, burst=max(1.0, settings.reconnect_burst), now=time.time())
    ctx = WorkerContext(settings, db, budget, ledger_key(), name)
    WORKER.append(ctx)

    if isinstance(runner, WorkerRunner):

        def on_budget(environment: Environment, msg: Any, **_: Any) -> None:
            budget.set_rate(float(msg.data["qps"]), time.time())

        def on_quit(environment: Environment, msg: Any, **_: Any) -> None:
            gevent.spawn(runner.quit)  # as on Locust's own quit: stop, then exit

        runner.register_message("lab_budget", on_budget)
        runner.register_message(QUIT_MESSAGE, on_quit)

    overload = OverloadWatch()

    def loop() -> None:
        worst_lag, looked = 0.0, time.monotonic()
        beat = ProgressBeat()
        for tick in range(1 << 62):
            slept_at = time.monotonic()
            gevent.sleep(0.2)
            now = time.monotonic()
            worst_lag = max(worst_lag, now - slept_at - 0.2)
            db.flush()
            if not isinstance(runner, WorkerRunner):
                continue
            if now - looked >= 1.0:
                # A worker that cannot keep up says so at once (lab.load.overload): the run
                # ends limited by the lab, not with the target blamed for its delays.
                was = overload.overloaded
                if overload.look(now, time.process_time(), db.commits, worst_lag) and not was:
                    ctx.counters["overloaded"] = 1
                    ctx.counters["overload_events_per_s"] = int(overload.events_per_s)
                    runner.send_message("lab_progress", dict(ctx.counters))
                worst_lag, looked = 0.0, now
            if beat.due(tick, ctx.counters):
                ctx.counters["accepted"] = db.commits
                ctx.counters["budget_qps"] = int(budget.rate)
                runner.send_message("lab_progress", dict(ctx.counters))

    gevent.spawn(loop)
    _test_loop_stall(name)

    @events.quitting.add_listener  # type: ignore[untyped-decorator]
    def flush_at_exit(environment: Environment, **_: Any) -> None:
        # Users killed at the stop timeout never ran on_stop: stop their clients (timers,
        # connections; each writes its last records) before the file closes under them.
        # Whatever fails there, the last batch is committed and the file closed.
        try:
            ctx.stop_all()
        except Exception:
            log.exception("stopping the clients failed; committing what they wrote")
        finally:
            try:
                db.close()
            except Exception:
                log.exception("closing %s failed", db.path)


def parse_loop_stall(value: str) -> tuple[float, float, str | None]:
    """`LAB_TEST_LOOP_STALL_MS` -> (stall s, every s, worker or None); ValueError naming
    the variable and the form expected."""
    spec, _, worker = value.strip().partition("@")
    stall, _, every = spec.partition("/")
    try:
        stall_s, every_s = float(stall) / 1000.0, float(every or 1000) / 1000.0
    except ValueError:
        stall_s = every_s = -1.0
    if not (0 < stall_s < every_s <= 60) or (worker and not worker.isdigit()):
        raise ValueError(
            f"{TEST_LOOP_STALL}={value!r}: expected <stall ms>[/<every ms>][@<worker index>], "
            "0 < stall < every <= 60000"
        )
    return stall_s, every_s, worker or None


def _test_loop_stall(name: str) -> None:
    """TEST ONLY: see `TEST_LOOP_STALL`."""
    value = os.environ.get(TEST_LOOP_STALL)
    if not value:
        return
    stall_s, every_s, worker = parse_loop_stall(value)
    if worker is not None and worker != name:
        return
    log.warning(
        "%s set: this worker blocks its loop %.3f s every %.3f s (test only)",
        TEST_LOOP_STALL,
        stall_s,
        every_s,
    )

    # Locust monkey-patches time.sleep into gevent's (which yields): the original blocks.
    blocking_sleep = gevent.monkey.get_original("time", "sleep")

    def stall() -> None:
        while True:
            gevent.sleep(every_s - stall_s)
            blocking_sleep(stall_s)  # synchronous on purpose: holds the gevent loop

    gevent.spawn(stall)


def _init_sut_worker(
    environment: Environment,
    runner: WorkerRunner | LocalRunner,
    run_dir: Path,
    settings: LoadSettings,
    name: str,
) -> None:
    """A worker whose users are clients under test: its adapter, progress, quit, and the
    adapter stopped (by PID) when the worker quits. Its clients keep no reconnect budget of
    the lab's: how the implementation reconnects is what is judged."""
    hub = sut_user.init_worker(settings, run_dir, name)

    if isinstance(runner, WorkerRunner):

        def on_quit(environment: Environment, msg: Any, **_: Any) -> None:
            gevent.spawn(runner.quit)

        runner.register_message(QUIT_MESSAGE, on_quit)
        runner.register_message("lab_budget", lambda environment, msg, **_: None)

        def loop() -> None:
            beat = ProgressBeat()
            for tick in range(1 << 62):
                gevent.sleep(0.2)
                if beat.due(tick, hub.counters):
                    runner.send_message("lab_progress", dict(hub.counters))

        gevent.spawn(loop)

    @events.quitting.add_listener  # type: ignore[untyped-decorator]
    def stop_adapter(environment: Environment, **_: Any) -> None:
        code = hub.stop()
        if code != 0:
            log.warning("adapter %s exited with %s (see %s)", settings.client, code, hub.adapter.stderr)


def _worker_name() -> str:
    """Names this worker's ledger file and prefixes its client IDs (unique in the run):
    LAB_WORKER_INDEX from `lab run`, else the host name (a compose replica's container)."""
    return os.environ.get("LAB_WORKER_INDEX") or socket.gethostname()
