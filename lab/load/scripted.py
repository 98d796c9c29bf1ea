"""Scripted clients: the users of a scenario's `[[load.clients]]` (docs/scenarios.md,
"Scripted clients"), each one client with a fixed list of operations and when to start them.

Two kinds, one way of playing a script (`ScriptPlayer`): `ScriptedUser`, a client of the
lab's own (lab/load/user.py), and `ScriptedSutUser`, a client under test inside the
worker's adapter (lab/load/sut_user.py, `lab run --client ...`).

Each user takes the next script of its worker that no user has taken (file order: the
worker spawns its users one after another, all at once, so the first user plays the
first script) and uses the script's `id` as its client ID. Its one task, `step`, does the
next thing of the script once it is due: the handshake at the first `at` (at 0 without
ops), each op at its `at` or right after the one before finished, whichever is later,
then leaving (DELETE); the user then stops itself (`StopUser`). Between steps Locust's
own wait (`wait_time`) sleeps until the next one is due, so a user stopped by the end of
the load is stopped at once, not after its next op.

Times count from the load's start (`load-started.json`, lab.load.clock), which is why
every scripted user is spawned at once: Locust does not delay any of them.

The worker's counters (`WorkerContext.counters` or `AdapterHub.counters`, summed into
progress.json) say how many scripts there are (`scripted`), how many users took one
(`scripted_started`), how many are waiting for their next `at` (`scripted_idle`: not a
stall) and how many played theirs to the end (`scripted_done`): `lab run` ends the run
once every one has (lab.run.watch, end reason `scripts_done`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from locust import task
from locust.env import Environment
from locust.exception import StopUser

from lab.load.settings import ClientScript, ScriptCursor
from lab.load.sut_user import SutUser
from lab.load.user import WORKER, McpClient, McpUser

log = logging.getLogger(__name__)


class ScriptPlayer:
    """Where a user is in its script, when its next step is due, and the worker's script
    counters (module docstring); what each step does is the user's."""

    __slots__ = ("_idle", "counters", "cursor", "load_zero", "script")

    def __init__(
        self, script: ClientScript | None, counters: dict[str, int], load_zero: Callable[[], float]
    ) -> None:
        self.script = script
        """None: a spare user (more users than scripts), which stops at once."""
        self.cursor = ScriptCursor(script or ClientScript(id=""))
        self.counters = counters
        self.load_zero = load_zero
        self._idle = False

    def start(self) -> None:
        """The user has started (its on_start): counted as a script taken."""
        if self.script is not None:
            self.counters["scripted_started"] += 1
        else:
            log.warning("a scripted user with no script left (more users than [[load.clients]]): it stops")

    def stop(self) -> None:
        """The user stops (its on_stop): no longer waiting for an `at`."""
        self._set_idle(False)

    def wait(self) -> float:
        """Seconds until the next step is due (the user's `wait_time`: Locust sleeps it,
        the user stoppable meanwhile)."""
        delay = self.load_zero() + self.cursor.due() - time.time()
        self._set_idle(delay > 0)
        return max(0.0, delay)

    def play(
        self, connect: Callable[[], object], perform: Callable[[str], object], leave: Callable[[], object]
    ) -> None:
        """The next step, if it is due (the user's one task): `connect()`, `perform(op)`, or
        `leave()` and then StopUser (Locust ends the user; its on_stop runs)."""
        if self.script is None:
            raise StopUser()
        if time.time() < self.load_zero() + self.cursor.due():
            return  # not yet (the first step comes before any wait): `wait` sleeps the rest
        self._set_idle(False)
        step = self.cursor.next_step()
        self.cursor.advance()
        if step == "connect":
            connect()
        elif step == "leave":
            leave()
            self.counters["scripted_done"] += 1
            raise StopUser()  # nothing more to do
        else:
            perform(step)

    def _set_idle(self, idle: bool) -> None:
        """Count this user among the ones waiting for their next `at` (or not)."""
        if idle != self._idle and self.script is not None:
            self.counters["scripted_idle"] += 1 if idle else -1
        self._idle = idle


class ScriptedUser(McpUser):
    """One scripted client of the lab's own (see the module docstring). Abstract: the
    locustfile makes it the users' class when the settings carry scripts."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        assert WORKER, "the locustfile must set the worker context in its init hook"
        self.ctx = WORKER[0]
        # Before McpUser's __init__, which builds the client with the script's ID.
        self.script: ClientScript | None = self.ctx.scripts.claim()
        self.player = ScriptPlayer(self.script, self.ctx.counters, self.ctx.scripts.zero)
        super().__init__(environment)

    def new_client(self) -> McpClient:
        if self.script is None:
            return super().new_client()  # a spare user: it stops at once
        return McpClient(self.environment, self.ctx, client_id=self.script.id)

    def on_start(self) -> None:
        # No handshake here: it is the script's first step, at its time.
        self.ctx.counters["users"] += 1
        self.player.start()

    def on_stop(self) -> None:
        self.player.stop()
        super().on_stop()  # leaves unless the script's last step did (McpClient.leave: once)

    def wait_time(self) -> float:
        return self.player.wait()

    @task
    def step(self) -> None:
        self.player.play(self.client.connect, self.client.perform, self.client.leave)


class ScriptedSutUser(SutUser):
    """One scripted client under test (see the module docstring): a client inside the
    worker's adapter, under its script's ID, doing what the task mix's tasks do
    (`SutUser.perform`). Abstract: the locustfile makes it the users' class when the
    settings carry scripts and a client under test."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.script: ClientScript | None = self.hub.scripts.claim()
        self.player = ScriptPlayer(self.script, self.hub.counters, self.hub.scripts.zero)

    def on_start(self) -> None:
        # No `begin` here: the handshake is the script's first step, at its time.
        self.hub.counters["users"] += 1
        self.player.start()

    def on_stop(self) -> None:
        self.player.stop()
        super().on_stop()  # leaves unless the script's last step did (SutUser.leave: once)

    def wait_time(self) -> float:
        return self.player.wait()

    def replace_lost_client(self) -> bool:
        # A script is one client: one the implementation lost is not replaced under
        # another ID (that ID would be no script's); its later ops fail unsent.
        return False

    @task
    def step(self) -> None:
        self.player.play(self._connect, self.perform, self.leave)

    def _connect(self) -> None:
        assert self.script is not None  # `play` stops a user without a script first
        self.begin(self.script.id)
