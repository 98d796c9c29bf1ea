"""`lab run`: one scenario, end to end, with every part really started on 127.0.0.1.

    Locust master + workers ──► TCP nemesis ──► mitmdump + addon ──► target server
    (clients/*.sqlite)          (nemesis.jsonl)  (proxy/tap.jsonl)   (server/ledger.sqlite)

1. The scenario is loaded and checked whole; a bad one is refused before anything starts.
2. The parts start on free ports, each waited for (its "listening" line), logs in `logs/`.
3. While it runs, one progress line a second; it stops at the event target, at the end of
   the load shape, or at the hard time bound — whichever comes first.
4. Every process it started is stopped by PID; `run.json` records what ran and how it
   ended (`complete: false` if anything cut the run short).
5. The checker (`lab report`) reads the folder and its exit code is the run's.

Exit codes: 0 every gate passed, 1 a gate failed, 2 inconclusive (too little evidence, or
an incomplete run), 3 the run could not be made (bad scenario, a part did not start).
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from lab import __version__
from lab.faults.launch import FAULT_ADDON, mitmdump_argv, ready_prefix
from lab.load.settings import SETTINGS_ENV, LoadSettings
from lab.run.processes import Child, ProcessGroup, StartError
from lab.run.progress import NemesisCounter, ProgressLine, TapCounter, read_progress
from lab.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "lab" / "load" / "locustfile.py"
EXIT_CANNOT_RUN = 3
PROXY_NAME = "mcp"


class RunError(RuntimeError):
    """The run could not be made; the message says which part and why."""


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    target: str | None = None
    """None: the scenario's target; "reference" or a URL overrides it."""
    workers: int | None = None
    toxiproxy: str | None = None
    """A real Toxiproxy API URL; None starts the embedded nemesis."""
    out: Path = ROOT / "results"
    ui: bool = False
    report: bool = True
    quiet: bool = False


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def _client_origin(allowed: tuple[str, ...]) -> str | None:
    """A legal Origin for the lab's clients: the first allowed one (a `:*` port made concrete)."""
    if not allowed:
        return None
    first = allowed[0]
    return first[:-2] + ":3000" if first.endswith(":*") else first


