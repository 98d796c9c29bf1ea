"""The parts of a scenario as loaded: its sections as frozen dataclasses, and the
constants the loader checks against (docs/scenarios.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lab.faults.checks import Issue
from lab.faults.decisions import Window
from lab.faults.plan import Plan, Rule
from lab.load.settings import READ_TIMEOUT_S, SCRIPT_OPS, ClientScript
from lab.resources import scenario_dir
from lab.wire import budgets

if TYPE_CHECKING:
    from lab.load.settings import LoadSettings


SCENARIO_DIR: Final = scenario_dir()

PHASE_KINDS: Final = ("steady", "ramp", "faults", "recovery", "quiet")
ROLLBACK_MODES: Final = ("keep-index", "drop-index")
"""`[phases.server] rollback`: the documented rollback keeps the old generation's cursor
index until its sessions expire; `drop-index` is the unacceptable one (old cursors are
refused at once), there to prove that the rollout's checks catch it."""
FAULT_FREE_PHASES: Final = frozenset({"steady", "recovery", "quiet"})
"""Phases during which no fault or toxic may be active (a window overlapping one contradicts it)."""

REQUIRED_ATTRIBUTES: Final[Mapping[str, tuple[str, ...]]] = {
    "latency": ("latency",),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": (),
    "limit_data": ("bytes",),
    "slicer": ("average_size",),
    "idle_timeout": ("timeout",),
    "buffer": ("size",),
    "header_hold": (),
}
"""Attributes a scenario must give (the nemesis takes a missing one as 0, which for these
is almost always a typo). The kinds and the rest of the rules are the nemesis's own
(`lab.nemesis.toxics`), so a scenario that loads is one the nemesis accepts."""
TOXIC_STREAMS: Final = ("downstream", "upstream")
CLIENT_OPS: Final = SCRIPT_OPS
"""What a scripted client (`[[load.clients]]`) may do: `read`, `stream`, `write`."""


class ScenarioError(Exception):
    """A scenario that cannot run. `problems` lists every one, each naming the file and the key."""

    def __init__(self, path: Path | str, problems: list[Issue]) -> None:
        self.path = str(path)
        self.problems = problems
        lines = [f"{self.path}: {p}" for p in problems]
        super().__init__(f"{len(problems)} problem(s) in {self.path}:\n" + "\n".join(lines))


# ---------------------------------------------------------------------- the parts


@dataclass(frozen=True, slots=True)
class TargetSpec:
    kind: str = "reference"
    """reference (started by `lab run`) or url (any MCP server)."""
    url: str | None = None
    protocol_version: str = "2025-11-25"
    """The handshake era's revision the clients ask for (in `initialize`)."""
    era: str = "handshake"
    """Which protocol era the run tests (docs/eras.md): `handshake` (sessions, resumption;
    `protocol_version`), `modern` (2026-07-28: no session, a broken stream re-issued) or
    `both` (each client speaks one, chosen by its ID: half and half, one server)."""
    session_ttl: float = 300.0
    delete: str = "allow"
    tokens: dict[str, str] = field(default_factory=dict)
    """Bearer token -> subject; empty = no authentication."""
    allowed_origins: tuple[str, ...] = ("http://127.0.0.1:*", "http://localhost:*")
    max_streams: int = 10_000
    max_rps: float = 0.0
    retry_after: int = 1
    keepalive: float = 10.0
    """Seconds of silence on an SSE stream before the reference server sends a comment
    (0: never): a server that keeps its streams alive outlives a proxy's idle timeout."""
    store: str = "volatile"
    """Where the reference server keeps sessions and their streams' events: `volatile`
    (memory: a restart loses them) or `durable` (a SQLite file in the run folder: they
    survive a restart), each replica its own; or, with replicas, `shared` (every replica
    serves from one store). Business writes survive a restart either way (its ledger)."""
    replicas: int = 1
    """Reference servers behind the lab's proxy, which balances requests over them."""
    affinity: str = "none"
    """How the proxy picks a replica for a request: `none` (round robin, request by
    request) or `session` (a session's requests go to the replica that created it)."""
    restart_command: tuple[str, ...] = ()
    """kind = 'url': the command `lab run` runs at each `[[restarts]]` time to restart the
    target (`docker restart my-server`, `systemctl restart ...`); empty: a restart of a URL
    target is not applicable, and the report says so."""
    restart_timeout: float = 60.0
    """Seconds the restart command may take before it is killed (a failed restart)."""


@dataclass(frozen=True, slots=True)
class Ticker:
    count: int = 10
    interval: float = 0.05
    close_after: int = 0
    """0 = the server never closes the stream itself."""
    retry: float = 0.5


