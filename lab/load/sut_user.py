"""Locust users that are clients under test: each user is one client instance inside an
adapter process (docs/clients.md), so the scenario's users, spawn rate, task mix and
duration drive an implementation the lab did not write, and Locust still shows the load.

    Locust worker (gevent) ──stdin──► adapter process (its own event loop, the SDK)
         ▲                                   │
         └──── tailing greenlet ◄── clients/app-<worker>.jsonl (mcpLabAppLog.v1)

- Each worker process starts **one adapter** (`AdapterHub`), with the run's pseudonym key,
  its application log in `<run>/clients/app-<worker>.jsonl` and its stderr beside it.
  The adapter dies with the worker (SIGTERM from the kernel), and the worker's `quitting`
  hook stops it by its PID.
- Each Locust **user** is one adapter client: `start` on on_start (with the static
  header `x-lab-conn: <client-id>:0`, so the proxy tap names the client of every request
  it carried, plus the scenario's Origin and bearer token), one `call` per task (the
  call ID `<client-id>/<run tag>/c<n>` is also its idempotency key, so the checker joins
  the wire to the application log), `leave` on on_stop. Churn leaves and starts a new
  client. Scripted clients (`[[load.clients]]`) are `ScriptedSutUser`s instead
  (lab/load/scripted.py): each plays one script of the hub's (`scripts`) under the
  script's ID.
- One **tailing greenlet** per worker follows the application log and hands each
  `started`, `outcome` and `left` record to the user waiting for it; a user waits at most
  the call timeout. Locust `request` events are fired per start and per call, with the
  adapter's own `elapsed_s` as the response time.
- A client whose implementation ended it (`client_failed`, `start_failed`, an outcome
  "client ended: ...") is replaced by a new one at the user's next task, the way an
  application restarts a client it lost.

Never imports the implementation (nor anyio): this module runs in a gevent-patched
process; the adapter is a separate process (`lab.sut.host`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from gevent.event import AsyncResult
from locust import User, between, task
from locust.env import Environment

from lab.load.clock import LoadZero, ScriptBook
from lab.load.settings import (
    LoadSettings,
    client_revision,
    ledger_key,
    run_tag,
    script_counters,
    token_for,
)
from lab.sut.host import AdapterProcess, adapter_command
from lab.sut.protocol import Call, Leave, Start
from lab.wire.extensions import LAB_CONN_HEADER

REQUEST_TYPE = "MCP"
TAIL_INTERVAL_S = 0.02
"""How often the tailing greenlet looks for new application-log lines."""
LEAVE_TIMEOUT_S = 5.0
ADAPTER_CWD_ENV = "LAB_ADAPTER_CWD"
"""Set by `lab run` (lab.run.sut.worker_env): the folder to start the adapter in."""
READY_TIMEOUT_S = 60.0
"""How long an adapter may take to say `ready` (Node and the Python SDK import for a second or two)."""
log = logging.getLogger(__name__)


def app_log_name(worker: str) -> str:
    """The application log of a worker's adapter, under the run's `clients/` folder."""
    return f"app-{worker}.jsonl"


def call_id(client_id: str, tag: str, n: int) -> str:
    """A call's ID, which is also its idempotency key (the checker joins the tap's
    `idempotency_key` to the application log's `call` by equality; nothing parses it).
    `tag` is the run's own (lab.load.settings.run_tag): client IDs repeat from run to run,
    and a server that outlives a run (`--target URL`, `lab replay`) would answer the next
    run's writes with the last run's receipts."""
    return f"{client_id}/{tag}/c{n}"


class AdapterHub:
    """One worker's adapter process, the tail of its application log, and who waits for what."""

    def __init__(self, settings: LoadSettings, run_dir: Path, worker: str) -> None:
        self.settings = settings
        self.worker = worker
        self.log_path = run_dir / "clients" / app_log_name(worker)
        cwd = os.environ.get(ADAPTER_CWD_ENV)  # where `lab run` was started (see lab.run.sut)
        key = ledger_key()
        self.adapter = AdapterProcess(
            adapter_command(settings.client),
            self.log_path,
            key=key,
            cwd=Path(cwd) if cwd else None,
            die_with_parent=True,
        )
        self.run_tag = run_tag(key)
        """In every call ID (`call_id`), so that no two runs send the same idempotency key."""
        self.ready: dict[str, Any] | None = None
        """The adapter's `ready` record, once it said it (`wait_ready`)."""
        self._up = gevent.event.Event()
        self._ids = itertools.count(1)
        self._waiting: dict[tuple[str, str], AsyncResult] = {}
        """(kind, ID) -> the result a user waits on: ("start", client), ("call", call), ("left", client)."""
        self.ended: set[str] = set()
        """Clients the implementation ended (or never started): their user starts a new one."""
        self.counters: dict[str, int] = {
            "users": 0,
            "calls_ok": 0,
            "calls_failed": 0,
            "calls_unknown": 0,
            "reconnects": 0,
            "accepted": 0,
            "rejected": 0,
            "duplicates": 0,
            "recoveries": 0,
        }
        self.scripts = ScriptBook(settings.clients, LoadZero(run_dir, time.time()))
        if settings.clients:
            # As the lab's own scripted clients count them (lab.load.user.WorkerContext):
            # the run ends once every script is done, and a script's pause is no stall.
            self.counters.update(script_counters(len(settings.clients)))
        self._offset = 0
        self._stopped = False
        self._tail = gevent.spawn(self._follow)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the adapter's `ready` line (AdapterFailed if it never comes)."""
        try:
            self.ready = self.adapter.wait_ready(timeout=timeout)
        finally:
            self._up.set()  # users waiting for it go on (and fail their start if it never came)
        return self.ready

    def up(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait (in a user) until the adapter is ready; False if it never became so."""
        self._up.wait(timeout)
        return self.ready is not None

    def next_client_id(self) -> str:
        return f"w{self.worker}-u{next(self._ids)}"

    # -- waiting ---------------------------------------------------------------------------

    def expect(self, kind: str, ident: str) -> AsyncResult:
        result = self._waiting[(kind, ident)] = AsyncResult()
        return result

    def wait(self, kind: str, ident: str, result: AsyncResult, timeout: float) -> dict[str, Any] | None:
        """The record the tail handed over, or None after `timeout` seconds."""
        try:
            rec: dict[str, Any] | None = result.get(timeout=timeout)
            return rec
        except gevent.Timeout:
            return None
        finally:
            self._waiting.pop((kind, ident), None)

    def send(self, cmd: Start | Call | Leave) -> None:
        self.adapter.send(cmd)

    # -- the tail --------------------------------------------------------------------------

    def _follow(self) -> None:
        while not self._stopped:
            gevent.sleep(TAIL_INTERVAL_S)
            self.read_new()

    def read_new(self) -> None:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                self._dispatch(rec)

    def _hand(self, kind: str, ident: object, rec: dict[str, Any]) -> None:
        waiting = self._waiting.get((kind, str(ident)))
        if waiting is not None and not waiting.ready():
            waiting.set(rec)

    def _dispatch(self, rec: dict[str, Any]) -> None:
        ev, client = rec.get("ev"), rec.get("client")
        c = self.counters
        if ev == "deliver":
            c["accepted"] += 1
        elif ev == "reconnect":
            c["reconnects"] += 1
        elif ev == "outcome":
            self._hand("call", rec.get("call"), rec)
            if str(rec.get("error") or "").startswith("client ended"):
                self.ended.add(str(client))
        elif ev in ("started", "start_failed"):
            if ev == "start_failed":
                self.ended.add(str(client))
            self._hand("start", client, rec)
        elif ev in ("left", "client_failed"):
            if ev == "client_failed":
                self.ended.add(str(client))
            self._hand("left", client, rec)

    def stop(self) -> int:
        """Stop the adapter (every client leaves its way; by PID if it does not go); its exit code."""
        try:
            return self.adapter.stop()
        finally:
            self._stopped = True
            self.read_new()


HUB: list[AdapterHub] = []
"""The worker's adapter hub, set by `init_worker` (one per process)."""


class SutUser(User):
    """A Locust user that is one client of the implementation under test; subclasses set tasks."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        assert HUB, "the locustfile must start the adapter hub in its init hook"
        self.hub = HUB[0]
        self.client_id = ""
        self.left = False
        """The current client has left (or was asked to): `leave` does nothing more."""
        self._calls = itertools.count(1)

    def on_start(self) -> None:
        self.hub.counters["users"] += 1
        self.begin()

    def on_stop(self) -> None:
        self.hub.counters["users"] -= 1
        self.leave()

    def _fire(self, name: str, ms: float, error: BaseException | None) -> None:
        self.environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=name,
            response_time=ms,
            response_length=0,
            exception=error,
            context={},
        )

    def begin(self, client_id: str | None = None) -> None:
        """Start a new client of the implementation (the initialize handshake) and wait for
        it. `client_id`: the ID to use verbatim (a scripted client's); by default the
        worker's next (`w<worker>-u<n>`)."""
        hub, s = self.hub, self.hub.settings
        self.client_id = client_id if client_id is not None else hub.next_client_id()
        self.left = False
        if not hub.up():
            hub.ended.add(self.client_id)
            self._fire("initialize", 0.0, RuntimeError("the adapter never said it was ready"))
            return
        headers = {LAB_CONN_HEADER: f"{self.client_id}:0"}
        if s.origin:
            headers["Origin"] = s.origin
        token, _subject = token_for(s, self.client_id)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        waiting = hub.expect("start", self.client_id)
        t0 = time.time()
        hub.send(Start(self.client_id, s.url, client_revision(s, self.client_id), headers))
        rec = hub.wait("start", self.client_id, waiting, s.call_timeout)
        ms = (time.time() - t0) * 1000
        if rec is None:
            self._fire("initialize", ms, TimeoutError("not started within the call timeout"))
        elif rec["ev"] == "started":
            self._fire("initialize", float(rec.get("elapsed_s") or 0) * 1000, None)
        else:
            self._fire("initialize", ms, RuntimeError(str(rec.get("error"))))

    def leave(self) -> None:
        """The client leaves (the adapter's `leave`: DELETE of its session), once: a scripted
        client leaves as its last step, then Locust's on_stop asks again."""
        hub = self.hub
        if not self.client_id or self.left or self.client_id in hub.ended:
            return
        self.left = True
        waiting = hub.expect("left", self.client_id)
        hub.send(Leave(self.client_id))
        hub.wait("left", self.client_id, waiting, LEAVE_TIMEOUT_S)

    def rejoin(self) -> None:
        """Leave (DELETE) and come back as a new client with a new session."""
        self.leave()
        self.begin()

    def replace_lost_client(self) -> bool:
        """The implementation lost this user's client (`client_failed`, `start_failed`):
        start a new one, as an application restarts a client it lost; False when this user
        does not (a scripted client plays one client only)."""
        self.begin()
        return True

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        hub, c = self.hub, self.hub.counters
        name = f"call {tool}"
        if self.client_id in hub.ended and not self.replace_lost_client():
            # Nothing to send it to: the adapter would refuse a call of an unknown client
            # and no outcome would ever come.
            c["calls_failed"] += 1
            self._fire(name, 0.0, RuntimeError(f"the client {self.client_id} ended: call not sent"))
            return None
        ident = call_id(self.client_id, hub.run_tag, next(self._calls))
        waiting = hub.expect("call", ident)
        t0 = time.time()
        # The call ID doubles as the idempotency key: the checker joins the tap's
        # `idempotency_key` to the application log's `call` by it.
        hub.send(Call(self.client_id, ident, tool, arguments, ident))
        rec = hub.wait("call", ident, waiting, hub.settings.call_timeout)
        if rec is None:
            c["calls_unknown"] += 1
            self._fire(name, (time.time() - t0) * 1000, TimeoutError("no outcome within the call timeout"))
            return None
        ms = float(rec.get("elapsed_s") or 0) * 1000
        if rec.get("status") == "ok":
            c["calls_ok"] += 1
            self._fire(name, ms, None)
        else:
            c["calls_failed"] += 1
            self._fire(name, ms, RuntimeError(f"{rec.get('status')}: {rec.get('error')}"))
        return rec

    def perform(self, op: str) -> dict[str, Any] | None:
        """One operation of the task mix or of a script (`SCRIPT_OPS`), as the lab's own
        clients do them (lab.load.user.McpClient.perform): `read` calls `echo`, `stream`
        the `ticker` with the scenario's arguments, `write` the `ledger.append` (every call
        of a client under test carries an idempotency key: its call ID)."""
        if op == "read":
            return self.call("echo", {"text": f"hello from {self.client_id}"})
        if op == "stream":
            return self.call("ticker", dict(self.hub.settings.ticker))
        if op == "write":
            return self.call("ledger.append", {"entry": f"{self.client_id}@{time.time():.3f}"})
        raise ValueError(f"unknown operation {op!r}: expected read, stream or write")


def sut_user_class(settings: LoadSettings) -> type[SutUser]:
    """The user class of a run: the scenario's task mix and waits (the lab's own users' tasks)."""
    mix = settings.mix

    class SdkUser(SutUser):
        wait_time = between(settings.wait_min, settings.wait_max)

        @task(mix.read)
        def read(self) -> None:
            self.perform("read")

        @task(mix.stream)
        def stream(self) -> None:
            self.perform("stream")

        @task(mix.write)
        def write(self) -> None:
            self.perform("write")

        @task(mix.churn)
        def churn(self) -> None:
            self.rejoin()

    return SdkUser


def init_worker(settings: LoadSettings, run_dir: Path, worker: str) -> AdapterHub:
    """Start this worker's adapter and wait for it (AdapterUnavailable / AdapterFailed say
    why it cannot). Users Locust spawns meanwhile wait for it in their on_start."""
    hub = AdapterHub(settings, run_dir, worker)
    HUB.append(hub)
    hub.wait_ready()
    return hub
