"""`lab run`: one scenario, end to end, with every part really started on 127.0.0.1.

    Locust master + workers ──► TCP nemesis ──► mitmdump + addon ──► target server
    (clients/*.sqlite)          (nemesis.jsonl)  (proxy/tap.jsonl)   (server/ledger.sqlite)

1. The scenario is loaded and checked whole (`lab.run.admission`), and a `--target URL` is
   asked for its revision and tools (`lab.run.preflight`); a bad one is refused before
   anything starts.
2. The run gets a folder of its own (`lab.runfolder`); the parts of `lab.topology` start
   in order on free ports, each waited for (its ready line), logs in `logs/`. Secrets
   reach them by environment or 0600 files that are deleted, never by argv.
3. While it runs, one progress line a second; it stops at the event target, at the end of
   the load shape, or at the hard time bound — or, incomplete, when a part dies, a toxic
   cannot be removed, the traffic stalls (`lab.run.watch`) or a signal arrives
   (`lab.run.console`).
4. Every process it started is stopped by PID (`lab.run.stopping`); `run.json` records
   what ran and how it ended (`complete: false` if anything cut the run short).
5. The checker (`lab report`) reads the folder and its exit code is the run's.

Exit codes (`lab.exitcodes`): 0 every gate passed, 1 a gate failed, 2 inconclusive or
incomplete, 3 the run could not be made, 4 the lab itself failed.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lab import topology
from lab.exitcodes import ExitCode
from lab.load.settings import SETTINGS_ENV, LoadSettings
from lab.run import sut
from lab.run.admission import check_load, check_local_chain, check_real_toxiproxy
from lab.run.console import Console, Interrupts
from lab.run.monitor import FILE as PROCESSES_FILE
from lab.run.monitor import ProcessMonitor
from lab.run.options import (
    PROXY_NAME,
    RunError,
    RunOptions,
    client_origin,
    free_port,
    load_ended,
    wait_for_load_start,
)
from lab.run.phases import PhaseDriver, initial_knobs
from lab.run.processes import Child, ProcessGroup, StartError
from lab.run.progress import JsonLines
from lab.run.record import RunRecord
from lab.run.restarts import RestartDriver
from lab.run.serverconf import UnsafeSetting, serve_accepts_config, serve_options, server_config_file
from lab.run.serverconf import server_settings as make_server_settings
from lab.run.stopping import stop_parts
from lab.run.watch import (
    LoadStopped,
    RunningSchedule,
    ToxicOutcomes,
    Watcher,
    describe_outcome,
    lab_limits,
    start_schedule,
)
from lab.runfolder import (
    RunFolderError,
    create_run_folder,
    drop_secrets,
    mark_abandoned_runs,
    secret_path,
    write_secret,
)

if TYPE_CHECKING:  # prometheus_client loads only for a run that asks for metrics
    from lab.run.metrics import MetricsSink

WORKER_WAIT = 30
"""Seconds the Locust master waits for its workers before it starts with those it has."""
LOCUST_SETTINGS = "locust-settings.json"
"""The load's settings in the run's secrets folder (lab.load.settings)."""
LOAD_START_WAIT = WORKER_WAIT + 30.0
"""Seconds `lab run` waits for the master to start the load (lab.load.clock)."""


class Run:
    def __init__(self, opts: RunOptions) -> None:
        self.opts = opts
        self.sc = opts.scenario
        self.workers = self.sc.load.workers if opts.workers is None else opts.workers
        self.target: str = opts.target or self.sc.target.url or "reference"
        self.record = RunRecord(self.sc, self.workers, self.target, opts.toxiproxy)
        self.dir = Path()
        self.admin_token = os.urandom(24).hex()
        self.record.add_secret(self.admin_token, "admin-token")
        self.group: ProcessGroup | None = None
        self.client_url = ""
        self.client_tokens: tuple[tuple[str, str], ...] = tuple(sorted(self.sc.target.tokens.items()))
        self.master: Child | None = None
        self.toxiproxy: Any = None
        self.schedule: RunningSchedule | None = None
        self.outcomes: ToxicOutcomes | None = None
        self.monitor: ProcessMonitor | None = None
        self.phases: PhaseDriver | None = None
        self.restarts: RestartDriver | None = None
        self.server: Child | None = None
        """The reference server now running (a restart replaces it)."""
        self._private: Path | None = None
        self._console = Console(quiet=opts.quiet)
        self._interrupts = Interrupts(self.say)
        self.server_settings = make_server_settings(self.sc.target, admin_token=self.admin_token)
        self.server_settings.update(initial_knobs(self.sc))  # the first phase's knobs (lab.run.phases)
        self.client = sut.ClientUnderTest("lab", None)

    # ------------------------------------------------------------------ checks

    def check(self, *, compose: bool = False) -> None:
        """What can be refused before anything starts (RunError). In compose mode the parts
        are other containers, reached by service name: the loopback rule is the engine's."""
        check_load(self.sc, self.workers)
        try:
            self.client = sut.resolve(self.opts.client, self.sc, self.opts.baseline)
        except sut.ClientRefused as e:
            raise RunError(str(e)) from None
        if compose:
            if self.client.under_test:
                raise RunError(
                    f"compose mode runs the lab's own clients only, not --client {self.client.spec}"
                )
            check_real_toxiproxy(self.sc, "compose runs a real Toxiproxy; use lab run")
            if self.sc.restarts:
                raise RunError(
                    f"{self.sc.path}: [[restarts]] are for lab run (compose does not restart its parts)"
                )
            return
        check_local_chain(self.sc, self.target, self.opts.toxiproxy)
        if self.target == "reference":
            try:
                self._serve_options(None)
            except UnsafeSetting as e:
                raise RunError(f"{self.sc.path}: {e}") from None

    def check_box(self) -> None:
        """What this box cannot be expected to hold (lab.run.boxfit): warned about, or with
        `--strict` refused (RunError), before anything starts."""
        from lab.run.boxfit import misfits, this_box

        found = misfits(self.sc, this_box())
        if found and self.opts.strict:
            raise RunError(f"{self.sc.path}: this box cannot hold the run (--strict): " + "; ".join(found))
        for line in found:
            self.say(f"lab run: warning: {line} (--strict refuses such a run)", err=True)

    def preflight(self) -> None:
        """`--target URL`: the target's revision and tools, before any load (RunError)."""
        from lab.run.preflight import PreflightRefused, check_target

        try:
            sut.check_era(self.client, self.sc.target.era)
            self.client = sut.probe(self.client)
        except sut.ClientRefused as e:
            raise RunError(str(e)) from None
        self.record.client = self.client.as_json()
        if self.target == "reference":
            return
        token = self.client_tokens[0][0] if self.client_tokens else None
        try:
            facts = check_target(
                self.target,
                protocol_version=self.sc.target.protocol_version,
                era=self.sc.target.era,
                token=token,
                origin=client_origin(self.sc.target.allowed_origins),
            )
        except PreflightRefused as e:
            raise RunError(str(e)) from None
        self.record.target_facts = facts.as_json()

    def _serve_options(self, folder: Path | None) -> list[str]:
        if serve_accepts_config():
            if folder is None:
                return []
            return serve_options(self.server_settings, server_config_file(folder, self.server_settings))
        return serve_options(self.server_settings, None)

    # ------------------------------------------------------------------ the run

    def execute(self) -> int:
        """The whole run; its exit code. RunError (nothing started) and RunFolderError
        (the folder cannot be written: exit 4) propagate to the caller."""
        root = self.opts.out.absolute()  # the parts run in the run folder: no relative path may reach them
        for folder in mark_abandoned_runs(root):
            self.say(f"marked abandoned (its lab run died without finishing): {folder}", err=True)
        self.check()
        self.check_box()
        self.preflight()
        self.dir = create_run_folder(root, self.sc.name)
        self.record.start(self.dir)
        self.group = ProcessGroup(
            self.dir / "logs", {**os.environ, "LAB_LEDGER_KEY": self.record.key_hex}, self.dir
        )
        self._interrupts.install()
        self.say(f"run {self.dir.name}: {self.sc.description or self.sc.name}")
        self.say(f"results: {self.dir}")
        lab_failure: str | None = None
        try:
            try:
                for sub in ("clients", "server", "proxy", "logs"):
                    (self.dir / sub).mkdir(exist_ok=True)
            except OSError as e:
                raise RunFolderError(f"cannot create the folders of {self.dir}: {e.strerror or e}") from None
            if self.target == "reference" and self.sc.target.store == "durable":
                self.server_settings["store"] = str(self._private_dir() / "store.sqlite")
            self.record.write()
            self._start_monitor()
            self._start_all()
            self._start_phases()
            self.record.processes = [c.as_json() for c in self.group.children]
            self.record.write()  # what runs, by PID, while it runs
            self._monitor()
        except StartError as e:
            self.record.end(f"error: {e}")
            self.say(f"lab run: {e}", err=True)
        except RunFolderError as e:
            lab_failure = str(e)
            self.record.end(f"lab failed: {e}")
        except BaseException as e:  # a bug of ours: still stop everything and keep the ledgers
            self.record.end(f"lab failed: {type(e).__name__}: {e}")
            raise
        finally:
            if self.phases is not None:
                self.phases.stop()
            if self.restarts is not None:
                self.restarts.stop()
            self._stop_all()
            if self._private is not None:  # the server's store holds raw session IDs
                shutil.rmtree(self._private, ignore_errors=True)
            if self.monitor is not None:
                self.monitor.stop()
            drop_secrets(self.dir)
            self._interrupts.restore()
            self._finish_record()
            try:
                self.record.write()
            except RunFolderError as e:
                lab_failure = lab_failure or str(e)
        if lab_failure is not None:
            raise RunFolderError(lab_failure)
        if self.record.end_reason.startswith("error"):
            return ExitCode.CANNOT_RUN
        if not self.opts.report:
            return ExitCode.PASS if self.record.complete else ExitCode.INCONCLUSIVE
        code = self._report()
        if code not in (ExitCode.PASS, ExitCode.GATE_FAILED, ExitCode.INCONCLUSIVE):
            return ExitCode.LAB_FAILED  # the checker crashed or could not write its outputs
        if not self.record.complete and code == ExitCode.PASS:
            return ExitCode.INCONCLUSIVE  # an incomplete run cannot pass
        return code

    def say(self, text: str, *, err: bool = False) -> None:
        """Print a line; a closed stdout or stderr (the terminal went away) does not stop the run."""
        self._console.say(text, err=err)

    def _start_monitor(self) -> None:
        """Every process of the run sampled once a second into processes.jsonl (lab.run.monitor)."""
        group = self.group
        assert group is not None
        self.monitor = ProcessMonitor(
            self.dir / PROCESSES_FILE, lambda: [(c.name, c.pid) for c in list(group.children)]
        )
        self.monitor.start()

    def _start_phases(self) -> None:
        """Phase knobs, the rollout probe, the knee (lab.run.phases): for runs with [[phases]]."""
        if not self.sc.phases or self.group is None:
            return
        server = next((c for c in self.group.children if c.name == "server"), None)
        admin = (
            None if server is None else server.ready.replace(urlsplit(server.ready).path, "/lab-admin/knobs")
        )
        self.phases = PhaseDriver(
            self.sc,
            self.dir,
            self.record.run_start,
            admin_url=admin,
            admin_token=self.admin_token,
            client_url=self.client_url,
            origin=client_origin(self.sc.target.allowed_origins),
            token=self.client_tokens[0][0] if self.client_tokens else None,
        )
        self.phases.start()

    def _start(self, part: topology.Part, name: str = "", **kw: Any) -> Child:
        """Start a part and wait until it is ready."""
        return self._ready(self._launch(part, name, **kw), part)

    def _launch(self, part: topology.Part, name: str = "", **kw: Any) -> Child:
        """Start a part without waiting for it (`_ready` waits): parts that do not need
        each other start together, so a run's start costs the slowest, not the sum."""
        assert self.group is not None
        if self._interrupts.interrupted.is_set():
            raise StartError("interrupted while starting")
        env = {**part.env, **kw.pop("env", {})}
        return self.group.start(name or part.name, list(part.argv), extra_env=env, **kw)

    def _ready(self, child: Child, part: topology.Part) -> Child:
        assert self.group is not None
        if part.ready_line is not None:
            self.group.wait_ready(child, part.ready_line, interrupted=self._interrupts.interrupted.is_set)
        return child

    def _start_all(self) -> None:
        site, run = topology.LOCAL, str(self.dir)
        # The TCP nemesis (or a real Toxiproxy) goes in front of mitmdump, which goes in
        # front of the target: the nemesis needs neither to start, so it starts first and
        # the others meanwhile (each part takes about a second to be ready on its own).
        from lab.nemesis.client import ToxiproxyClient, ToxiproxyError

        nemesis_part = topology.nemesis(site, run, self.sc.seed)
        shared = self.opts.toxiproxy
        nem = self._launch(nemesis_part, essential=True) if shared is None else None
        # Locust imports meanwhile too (about a second): its processes wait for their
        # settings, which need the chain's address, and `lab run` writes them once the
        # chain is up (LoadSettings.from_env).
        plan = self.dir / topology.PLAN_FILE
        self.record.write_plan(plan, time.time())
        settings = secret_path(self.dir, LOCUST_SETTINGS)
        self._launch_locust(site, run, settings)
        # The target.
        replicas: list[str] = []
        if self.target == "reference":
            replicas = self._start_servers(site, run)
            target_url = replicas[0]
        else:
            target_url = self.target
        parts = urlsplit(target_url)
        upstream = f"{parts.scheme}://{parts.netloc}"

        # The fault layer: mitmdump with the addon, in reverse mode in front of the target
        # (and, with replicas, the balancer over them: lab.faults.balance).
        options = {
            "mcpfaults_poll": "0.2",
            "mcpfaults_allowed_origins": ",".join(self.sc.target.allowed_origins),
        }
        if len(replicas) > 1:
            options["mcpfaults_replicas"] = ",".join(urlsplit(u).netloc for u in replicas)
            options["mcpfaults_affinity"] = self.sc.target.affinity
        env = {"LAB_ADMIN_TOKEN": self.admin_token} if self.target == "reference" else {}
        mitm_part = topology.fault_proxy(site, run, upstream, options)
        mitm_port = urlsplit(self._start(mitm_part, essential=True, env=env).ready).port

        if nem is not None:
            self.toxiproxy = ToxiproxyClient(self._ready(nem, nemesis_part).ready)
            proxy_name = PROXY_NAME
        else:
            from lab.nemesis.log import NemesisLog

            assert shared is not None
            self.toxiproxy = ToxiproxyClient(shared, log=NemesisLog(self.dir / "nemesis.jsonl"))
            proxy_name = f"{PROXY_NAME}-{self.dir.name}"  # a shared Toxiproxy: one proxy per run
        try:
            proxy = self.toxiproxy.create_proxy(
                proxy_name, upstream=f"127.0.0.1:{mitm_port}", listen="127.0.0.1:0"
            )
        except ToxiproxyError as e:
            raise StartError(f"the nemesis refused the proxy {proxy_name}: {e}") from None
        self.record.proxy_name = proxy_name
        self.client_url = f"http://{proxy.listen}{parts.path or '/mcp'}"
        self.record.client_url = self.client_url

        # The load's settings: the Locust processes waiting for them go on (the master
        # starts the load once its workers are in).
        write_secret(self.dir, LOCUST_SETTINGS, self._load_settings().to_json())
        # While Locust starts: the checker (and pandas), which the progress line needs.
        threading.Thread(target=importlib.import_module, args=("lab.checker",), daemon=True).start()
        self._wait_for_the_load(LOAD_START_WAIT)
        self._start_toxics(proxy_name)
        self._start_restarts()

    def _launch_locust(self, site: topology.Site, run: str, settings: Path) -> None:
        """Locust master + workers, their settings at `settings` (written later). The run's
        clock starts when the master starts the load (lab.load.clock); until then, from
        the launch."""
        master_port = free_port()
        self.record.run_start = time.time()
        self.record.write_plan(self.dir / topology.PLAN_FILE, self.record.run_start)
        ui_port = free_port() if self.opts.ui else None
        if ui_port is not None:
            self.say(f"Locust web UI: http://127.0.0.1:{ui_port}")
        env = {SETTINGS_ENV: str(settings), **sut.worker_env(self.client)}
        # Orphaned Locust processes are killed outright (see lab.run.processes).
        self.master = self._start(
            topology.master(
                site,
                run,
                port=master_port,
                workers=str(self.workers),
                ui_port=ui_port,
                worker_wait=WORKER_WAIT,
            ),
            env=env,
            death_signal=signal.SIGKILL,
        )
        for i in range(self.workers):
            part = topology.worker(site, run, master_host="127.0.0.1", master_port=master_port)
            self._start(
                part,
                f"worker-{i}",
                essential=True,
                exits_when_done=True,
                death_signal=signal.SIGKILL,
                env={**env, "LAB_WORKER_INDEX": str(i)},
            )

    def _private_dir(self) -> Path:
        """A folder of this run's private files outside the run folder (0700), removed
        when the run ends: a durable store holds raw session IDs, which nothing in a run
        folder may."""
        if self._private is None:
            self._private = Path(tempfile.mkdtemp(prefix="lab-private-"))
        return self._private

    def _start_servers(self, site: topology.Site, run: str) -> list[str]:
        """The reference server, or its replicas (`target.replicas`): the URL of each.

        Replicas with a store each (`volatile`, `durable`) are processes of their own,
        `server`, `server-2`, ..., without a server ledger (one ledger is one server's
        account; the tap is the truth); `shared` is one process answering on a port per
        replica (`lab serve --replicas N`): one state, as replicas over one store have."""
        n, store = self.sc.target.replicas, self.sc.target.store
        if n == 1 or store == "shared":
            extra = ["--replicas", str(n)] if n > 1 else []
            server = self._start(
                topology.server(site, run, [*self._serve_options(self.dir), *extra]), essential=True
            )
            drop_secrets(self.dir)  # the server has read its settings
            self.server = server
            return server.ready.split()
        urls = []
        for i in range(n):
            if store == "durable":
                self.server_settings["store"] = str(self._private_dir() / f"store-{i + 1}.sqlite")
            name = "server" if i == 0 else f"server-{i + 1}"
            part = topology.server(site, run, self._serve_options(self.dir), name=name, ledger=False)
            child = self._start(part, essential=True)
            drop_secrets(self.dir)
            self.server = self.server or child
            urls.append(child.ready)
        return urls

    def _start_restarts(self) -> None:
        """`[[restarts]]`, counted from the run start (lab.run.restarts)."""
        if not self.sc.restarts:
            return
        reference = self.target == "reference"
        self.restarts = RestartDriver(
            self.sc.restarts,
            self.dir,
            self.record.run_start,
            say=self.say,
            group=self.group,
            server=self.server,
            start_server=self._restart_server if reference else None,
            store=self.sc.target.store if reference else "unknown",
            command=self.sc.target.restart_command,
            command_timeout=self.sc.target.restart_timeout,
            env=dict(os.environ),
        )
        self.restarts.start()

    def _restart_server(self, n: int) -> Child:
        """The reference server started again after restart `n`: on the port it had (the
        proxy points there), with the same settings and files; ready when it returns."""
        assert self.server is not None
        port = urlsplit(self.server.ready).port
        site = replace(topology.LOCAL, ports={**topology.LOCAL.ports, "server": port or 0})
        try:
            return self._start(
                topology.server(site, str(self.dir), self._serve_options(self.dir)), f"server-r{n}"
            )
        finally:
            drop_secrets(self.dir)  # the server has read its settings again

    def _wait_for_the_load(self, limit: float) -> None:
        """Until the master starts the load (its workers connected) and says when: the
        run's zero, from which the toxics, the phases and the run's own clock count, as the
        fault plan's and the load shape's do. Returns early when a part dies, on an
        interrupt or after `limit` s, the run start left at the launch: the monitor then
        tells what happened, as it would have."""
        group, launched = self.group, time.time()
        assert group is not None
        said: list[bool] = []

        def give_up() -> bool:
            if not said and time.time() - launched > 5:
                said.append(True)
                self.say("lab run: waiting for the Locust workers to connect and the load to start")
            return self._interrupts.interrupted.is_set() or any(
                c.died() for c in group.children if c.essential or c is self.master
            )

        at = wait_for_load_start(self.dir, limit, give_up=give_up)
        if at is not None:
            self.record.run_start = at

    def _load_settings(self) -> LoadSettings:
        settings = self.sc.load_settings(self.client_url, str(self.dir))
        return replace(
            settings,
            plan_file=str(self.dir / topology.PLAN_FILE),
            origin=client_origin(self.sc.target.allowed_origins),
            tokens=self.client_tokens,
            workers=self.workers,
            client=self.client.spec,
        )

    def _start_toxics(self, proxy_name: str) -> None:
        self.outcomes = ToxicOutcomes(JsonLines(self.dir / "nemesis.jsonl"))
        self.schedule = start_schedule(
            self.sc, self.toxiproxy, proxy_name, self.record.run_start, self.dir / "nemesis.jsonl"
        )
        self.outcomes.runner = self.schedule.runner if self.schedule is not None else None

    def _monitor(self) -> None:
        outcomes = self.outcomes
        assert outcomes is not None
        watcher = Watcher(self.dir, self.sc, self.record.run_start, outcomes)
        ui_stop = LoadStopped() if self.opts.ui else None
        metrics = self._metrics_sinks()
        try:
            self._watch(watcher, ui_stop, metrics)
        finally:
            for sink in metrics:
                sink.close()

    def _metrics_sinks(self) -> list[MetricsSink]:
        """`--metrics-port` and `--metrics-file`, for the load phase (one that cannot be had
        is one line, and the run goes on without it)."""
        sinks: list[MetricsSink] = []
        if self.opts.metrics_port is None and self.opts.metrics_file is None:
            return sinks
        from lab.run.metrics import MetricsFile, MetricsServer

        if self.opts.metrics_port is not None:
            try:
                server = MetricsServer(self.opts.metrics_port)
            except OSError as e:
                self.say(
                    f"lab run: no metrics endpoint on port {self.opts.metrics_port}: {e.strerror or e}",
                    err=True,
                )
            else:
                self.say(f"metrics: {server.url} (Prometheus text, while the load runs)")
                sinks.append(server)
        if self.opts.metrics_file is not None:
            try:
                sinks.append(MetricsFile(self.opts.metrics_file))
            except OSError as e:
                self.say(f"lab run: no metrics file {self.opts.metrics_file}: {e.strerror or e}", err=True)
            else:
                self.say(f"metrics: {self.opts.metrics_file} (one JSON line a second, while the load runs)")
        return sinks

    def _watch(self, watcher: Watcher, ui_stop: LoadStopped | None, metrics: list[MetricsSink]) -> None:
        load, group, master = self.sc.load, self.group, self.master
        assert group is not None and master is not None
        while True:
            self._next_tick(watcher, master)
            now = time.time()
            elapsed = now - self.record.run_start
            text, reason, complete = watcher.tick(now)
            self.say(text)
            if metrics:
                snap = watcher.snapshot(now)
                for sink in metrics:
                    sink.update(snap)
            if self._interrupts.interrupted.is_set():
                self.record.end("interrupted")
                return
            if self.restarts is not None and self.restarts.failure is not None:
                self.record.end(f"part died: {self.restarts.failure}", died="server")
                self.say(f"lab run: {self.restarts.failure}", err=True)
                return
            for child in group.children:
                if child.essential and child.died():
                    group.reap(child)
                    code = child.proc.returncode
                    self.record.end(f"part died: {child.name} exited with {code}", died=child.name)
                    self.say(f"lab run: {child.name} died (exit {code}):\n{child.tail()}", err=True)
                    return
            if reason is None and self.phases is not None and self.phases.stop_reason is not None:
                reason, complete = self.phases.stop_reason, True  # a ramp past its knee ends by design
            if reason is not None:
                self.record.end(reason, complete=complete)
                if not complete:
                    self.say(f"lab run: {reason}", err=True)
                return
            if not master.alive():
                group.reap(master)
                ended = load_ended(self.dir)
                # The load shape ended (or Locust gave up): the duration is over.
                if master.proc.returncode == 0 and (
                    elapsed >= self.sc.horizon - 2 or ended == "load_complete"
                ):
                    short = watcher.shape_not_reached()
                    self.record.end(short or "duration", complete=short is None)
                    if short is not None:
                        self.say(f"lab run: {short}", err=True)
                elif master.proc.returncode == 0 and ended == "stopped_in_ui":
                    self.record.end("stopped from the Locust UI", complete=False)
                else:
                    reason = f"part died: master exited with {master.proc.returncode}"
                    # A master that quits early with 0 has usually lost its workers (their
                    # heartbeats late): say so when the lab's own processes were at their
                    # limits, so the report does not read as a target's failure.
                    limits = (
                        lab_limits(self.dir, self.record.run_start, now)
                        if master.proc.returncode == 0
                        else []
                    )
                    if limits:
                        reason = (
                            f"limited by the lab: the Locust master ended the load early ({reason}; it lost "
                            f"its workers), the lab's own processes at their limits: {'; '.join(limits)}"
                        )
                    self.record.end(reason, died="master")
                    self.say(master.tail(), err=True)
                return
            if ui_stop is not None and ui_stop.observe(now, int(watcher.progress.get("users", 0))):
                # The web UI's STOP (or the shape's end, the UI staying up): the load is over.
                self.record.end("stopped from the Locust UI", complete=elapsed >= self.sc.horizon - 2)
                return
            if elapsed >= load.hard_timeout:
                self.record.end("hard_timeout")
                return

    def _next_tick(self, watcher: Watcher, master: Child) -> None:
        """A second, or less when the load has ended: the master exited, or the last
        scripted client left (a short run, a replay, a shrink's candidate do not wait out
        the second)."""
        end = time.monotonic() + 1.0
        while not self._interrupts.interrupted.wait(0.1):
            if time.monotonic() >= end or not master.alive() or watcher.scripts_done():
                return

    def _stop_all(self) -> None:
        group = self.group
        if group is None:
            return
        if self.schedule is not None:
            self.schedule.stop()
        if self.opts.toxiproxy is not None and self.record.proxy_name is not None:
            # A shared Toxiproxy keeps no proxy of a run that is over.
            with contextlib.suppress(Exception):
                self.toxiproxy.delete_proxy(self.record.proxy_name)
        stop_parts(
            group,
            self.master,
            self.dir,
            end_reason=self.record.end_reason,
            died=self.record.died,
            ui=self.opts.ui,
            force=self._interrupts.force,
        )

    # ------------------------------------------------------------------ records

    def _finish_record(self) -> None:
        if self.client.command is not None and self.dir != Path():
            adapters = sut.adapters_of(self.dir)
            left = sut.stop_leftovers(adapters, self.client.command)
            if left:
                self.say(f"lab run: stopped {len(left)} adapter(s) left running (PIDs {left})", err=True)
            self.record.client = {**self.record.client, "adapters": adapters}
        if self.group is not None:
            self.record.processes = [c.as_json() for c in self.group.children]
        if self.outcomes is not None:
            self.outcomes.update()
            self.record.toxic_outcomes = self.outcomes.records
            failed = self.outcomes.failed_removal()
            if failed is not None:
                self.record.spoil(f"toxic removal failed: {describe_outcome(failed)}")
        self.record.finish()

    def _report(self) -> int:
        assert self.group is not None
        self.say("checking the ledgers ...")
        flags = ["--quiet"] if self.opts.quiet else []
        flags += [] if self.opts.figures else ["--no-figures"]
        code = self.group.run([topology.LOCAL.program("lab"), "report", str(self.dir), *flags])
        html = self.dir / "report.html"
        if html.exists():
            self.say(f"report: {html}")
        return code