def _versions(toxiproxy: str | None) -> dict[str, str]:
    out = {
        "lab": __version__,
        "python": platform.python_version(),
        "toxiproxy": toxiproxy or "embedded nemesis",
    }
    for dist in ("mitmproxy", "locust", "uvicorn", "httpx", "trio", "pandas", "gevent"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


class Run:
    def __init__(self, opts: RunOptions) -> None:
        self.opts = opts
        self.sc = opts.scenario
        self.workers = opts.workers or self.sc.load.workers
        self.target: str = opts.target or self.sc.target.url or "reference"
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_id = f"{stamp}-{self.sc.name}"
        self.dir = opts.out / self.run_id
        self.key = secrets.token_bytes(32)
        self.admin_token = secrets.token_urlsafe(24)
        self.group = ProcessGroup(self.dir / "logs", {**os.environ, "LAB_LEDGER_KEY": self.key.hex()}, ROOT)
        self.started_at = time.time()
        self.run_start = self.started_at
        self.stopped_at: float | None = None
        self.end_reason = "running"
        self.complete = False
        self._interrupted = threading.Event()
        self.toxics_runner: Any = None
        self._toxics_thread: threading.Thread | None = None
        self.client_url = ""
        self.locust_master: Child | None = None
        self.client_tokens: tuple[tuple[str, str], ...] = tuple(sorted(self.sc.target.tokens.items()))
        self.essential: list[Child] = []

    # ------------------------------------------------------------------ checks

    def check(self, *, compose: bool = False) -> None:
        """What can be refused before anything starts. In compose mode the parts are other
        containers, reached by service name: the loopback rule is the engine's network's."""
        if self.workers < 1:
            raise RunError("--workers must be at least 1")
        if self.sc.reconnect.budget_qps < self.workers:
            raise RunError(
                f"{self.sc.path}: reconnect.budget_qps is {self.sc.reconnect.budget_qps:g}, below the number of "
                f"workers ({self.workers}): each worker needs a whole reconnect per second of the budget"
            )
        if compose:
            return
        if self.target != "reference" and not _is_loopback(self.target):
            raise RunError(f"target {self.target}: this lab only sends traffic to 127.0.0.1 (loopback)")
        if self.target != "reference" and any(str(r.kind) == "expiry_race" for r in self.sc.faults):
            raise RunError(
                f"{self.sc.path}: the expiry_race fault needs the reference server's admin control"
            )
        if self.opts.toxiproxy is not None and not _is_loopback(str(self.opts.toxiproxy)):
            raise RunError(f"--toxiproxy {self.opts.toxiproxy}: only a Toxiproxy on 127.0.0.1 is allowed")
        if not FAULT_ADDON.exists():
            raise RunError(f"the mitmproxy addon is missing: {FAULT_ADDON}")

    # ------------------------------------------------------------------ the run

    def execute(self) -> int:
        self.check()
        for sub in ("clients", "server", "proxy", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_run_json()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.say(f"run {self.run_id}: {self.sc.description or self.sc.name}")
        self.say(f"results: {self.dir}")
        try:
            self._start_all()
            self._monitor()
        except (StartError, RunError) as e:
            self.end_reason = f"error: {e}"
            self.say(f"lab run: {e}", err=True)
        except Exception as e:  # a bug of ours: still stop everything and keep the ledgers
            self.end_reason = f"error: {type(e).__name__}: {e}"
            raise
        finally:
            self._stop_all()
            for s, h in old.items():
                signal.signal(s, h)
            self._write_run_json()
        if self.end_reason.startswith("error"):
            return EXIT_CANNOT_RUN
        code = self._report() if self.opts.report else 0
        if not self.complete and code == 0:
            return 2  # an incomplete run cannot pass
        return code

    def say(self, text: str, *, err: bool = False) -> None:
        if not self.opts.quiet or err:
            print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._interrupted.is_set():
            return
        self._interrupted.set()
        self.say(f"\n{signal.Signals(signum).name}: stopping every part, keeping what was written", err=True)

    def _start_all(self) -> None:
        # Target.
        if self.target == "reference":
            srv = self.group.start(
                "server",
                [
                    _bin("lab"),
                    "serve",
                    "--port",
                    "0",
                    "--ledger",
                    str(self.dir / "server" / "ledger.sqlite"),
                    # `=`: a random token may start with "-", which argparse would take for an option
                    f"--admin-token={self.admin_token}",
                    *self.sc.serve_args(),
                ],
            )
            self.essential.append(srv)
            target_url = self.group.wait_ready(srv, "lab-serve listening on ")
        else:
            target_url = self.target
        parts = urlsplit(target_url)
        upstream = f"{parts.scheme}://{parts.netloc}"
        self._check_interrupt()

        # The fault layer: mitmdump with the addon, in reverse mode in front of the target.
        plan = self.dir / "proxy" / "plan.json"
        self._write_plan(plan, time.time())
        options = {
            "mcpfaults_plan": str(plan),
            "mcpfaults_tap": str(self.dir / "proxy" / "tap.jsonl"),
            "mcpfaults_poll": "0.2",
            "mcpfaults_allowed_origins": ",".join(self.sc.target.allowed_origins),
        }
        if self.target == "reference":
            options["mcpfaults_admin_token"] = self.admin_token
        mitm = self.group.start("mitmdump", mitmdump_argv(upstream, options=options))
        self.essential.append(mitm)
        mitm_url = self.group.wait_ready(mitm, ready_prefix())
        mitm_port = urlsplit(mitm_url).port
        self._check_interrupt()

        # The TCP nemesis (or a real Toxiproxy) in front of mitmdump.
        from lab.nemesis.client import ToxiproxyClient

        if self.opts.toxiproxy is None:
            nem = self.group.start(
                "nemesis",
                [_bin("lab"), "nemesis", "--api-port", "0", "--log", str(self.dir / "nemesis.jsonl")],
            )
            self.essential.append(nem)
            api = self.group.wait_ready(nem, "lab-nemesis api ")
            self.toxiproxy = ToxiproxyClient(api)
        else:
            from lab.nemesis.log import NemesisLog

            self.toxiproxy = ToxiproxyClient(self.opts.toxiproxy, log=NemesisLog(self.dir / "nemesis.jsonl"))
        existing = self.toxiproxy.get_proxy(PROXY_NAME)
        if existing is not None:
            self.toxiproxy.delete_proxy(PROXY_NAME)
        proxy = self.toxiproxy.create_proxy(
            PROXY_NAME, upstream=f"127.0.0.1:{mitm_port}", listen="127.0.0.1:0"
        )
        self.client_url = f"http://{proxy.listen}{parts.path or '/mcp'}"
        self._check_interrupt()

        # Load: Locust master + workers. The run's clock starts here.
        settings_path = self.dir / "locust-settings.json"
        settings_path.write_text(self._load_settings().to_json(), encoding="utf-8")
        env = {SETTINGS_ENV: str(settings_path)}
        master_port = _free_port()
        self.run_start = time.time()
        self._write_plan(plan, self.run_start)  # the addon re-reads it: windows now count from here
        master_args = [
            _bin("locust"),
            "-f",
            str(LOCUSTFILE),
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(master_port),
            "--expect-workers",
            str(self.workers),
            "--expect-workers-max-wait",
            "30",
            "--stop-timeout",
            "10",
            "--only-summary",
            "--exit-code-on-error",  # failed calls are what a chaos run is about, not a failure of the run
            "0",
            "--json-file",
            str(self.dir / "locust"),
        ]
        if self.opts.ui:
            web_port = _free_port()
            master_args += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(web_port)]
            self.say(f"Locust web UI: http://127.0.0.1:{web_port}")
        else:
            master_args += ["--headless"]
        self.locust_master = self.group.start("locust-master", master_args, extra_env=env)
        for i in range(self.workers):
            self.group.start(
                f"locust-worker-{i}",
                [
                    _bin("locust"),
                    "-f",
                    str(LOCUSTFILE),
                    "--worker",
                    "--master-host",
                    "127.0.0.1",
                    "--master-port",
                    str(master_port),
                ],
                extra_env={**env, "LAB_WORKER_INDEX": str(i)},
            )
        self._start_toxics()

    def _check_interrupt(self) -> None:
        if self._interrupted.is_set():
            raise RunError("interrupted while starting")

    def _write_plan(self, path: Path, run_start: float) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.sc.fault_plan_json(run_start), encoding="utf-8")
        os.replace(tmp, path)

    def _load_settings(self) -> LoadSettings:
        settings = self.sc.load_settings(self.client_url, str(self.dir))
        return replace(
            settings,
            origin=_client_origin(self.sc.target.allowed_origins),
            tokens=self.client_tokens,
            workers=self.workers,
        )

    def _start_toxics(self) -> None:
        schedule = self.sc.toxics_schedule()
        if not schedule:
            return
        from lab.nemesis.schedule import ScheduledToxic, ToxicScheduleRunner
        from lab.nemesis.toxics import make_toxic

        entries = [
            ScheduledToxic(
                PROXY_NAME,
                make_toxic(
                    t["kind"], stream=t["stream"], name=t["name"], toxicity=t["toxicity"], **t["attributes"]
                ),
                float(t["at"]),
                None if t["until"] is None else float(t["until"]),
            )
            for t in schedule
        ]
        self.toxics_runner = ToxicScheduleRunner(self.toxiproxy, entries, self.run_start)
        self._toxics_thread = threading.Thread(target=self.toxics_runner.run, name="toxics", daemon=True)
        self._toxics_thread.start()

    def _monitor(self) -> None:
        load = self.sc.load
        horizon = self.sc.horizon
        hard = load.hard_timeout
        tap = TapCounter(self.dir / "proxy" / "tap.jsonl")
        nemesis = NemesisCounter(self.dir / "nemesis.jsonl")
        line = ProgressLine(self.sc.reconnect.budget_qps, horizon, load.event_target)
        master = self.locust_master
        assert master is not None
        while True:
            time.sleep(1.0)
            now = time.time()
            elapsed = now - self.run_start
            tap.update()
            nemesis.update()
            self.say(
                line.render(elapsed, now, read_progress(self.dir / "progress.json"), tap, nemesis.toxics)
            )
            if self._interrupted.is_set():
                self.end_reason = "interrupted"
                return
            for child in self.essential:
                if not child.alive():
                    raise RunError(f"{child.name} died (exit {child.proc.returncode}):\n{child.tail()}")
            if load.event_target is not None and tap.events >= load.event_target:
                self.end_reason, self.complete = "event_target", True
                return
            if not master.alive():
                # The load shape ended (or Locust gave up): the duration is over.
                ok = master.proc.returncode == 0 and elapsed >= horizon - 2
                self.end_reason = (
                    "duration" if ok else f"error: Locust master exited with {master.proc.returncode}"
                )
                self.complete = ok
                if not ok:
                    self.say(master.tail(), err=True)
                return
            if elapsed >= hard:
                self.end_reason = "hard_timeout"
                return

    def _stop_all(self) -> None:
        if self.toxics_runner is not None:
            self.toxics_runner.stop()
            if self._toxics_thread is not None:
                self._toxics_thread.join(timeout=15)
        master = self.locust_master
        if master is not None and master.alive():
            # Ask the master to quit (see lab/load/locustfile.py): it tells its workers, which
            # stop their users gracefully (users DELETE their sessions) and exit by themselves.
            (self.dir / "stop-requested").touch()
            deadline = time.monotonic() + 20
            while master.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            self.group.stop(master, grace=10)  # only if it did not go by itself
        workers = [c for c in self.group.children if c.name.startswith("locust-worker")]
        deadline = time.monotonic() + 30
        while any(w.alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        for child in workers:  # only the ones that did not go by themselves
            self.group.stop(child, grace=15)
        self.group.stop_all(grace=10)
        self.stopped_at = time.time()

    # ------------------------------------------------------------------ records

    def _write_run_json(self) -> None:
        splits = []
        split_file = self.dir / "budget_split.jsonl"
        if split_file.exists():
            for raw in split_file.read_text(encoding="utf-8").splitlines():
                try:
                    splits.append(json.loads(raw))
                except ValueError:
                    continue
        record = {
            "schema": "mcpLabRun.v1",
            "run_id": self.run_id,
            "scenario": self.sc.to_dict(),
            "scenario_file": str(self.sc.path),
            "seed": self.sc.seed,
            "started_at": self.run_start,
            "stopped_at": self.stopped_at,
            "complete": self.complete,
            "end_reason": self.end_reason,
            "budgets": self.sc.budgets(),
            "budget_split": splits,
            "fault_windows": self.sc.fault_windows(self.run_start),
            "processes": [c.as_json() for c in self.group.children],
            "versions": _versions(self.opts.toxiproxy),
            "target": {
                "kind": "reference" if self.target == "reference" else "url",
                "url": None if self.target == "reference" else self.target,
            },
            "client_url": self.client_url,
            "workers": self.workers,
        }
        tmp = self.dir / "run.json.tmp"
        tmp.write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
        os.replace(tmp, self.dir / "run.json")

    def prepare(self, client_url: str, *, run_schedule: bool) -> int:
        """Compose mode: containers run the parts; this writes their inputs into the run
        folder (fault plan, Locust settings, run.json) and, given a Toxiproxy API, carries
        out the scenario's toxics schedule until the scenario's horizon."""
        self.check(compose=True)
        for sub in ("clients", "server", "proxy", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.client_url = client_url
        self.run_start = time.time()
        self.end_reason = "compose"
        self._write_plan(self.dir / "proxy" / "plan.json", self.run_start)
        (self.dir / "locust-settings.json").write_text(self._load_settings().to_json(), encoding="utf-8")
        self._write_run_json()
        self.say(f"prepared {self.dir}")
        if run_schedule and self.opts.toxiproxy is not None:
            from lab.nemesis.client import ToxiproxyClient, wait_until_up

            self.toxiproxy = ToxiproxyClient(self.opts.toxiproxy)
            wait_until_up(self.toxiproxy, within=60.0)
            self._start_toxics()
            if self._toxics_thread is not None:
                self._toxics_thread.join(timeout=self.sc.horizon + 30)
        return 0

    def _report(self) -> int:
        self.say("checking the ledgers ...")
        proc = subprocess.run([_bin("lab"), "report", str(self.dir)], cwd=ROOT, check=False)
        html = self.dir / "report.html"
        if html.exists():
            self.say(f"report: {html}")
        return proc.returncode