@dataclass(frozen=True, slots=True)
class Load:
    users: int
    spawn_rate: float
    duration: float | None
    event_target: int | None
    hard_timeout: float
    workers: int = 1
    wait_min: float = 0.5
    wait_max: float = 2.0
    """Each client waits a uniform random time in [wait_min, wait_max] between operations."""
    open_standalone: bool = True
    mix: dict[str, int] = field(default_factory=lambda: {"read": 1, "stream": 1, "write": 1, "churn": 0})
    ticker: Ticker = field(default_factory=Ticker)
    stall_timeout: float = 20.0
    """`lab run` ends the run as incomplete ("traffic stalled") after this many seconds
    without an event sent or a call completed while clients are active."""
    until_knee: bool = False
    """A stepped ramp (`ramp` phases) stops itself at the end of the first step past its
    knee (`lab.run.phases`), instead of running every step."""
    client: str = "lab"
    """Who the users are: `lab` (the lab's client core), `python-sdk`, `typescript-sdk` or
    `cmd:<command>` (a client under test behind an adapter, docs/clients.md)."""
    clients: tuple[ClientScript, ...] = ()
    """`[[load.clients]]`: scripted clients, in file order, instead of the task mix (then
    `users` is their number, one worker, no phases; `mix` and `wait_*` do not apply)."""


@dataclass(frozen=True, slots=True)
class Reconnect:
    budget_qps: float = 50.0
    burst: float = 10.0
    backoff_base: float = 0.25
    backoff_cap: float = 30.0
    backoff_multiplier: float = 2.0
    max_attempts: int = 12
    read_timeout: float = READ_TIMEOUT_S
    """Seconds without a byte before the lab's client takes a connection for lost (its
    driver's read timeout)."""


@dataclass(frozen=True, slots=True)
class Budgets:
    reconnect_qps: float
    resume_p99_s: float = budgets.RESUME_P99_S
    cross_stream_max: int = budgets.CROSS_STREAM_MAX
    duplicate_dispatch_max: int = budgets.DUPLICATE_DISPATCH_MAX
    missing_rehandshake_max: int = budgets.MISSING_REHANDSHAKE_MAX
    origin_reject_rate: float = budgets.ORIGIN_REJECT_RATE
    min_events: int = 0
    min_recoveries: int = 0
    min_404: int = 0
    min_illegal_origin: int = 0
    # Tolerances of gate 7 (steady state restored) and of a capacity ramp's steps:
    recovery_events_ratio: float = 0.9
    """A recovery phase's events/s must be at least this share of the steady baseline's."""
    recovery_resume_p99_factor: float = 1.5
    recovery_resume_p99_slack_s: float = 0.25
    """A recovery phase's resume p99 must be <= factor x the baseline's + slack."""
    recovery_error_rate_slack: float = 0.01
    """A recovery phase's call error rate must be <= the baseline's + this (1 point)."""
    min_baseline_events: int = 100
    """Fewer events in the baseline's last half: gate 7 is inconclusive."""
    call_error_rate_max: float = 0.01
    """A capacity step whose call error rate is above this is past the knee."""
    min_rollout_sessions: int = 10
    """Fewer sessions created in a rollout step: its resumable-share check is inconclusive."""
    # Capacity rules (a scenario with `check = "capacity"`: rule 16):
    unanswered_max_share: float = 0.01
    """Of the requests sent in a phase, at most this share the target left unanswered."""
    answer_p99_s: float = 2.0
    """p99 of the target's time to answer a request (request at the proxy -> its answer's
    head at the proxy), per phase."""


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    kind: str
    start: float
    duration: float
    users: int
    spawn_rate: float
    server: dict[str, Any] = field(default_factory=dict)
    """Knobs of the reference server this phase sets through its admin control, kept until
    a later phase changes them: `resumable_fraction`, `rollback`, `max_rps`."""

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True, slots=True)
class Toxic:
    name: str
    kind: str
    stream: str
    toxicity: float
    attributes: dict[str, int]
    at: float
    until: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
            "at": self.at,
            "until": self.until,
        }


RESTART_HOWS: Final = ("stop", "crash")
"""How `lab run` stops the reference server at a restart: `stop` is a deploy (SIGTERM: it
closes its streams and flushes its files), `crash` a kill (SIGKILL: nothing flushed)."""


