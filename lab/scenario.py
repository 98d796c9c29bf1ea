"""Scenarios: one TOML file per named run in `scenarios/`, validated whole before anything starts.

    from lab.scenario import load_scenario, ScenarioError
    try:
        sc = load_scenario("smoke")            # or a path to a .toml file
    except ScenarioError as e:
        print(e)                               # every problem, one per line: file: key: what
    sc.fault_plan_json(run_start)              # for mitmdump (lab/faults/plan.py format)
    sc.toxics_schedule()                       # for the TCP nemesis: plain dicts
    sc.budgets()                               # run.json "budgets"
    sc.stages()                                # the load shape: users over time
    sc.to_dict()                               # the scenario as loaded, defaults filled in

Every key, its unit and default is documented in docs/scenarios.md. The loader reports
*all* problems of a file at once (`ScenarioError.problems`), each naming the file, the
dotted key (with list indexes, e.g. `faults[2].rate`) and what was expected. Nothing here
starts a process or touches the network.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lab.faults.checks import Fields, Issue, describe
from lab.faults.decisions import Window
from lab.faults.kinds import Need
from lab.faults.plan import Plan, Rule, contradictions, read_rule
from lab.nemesis.toxics import KIND_ATTRIBUTES, parse_attributes
from lab.resources import scenario_dir
from lab.wire.revisions import SUPPORTED_REVISIONS

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
}
"""Attributes a scenario must give (the nemesis takes a missing one as 0, which for these
is almost always a typo). The kinds and the rest of the rules are the nemesis's own
(`lab.nemesis.toxics`), so a scenario that loads is one the nemesis accepts."""
TOXIC_STREAMS: Final = ("downstream", "upstream")

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_URL = re.compile(r"https?://[^/\s]+(/\S*)?")
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


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
    session_ttl: float = 300.0
    delete: str = "allow"
    tokens: dict[str, str] = field(default_factory=dict)
    """Bearer token -> subject; empty = no authentication."""
    allowed_origins: tuple[str, ...] = ("http://127.0.0.1:*", "http://localhost:*")
    max_streams: int = 10_000
    max_rps: float = 0.0
    retry_after: int = 1


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


@dataclass(frozen=True, slots=True)
class Reconnect:
    budget_qps: float = 50.0
    burst: float = 10.0
    backoff_base: float = 0.25
    backoff_cap: float = 30.0
    backoff_multiplier: float = 2.0
    max_attempts: int = 12


@dataclass(frozen=True, slots=True)
class Budgets:
    reconnect_qps: float
    resume_p99_s: float = 5.0
    cross_stream_max: int = 0
    duplicate_dispatch_max: int = 0
    missing_rehandshake_max: int = 0
    origin_reject_rate: float = 1.0
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
    expected_failures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """`[expected_failures]`: per client (`python-sdk`, ...), gate/check IDs known to fail."""

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
            open_standalone_stream=lo.open_standalone,
            seed=self.seed,
            workers=lo.workers,
            client=lo.client,
            stages=tuple((float(s["until"]), int(s["users"]), float(s["spawn_rate"])) for s in self.stages()),
        )

    def serve_args(self) -> list[str]:
        """Arguments for `lab serve` that this scenario's reference target asks for."""
        t = self.target
        args = ["--session-ttl", f"{t.session_ttl:g}", "--delete", t.delete]
        args += ["--allowed-origins", ",".join(t.allowed_origins)]
        args += ["--max-streams", str(t.max_streams), "--retry-after", str(t.retry_after)]
        if t.max_rps:
            args += ["--max-rps", f"{t.max_rps:g}"]
        if t.tokens:
            args += ["--tokens", ",".join(f"{k}={v}" for k, v in sorted(t.tokens.items()))]
        return args

    def to_dict(self) -> dict[str, Any]:
        """The whole scenario as loaded, defaults filled in (run.json `scenario`)."""
        load = asdict(self.load)
        return {
            "name": self.name,
            "description": self.description,
            "seed": self.seed,
            "target": {**asdict(self.target), "allowed_origins": list(self.target.allowed_origins)},
            "load": load,
            "reconnect": asdict(self.reconnect),
            "budgets": self.budgets(),
            "faults": [r.to_dict() for r in self.faults],
            "toxics": [t.to_dict() for t in self.toxics],
            "phases": [asdict(p) for p in self.phases],
            "expected_failures": {k: list(v) for k, v in self.expected_failures.items()},
        }


# ---------------------------------------------------------------------- loading


def scenario_names(directory: Path = SCENARIO_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.toml"))


def resolve(path_or_name: str | Path, directory: Path = SCENARIO_DIR) -> Path:
    """A scenario name (`smoke`) -> scenarios/smoke.toml; a path stays a path."""
    p = Path(path_or_name)
    if p.suffix == ".toml" or p.parent != Path("."):
        return p
    return directory / f"{p}.toml"


def load_scenario(path_or_name: str | Path, directory: Path = SCENARIO_DIR) -> Scenario:
    """Load and validate a scenario; ScenarioError lists every problem found."""
    path = resolve(path_or_name, directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        names = ", ".join(scenario_names(directory)) or "none"
        raise ScenarioError(path, [Issue("", f"no such scenario file (known scenarios: {names})")]) from None
    except OSError as e:
        raise ScenarioError(path, [Issue("", f"cannot read: {e.strerror or e}")]) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(path, [Issue("", f"not valid TOML: {e}")]) from None
    issues: list[Issue] = []
    sc = _read(doc, path, issues)
    if issues or sc is None:
        raise ScenarioError(path, issues)
    return sc


def _read(doc: Mapping[str, Any], path: Path, issues: list[Issue]) -> Scenario | None:
    top = Fields(doc, "", issues)
    name = top.string("name", path.stem, pattern=_NAME, what="a name of lower-case letters, digits and '-'")
    if name != path.stem:
        top.problem("name", f"must match the file name {path.stem!r} (or be left out), got {name!r}")
    description = top.string("description", "")
    if not top.has("seed"):
        top.problem("seed", "required: an integer >= 0 (every random decision of the run derives from it)")
    seed = top.integer("seed", 0, lo=0)
    target = _target(top.table("target"))
    reconnect = _reconnect(top.table("reconnect"))
    load_f = top.table("load")
    phases = _phases(top.tables("phases"), load_f)
    load = _load(load_f, phases)
    horizon = load.duration if load.duration is not None else load.hard_timeout
    by_name = {p.name: p for p in phases}
    faults, fault_keys = _faults(top.tables("faults"), by_name, horizon, issues)
    toxics, toxic_keys = _toxics(top.tables("toxics"), by_name, horizon, issues)
    budgets = _budgets(top.table("budgets"), load, reconnect, faults, toxics)
    expected = read_expected_failures(top.table("expected_failures"))
    top.done()
    _cross_checks(target, faults, fault_keys, toxics, toxic_keys, phases, issues)
    if issues:
        return None
    return Scenario(
        name,
        path,
        description,
        seed,
        target,
        load,
        reconnect,
        budgets,
        tuple(faults),
        tuple(toxics),
        tuple(phases),
        expected,
    )


def _target(f: Fields) -> TargetSpec:
    d = TargetSpec()
    kind = f.choice("kind", d.kind, ("reference", "url"))
    url = f.string("url", "", pattern=_URL, what="an http(s):// URL of the MCP endpoint") or None
    if kind == "url" and url is None:
        f.problem("url", "required when kind = 'url': the MCP endpoint, like 'http://127.0.0.1:8000/mcp'")
    if kind == "reference" and f.has("url"):
        f.problem("url", "only for kind = 'url' (the reference server's address is chosen by `lab run`)")
    reference_only = (
        "session_ttl",
        "delete",
        "tokens",
        "allowed_origins",
        "max_streams",
        "max_rps",
        "retry_after",
    )
    if kind == "url":
        for key in reference_only:
            if f.has(key):
                f.problem(key, "only for kind = 'reference' (a URL target is configured on its own)")
    tokens: dict[str, str] = {}
    tf = f.table("tokens")
    for token, subject in tf.raw.items():
        if not _TOKEN.fullmatch(str(token)):
            tf.problem(str(token), "expected a bearer token of letters, digits and -._~+/")
        elif not isinstance(subject, str) or not subject:
            tf.problem(str(token), f"expected the subject (a non-empty string), got {describe(subject)}")
        else:
            tokens[str(token)] = subject
    origins = f.string_list("allowed_origins", what="an origin pattern like 'http://127.0.0.1:*'")
    t = TargetSpec(
        kind=kind,
        url=url,
        protocol_version=f.choice("protocol_version", d.protocol_version, SUPPORTED_REVISIONS),
        session_ttl=f.duration("session_ttl", d.session_ttl, positive=True),
        delete=f.choice("delete", d.delete, ("allow", "refuse")),
        tokens=tokens,
        allowed_origins=origins if origins is not None else d.allowed_origins,
        max_streams=f.integer("max_streams", d.max_streams, lo=1),
        max_rps=f.number("max_rps", d.max_rps, lo=0.0),
        retry_after=f.integer("retry_after", d.retry_after, lo=0),
    )
    f.done()
    return t


def _reconnect(f: Fields) -> Reconnect:
    d = Reconnect()
    r = Reconnect(
        budget_qps=f.number("budget_qps", d.budget_qps, lo=0.0, lo_open=True),
        burst=f.number("burst", d.burst, lo=1.0),
        backoff_base=f.duration("backoff_base", d.backoff_base, positive=True),
        backoff_cap=f.duration("backoff_cap", d.backoff_cap, positive=True),
        backoff_multiplier=f.number("backoff_multiplier", d.backoff_multiplier, lo=1.0),
        max_attempts=f.integer("max_attempts", d.max_attempts, lo=1),
    )
    if r.backoff_cap < r.backoff_base:
        f.problem("backoff_cap", f"must be >= backoff_base ({r.backoff_cap:g}s < {r.backoff_base:g}s)")
    f.done()
    return r


def _phases(tables: list[Fields], load_f: Fields) -> list[Phase]:
    phases: list[Phase] = []
    start = 0.0
    users_default = load_f.raw.get("users")
    prev_users = (
        users_default if isinstance(users_default, int) and not isinstance(users_default, bool) else 1
    )
    seen: set[str] = set()
    for i, f in enumerate(tables):
        name = f.string(
            "name", f"phase-{i}", pattern=_NAME, what="a name of lower-case letters, digits and '-'"
        )
        if name in seen:
            f.problem("name", f"duplicate phase name {name!r}")
        seen.add(name)
        if not f.has("kind"):
            f.problem("kind", f"required: one of {', '.join(PHASE_KINDS)}")
        kind = f.choice("kind", "steady", PHASE_KINDS)
        if not f.has("duration"):
            f.problem("duration", "required: how long the phase lasts, like '2m'")
        duration = f.duration("duration", 1.0, positive=True)
        users = f.integer("users", 0 if kind == "quiet" else prev_users, lo=0)
        spawn_rate = f.number("spawn_rate", max(1.0, float(users)), lo=0.0, lo_open=True)
        server = _phase_knobs(f.table("server")) if f.has("server") else {}
        f.done()
        phases.append(Phase(name, kind, start, duration, users, spawn_rate, server))
        start += duration
        prev_users = users
    return phases


def _phase_knobs(f: Fields) -> dict[str, Any]:
    """`[phases.server]`: the reference server's knobs a phase sets (docs/scenarios.md)."""
    knobs: dict[str, Any] = {}
    if f.has("resumable_fraction"):
        knobs["resumable_fraction"] = f.rate("resumable_fraction", 1.0)
    if f.has("rollback"):
        value = f.get("rollback")
        if value is True:
            value = "keep-index"
        if value not in ROLLBACK_MODES:
            f.problem(
                "rollback",
                f"expected true or one of {', '.join(ROLLBACK_MODES)}, got {describe(value)} "
                "(a rollback cannot be undone by a later phase)",
            )
        else:
            knobs["rollback"] = value
    if f.has("max_rps"):
        knobs["max_rps"] = f.number("max_rps", 0.0, lo=0.0)
    f.done()
    if not f.raw:
        f.problem("", "an empty table: give resumable_fraction, rollback or max_rps")
    return knobs


def _load(f: Fields, phases: list[Phase]) -> Load:
    peak = max((p.users for p in phases), default=0)
    if not f.has("users") and not phases:
        f.problem("users", "required: how many concurrent clients (an integer >= 1)")
    users = f.integer("users", max(peak, 1), lo=1)
    if phases and peak > users:
        f.problem(
            "users",
            f"a phase asks for {peak} users, more than load.users ({users}); raise it or leave it out",
        )
    spawn_rate = f.number("spawn_rate", float(users), lo=0.0, lo_open=True)
    duration = f.optional_duration("duration", positive=True)
    if phases:
        total = sum(p.duration for p in phases)
        if duration is not None and not math.isclose(duration, total):
            f.problem(
                "duration", f"{duration:g}s disagrees with the phases ({total:g}s in all); leave one out"
            )
        duration = total
    event_target = f.optional_integer("event_target", lo=1)
    if duration is None and event_target is None:
        f.problem("duration", "give a duration, an event_target, or both (a run must stop by itself)")
    default_timeout = (duration * 2 + 60) if duration is not None else 600.0
    hard_timeout = f.duration("hard_timeout", default_timeout, positive=True)
    if duration is not None and hard_timeout < duration:
        f.problem("hard_timeout", f"must be >= the duration ({hard_timeout:g}s < {duration:g}s)")
    workers = f.integer("workers", 1, lo=1, hi=64)
    if workers > users:
        f.problem("workers", f"more workers ({workers}) than users ({users})")
    mix_f = f.table("mix")
    mix = {k: mix_f.integer(k, 1, lo=0) for k in ("read", "stream", "write")}
    mix["churn"] = mix_f.integer("churn", 0, lo=0)  # leave (DELETE) and come back as a new client
    mix_f.done()
    if sum(mix.values()) == 0:
        mix_f.problem("read", "the task mix needs at least one weight > 0")
    wait_min = f.duration("wait_min", 0.5)
    wait_max = f.duration("wait_max", max(2.0, wait_min))
    if wait_max < wait_min:
        f.problem("wait_max", f"must be >= wait_min ({wait_max:g}s < {wait_min:g}s)")
    tf = f.table("ticker")
    td = Ticker()
    ticker = Ticker(
        count=tf.integer("count", td.count, lo=1, hi=100_000),
        interval=tf.duration("interval", td.interval),
        close_after=tf.integer("close_after", td.close_after, lo=0),
        retry=tf.duration("retry", td.retry),
    )
    tf.done()
    load = Load(
        users=users,
        spawn_rate=spawn_rate,
        duration=duration,
        event_target=event_target,
        hard_timeout=hard_timeout,
        workers=workers,
        wait_min=wait_min,
        wait_max=wait_max,
        open_standalone=f.boolean("open_standalone", True),
        mix=mix,
        ticker=ticker,
        stall_timeout=f.duration("stall_timeout", 20.0, positive=True),
        until_knee=f.boolean("until_knee", False),
        client=f.string("client", "lab", pattern=CLIENT_SPEC, what=CLIENT_WHAT),
    )
    if load.until_knee and not any(p.kind == "ramp" for p in phases):
        f.problem("until_knee", "needs a stepped ramp: [[phases]] of kind 'ramp'")
    f.done()
    return load


CLIENT_SPEC: Final = re.compile(r"lab|python-sdk|typescript-sdk|cmd:\S.*")
CLIENT_WHAT: Final = "'lab', 'python-sdk', 'typescript-sdk' or 'cmd:<command>'"
_CHECK_ID: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
BASELINE_CLIENTS: Final = ("lab", "python-sdk", "typescript-sdk", "cmd")
"""Keys of `[expected_failures]`: the client kinds (`cmd` for any `cmd:<command>` adapter)."""


def read_expected_failures(f: Fields) -> dict[str, tuple[str, ...]]:
    """`[expected_failures]`: client kind -> gate/check IDs (docs/clients.md, "Known failures").
    Whether each ID names a gate or check is the checker's to say (`lab run` asks it first)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in f.raw:
        if name not in BASELINE_CLIENTS:
            f.problem(name, f"expected a client kind, one of {', '.join(map(repr, BASELINE_CLIENTS))}")
            continue
        ids = f.string_list(name, pattern=_CHECK_ID, what="a gate or check ID like 'missing_rehandshake'")
        out[name] = ids or ()
    f.done()
    return out


def load_baseline(path: Path) -> dict[str, tuple[str, ...]]:
    """A baseline file (`lab run --baseline FILE`): TOML with an `[expected_failures]`
    table, as in a scenario. ScenarioError names the file, key and what was expected."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(path, [Issue("", f"cannot read: {e.strerror or e}")]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(path, [Issue("", f"not valid TOML: {e}")]) from None
    issues: list[Issue] = []
    top = Fields(doc, "", issues)
    if not top.has("expected_failures"):
        top.problem("expected_failures", "required: a table of client kind -> list of gate/check IDs")
    expected = read_expected_failures(top.table("expected_failures"))
    top.done()
    if issues:
        raise ScenarioError(path, issues)
    return expected


def _faults(
    tables: list[Fields], phases: Mapping[str, Phase], horizon: float, issues: list[Issue]
) -> tuple[list[Rule], list[str]]:
    rules: list[Rule] = []
    keys: list[str] = []
    for i, f in enumerate(tables):
        window = _phase_window(f, phases, "window")
        rule = read_rule(f, i, window=window, extra_keys=("phase",))
        if rule is None:
            continue
        w = rule.window
        if w is not None and w.start >= horizon:
            f.problem("window", f"never active: it starts at {w.start:g}s and the run lasts {horizon:g}s")
        rules.append(rule)
        keys.append(f.prefix)
    issues.extend(contradictions(rules, keys))
    return rules, keys


def _phase_window(f: Fields, phases: Mapping[str, Phase], other: str) -> Window | None:
    """The window of a `phase = "name"` binding (None if there is none)."""
    if not f.has("phase"):
        return None
    name = f.get("phase")
    if f.has(other) or (other == "at" and f.has("until")):
        f.problem("phase", f"give either phase or {other}, not both")
    if not isinstance(name, str) or name not in phases:
        known = ", ".join(phases) or "none: this scenario has no [[phases]]"
        f.problem("phase", f"unknown phase {describe(name)} (phases: {known})")
        return None
    p = phases[name]
    return Window(p.start, p.end)


def _toxics(
    tables: list[Fields], phases: Mapping[str, Phase], horizon: float, issues: list[Issue]
) -> tuple[list[Toxic], list[str]]:
    toxics: list[Toxic] = []
    keys: list[str] = []
    names: dict[str, str] = {}
    for i, f in enumerate(tables):
        if not f.has("kind"):
            f.problem("kind", f"required: one of {', '.join(KIND_ATTRIBUTES)}")
        kind = f.choice("kind", "", KIND_ATTRIBUTES)
        name = f.string(
            "name", f"{kind or 'toxic'}-{i}", pattern=re.compile(r"[A-Za-z0-9_.-]{1,64}"), what="a toxic name"
        )
        if name in names:
            f.problem("name", f"duplicate toxic name {name!r} (also {names[name]})")
        names.setdefault(name, f.prefix)
        stream = f.choice("stream", "downstream", TOXIC_STREAMS)
        toxicity = f.number("toxicity", 1.0, lo=0.0, hi=1.0, what="a number in 0..1 (probability)")
        if toxicity == 0:
            f.problem("toxicity", "0 is not allowed: a toxic with toxicity 0 still fires; remove it instead")
        window = _phase_window(f, phases, "at")
        if window is not None:
            at, until = window.start, window.end
        else:
            at = f.duration("at", 0.0)
            until = f.optional_duration("until")
            if until is not None and until <= at:
                f.problem("until", f"must be after at ({until:g}s <= {at:g}s)")
                until = None
        if at >= horizon:
            f.problem("at", f"never active: it starts at {at:g}s and the run lasts {horizon:g}s")
        attributes = _toxic_attributes(f.table("attributes"), kind)
        f.done()
        if kind:
            toxics.append(Toxic(name, kind, stream, toxicity, attributes, at, until))
            keys.append(f.prefix)
    for j, t in enumerate(toxics):
        for k in range(j):
            o = toxics[k]
            if (
                o.kind == t.kind
                and o.stream == t.stream
                and Window(o.at, o.until).overlaps(Window(t.at, t.until))
            ):
                issues.append(
                    Issue(
                        f"{keys[j]}.at",
                        f"overlaps {keys[k]} ({o.name!r}): two {t.kind} toxics on the {t.stream} at once "
                        "contradict each other; make their times disjoint",
                    )
                )
    return toxics, keys


def _toxic_attributes(f: Fields, kind: str) -> dict[str, int]:
    names = KIND_ATTRIBUTES.get(kind)
    if names is None:
        return {}
    out: dict[str, int] = {}
    for attr in names:
        if attr in REQUIRED_ATTRIBUTES.get(kind, ()) and not f.has(attr):
            f.problem(attr, f"required for a {kind} toxic: an integer >= 0")
        out[attr] = f.integer(attr, 0, lo=0)
    f.done()
    try:
        return dict(parse_attributes(kind, out))
    except ValueError as e:  # the nemesis's rules across attributes (e.g. slicer sizes)
        f.problem("", str(e))
        return out


def _budgets(f: Fields, load: Load, reconnect: Reconnect, faults: list[Rule], toxics: list[Toxic]) -> Budgets:
    kinds = [r.spec for r in faults if r.rate > 0]
    breaks_streams = any(k.breaks_streams for k in kinds) or any(
        t.kind in ("reset_peer", "limit_data", "timeout") for t in toxics
    )
    b = Budgets(
        reconnect_qps=f.number("reconnect_qps", reconnect.budget_qps, lo=0.0, lo_open=True),
        resume_p99_s=f.duration("resume_p99_s", 5.0, positive=True),
        cross_stream_max=f.integer("cross_stream_max", 0, lo=0),
        duplicate_dispatch_max=f.integer("duplicate_dispatch_max", 0, lo=0),
        missing_rehandshake_max=f.integer("missing_rehandshake_max", 0, lo=0),
        origin_reject_rate=f.rate("origin_reject_rate", 1.0),
        min_events=f.integer("min_events", load.event_target or 0, lo=0),
        min_recoveries=f.integer("min_recoveries", 1 if breaks_streams else 0, lo=0),
        # Gate 3 needs 404s, gate 4 illegal Origins: a kind that makes them asks for the evidence.
        min_404=f.integer("min_404", 1 if any(3 in k.feeds for k in kinds) else 0, lo=0),
        min_illegal_origin=f.integer(
            "min_illegal_origin", 1 if any(4 in k.feeds for k in kinds) else 0, lo=0
        ),
        recovery_events_ratio=f.rate("recovery_events_ratio", 0.9),
        recovery_resume_p99_factor=f.number("recovery_resume_p99_factor", 1.5, lo=1.0),
        recovery_resume_p99_slack_s=f.duration("recovery_resume_p99_slack_s", 0.25),
        recovery_error_rate_slack=f.rate("recovery_error_rate_slack", 0.01),
        min_baseline_events=f.integer("min_baseline_events", 100, lo=0),
        call_error_rate_max=f.rate("call_error_rate_max", 0.01),
        min_rollout_sessions=f.integer("min_rollout_sessions", 10, lo=0),
    )
    f.done()
    return b


def _cross_checks(
    target: TargetSpec,
    faults: list[Rule],
    keys: list[str],
    toxics: list[Toxic],
    toxic_keys: list[str],
    phases: list[Phase],
    issues: list[Issue],
) -> None:
    """Checks across sections: what the target offers, and faults in fault-free phases."""
    if target.kind != "reference":
        for i, p in enumerate(phases):
            if p.server:
                issues.append(
                    Issue(
                        f"phases[{i}].server",
                        "phase knobs need the reference server's admin control (target.kind = 'reference')",
                    )
                )
    for rule, key in zip(faults, keys, strict=True):
        needs = rule.spec.needs
        if Need.ADMIN_CONTROL in needs and target.kind != "reference":
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} needs the reference server's admin control (target.kind = 'reference'); "
                    "kill_session ends sessions on any server",
                )
            )
        if Need.TWO_TOKENS in needs and target.kind == "reference" and len(target.tokens) < 2:
            issues.append(
                Issue(
                    f"{key}.kind",
                    f"{rule.kind} needs target.tokens with at least two subjects (else every token is the same)",
                )
            )
    quiet = [p for p in phases if p.kind in FAULT_FREE_PHASES]
    for rule, key in zip(faults, keys, strict=True):
        w = rule.window or Window()
        for p in quiet:
            if w.overlaps(Window(p.start, p.end)):
                issues.append(
                    Issue(
                        f"{key}.window",
                        f"active during the {p.kind} phase {p.name!r} ({p.start:g}s..{p.end:g}s), which allows "
                        "no faults; bind it to a faults phase (phase = ...) or move its window",
                    )
                )
    for t, tkey in zip(toxics, toxic_keys, strict=True):
        for p in quiet:
            if Window(t.at, t.until).overlaps(Window(p.start, p.end)):
                issues.append(
                    Issue(
                        f"{tkey}.at",
                        f"active during the {p.kind} phase {p.name!r} ({p.start:g}s..{p.end:g}s), which allows no faults",
                    )
                )