@dataclass(frozen=True, slots=True)
class Restart:
    """`[[restarts]]`: the target restarted once, mid-run."""

    at: float
    """Seconds after the run start."""
    how: str = "stop"
    down: float = 1.0
    """Seconds the reference server stays down before it is started again."""

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "how": self.how, "down": self.down}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    path: Path
    description: str
    seed: int
    target: TargetSpec
    load: Load
    reconnect: Reconnect
    budget: Budgets
    faults: tuple[Rule, ...]
    toxics: tuple[Toxic, ...]
    phases: tuple[Phase, ...]
    restarts: tuple[Restart, ...] = ()
    expected_failures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """`[expected_failures]`: per client (`python-sdk`, ...), gate/check IDs known to fail."""
    overrides: Mapping[str, object] = field(default_factory=dict)
    """What the command line changed (`lab run --users 50`): dotted key -> the value given,
    applied before the file was checked (run.json `overrides`)."""
    check: str = "gates"
    """What the run is judged on: `gates` (the rules, with the faults that feed them) or
    `capacity` (no faults by design: the capacity rule, the fault gates not applicable)."""

    @property
    def duration(self) -> float | None:
        """Planned length in seconds (None: it runs until the event target or the hard timeout)."""
        return self.load.duration

    @property
    def horizon(self) -> float:
        """The longest the run can last: the planned duration, else the hard timeout."""
        return self.load.duration if self.load.duration is not None else self.load.hard_timeout

    def fault_plan(self, run_start: float) -> Plan:
        return Plan(self.seed, self.faults, run_start)

    def fault_plan_json(self, run_start: float) -> str:
        """The plan for the mitmproxy addon (`--set mcpfaults_plan=FILE` with this in FILE)."""
        return self.fault_plan(run_start).to_json()

    def fault_windows(self, run_start: float) -> list[dict[str, Any]]:
        """run.json `fault_windows`: when each fault and toxic may be active, in epoch seconds."""
        out: list[dict[str, Any]] = []
        for r in self.faults:
            w = r.window or Window()
            end = self.horizon if w.end is None else min(w.end, self.horizon)
            out.append(
                {"fault": str(r.kind), "rule": r.id, "start": run_start + w.start, "end": run_start + end}
            )
        for t in self.toxics:
            # `toxic:<kind>` is how the checker counts toxics from the nemesis log.
            end = self.horizon if t.until is None else min(t.until, self.horizon)
            out.append(
                {
                    "fault": f"toxic:{t.kind}",
                    "rule": t.name,
                    "start": run_start + t.at,
                    "end": run_start + end,
                }
            )
        return out

    def toxics_schedule(self) -> list[dict[str, Any]]:
        """Toxics for the nemesis, sorted by `at`: name, kind, stream, toxicity, attributes,
        at and until (seconds since the run start; until None = to the end)."""
        return [t.to_dict() for t in sorted(self.toxics, key=lambda t: (t.at, t.name))]

    def budgets(self) -> dict[str, float | int]:
        """run.json `budgets` (docs/ledgers.md)."""
        return asdict(self.budget)

    def stages(self) -> list[dict[str, float | int]]:
        """The load shape: `[{"until": s, "users": n, "spawn_rate": r}]`, users to reach by `until`."""
        if self.phases:
            return [{"until": p.end, "users": p.users, "spawn_rate": p.spawn_rate} for p in self.phases]
        return [{"until": self.horizon, "users": self.load.users, "spawn_rate": self.load.spawn_rate}]

    def ticker_arguments(self) -> dict[str, int | None]:
        """Arguments of the `ticker` tool for the stream task (the reference server's names)."""
        t = self.load.ticker
        return {
            "count": t.count,
            "interval_ms": round(t.interval * 1000),
            "close_after": t.close_after or None,
            "retry_ms": round(t.retry * 1000) if t.close_after else None,
        }

    def load_settings(self, url: str, run_dir: str) -> LoadSettings:
        """What the Locust processes need (`lab.load.settings.LoadSettings`), for clients
        connecting to `url` and writing under `run_dir`."""
        from lab.load.settings import LoadSettings, ToolMix

        lo, rc = self.load, self.reconnect
        return LoadSettings(
            url=url,
            run_dir=run_dir,
            protocol_version=self.target.protocol_version,
            era=self.target.era,
            tokens=tuple(sorted(self.target.tokens.items())),
            mix=ToolMix(**lo.mix),
            ticker=dict(self.ticker_arguments()),
            wait_min=lo.wait_min,
            wait_max=lo.wait_max,
            reconnect_qps=rc.budget_qps,
            reconnect_burst=rc.burst,
            backoff_base=rc.backoff_base,
            backoff_cap=rc.backoff_cap,
            max_attempts=rc.max_attempts,
            read_timeout=rc.read_timeout,
            open_standalone_stream=lo.open_standalone,
            seed=self.seed,
            workers=lo.workers,
            client=lo.client,
            stages=tuple((float(s["until"]), int(s["users"]), float(s["spawn_rate"])) for s in self.stages()),
            clients=lo.clients,
        )

    def to_dict(self) -> dict[str, Any]:
        """The whole scenario as loaded, defaults filled in (run.json `scenario`)."""
        load = asdict(self.load)
        return {
            "name": self.name,
            "description": self.description,
            "seed": self.seed,
            "check": self.check,
            "target": {
                **asdict(self.target),
                "allowed_origins": list(self.target.allowed_origins),
                "restart_command": list(self.target.restart_command),
            },
            "load": load,
            "reconnect": asdict(self.reconnect),
            "budgets": self.budgets(),
            "faults": [r.to_dict() for r in self.faults],
            "toxics": [t.to_dict() for t in self.toxics],
            "phases": [asdict(p) for p in self.phases],
            "restarts": [r.to_dict() for r in self.restarts],
            "expected_failures": {k: list(v) for k, v in self.expected_failures.items()},
        }
