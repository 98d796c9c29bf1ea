"""Reading a scenario file: every section checked, every problem collected (`Fields`),
and the `Scenario` built only when there is none."""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from lab.faults.checks import Fields, Issue, describe, did_you_mean
from lab.load.settings import ClientScript
from lab.scenario.parts import (
    CLIENT_OPS,
    PHASE_KINDS,
    ROLLBACK_MODES,
    SCENARIO_DIR,
    Load,
    Phase,
    Reconnect,
    Scenario,
    ScenarioError,
    TargetSpec,
    Ticker,
)
from lab.scenario.rules import cross_checks, read_budgets, read_faults, read_restarts, read_toxics
from lab.wire.revisions import ERAS, SUPPORTED_REVISIONS, is_modern

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_URL = re.compile(r"https?://[^/\s]+(/\S*)?")
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
CLIENT_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A scripted client's `id` (`[[load.clients]]`), used verbatim as its client ID."""
_CLIENT_ID_WHAT: Final = "a client ID of letters, digits and _.- (1..64 characters)"


# ---------------------------------------------------------------------- loading


def scenario_names(directory: Path = SCENARIO_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.toml"))


def resolve(path_or_name: str | Path, directory: Path = SCENARIO_DIR) -> Path:
    """A scenario name (`smoke`) -> scenarios/smoke.toml; a path stays a path."""
    p = Path(path_or_name)
    if p.suffix == ".toml" or p.parent != Path("."):
        return p
    return directory / f"{p}.toml"


MAX_REPLICAS: Final = 16
OVERRIDABLE: Final = {
    "users": "load.users",
    "spawn_rate": "load.spawn_rate",
    "duration": "load.duration",
    "events": "load.event_target",
    "seed": "seed",
    "replicas": "target.replicas",
    "era": "target.era",
}
"""`lab run` flags (`--users`, ...) -> the scenario key each one sets."""
_SET_BY_PHASES: Final = ("load.users", "load.spawn_rate", "load.duration")


def load_scenario(
    path_or_name: str | Path,
    directory: Path = SCENARIO_DIR,
    *,
    overrides: Mapping[str, object] | None = None,
) -> Scenario:
    """Load and validate a scenario; ScenarioError lists every problem found.

    `overrides` (dotted key -> value, the keys of OVERRIDABLE's values) replace the file's
    values before it is checked, so an override is checked like the file: a bad one is named
    by its key. A scenario with phases refuses users, spawn rate and duration (its phases
    set them); a new duration brings the default hard timeout (2x + 60 s) with it."""
    path = resolve(path_or_name, directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        known = scenario_names(directory)
        names = ", ".join(known) or "none"
        guess = did_you_mean(path.stem, known) if path.parent == directory else ""
        raise ScenarioError(
            path, [Issue("", f"no such scenario file{guess} (known scenarios: {names})")]
        ) from None
    except OSError as e:
        raise ScenarioError(path, [Issue("", f"cannot read: {e.strerror or e}")]) from None
    try:
        text = raw.decode("utf-8")
        doc = tomllib.loads(text)
        issues: list[Issue] = []
        if overrides:
            doc = _overridden(doc, overrides, issues)
        sc = _read(doc, path, issues)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(path, [Issue("", f"not valid TOML: {e}")]) from None
    except RecursionError:
        # The user's file, not a fault of the lab: said like any other problem in it.
        key, line, depth = _deepest(text)
        raise ScenarioError(
            path, [Issue(key, f"nested too deeply ({depth} levels at line {line}); a scenario needs a few")]
        ) from None
    if issues or sc is None:
        raise ScenarioError(path, issues)
    return replace(sc, overrides=dict(overrides)) if overrides else sc


def _overridden(doc: dict[str, Any], overrides: Mapping[str, object], issues: list[Issue]) -> dict[str, Any]:
    """The document with the command line's values in place (the file's own are left alone)."""
    out = dict(doc)
    for key, value in overrides.items():
        table, _, name = key.rpartition(".")
        if key in _SET_BY_PHASES and out.get("phases"):
            issues.append(
                Issue(key, "set by the scenario's [[phases]]: it cannot be overridden; edit the phases")
            )
            continue
        if not table:
            out[name] = value
            continue
        section = out.get(table)
        section = dict(section) if isinstance(section, Mapping) else {}
        section[name] = value
        if key == "load.duration":
            section.pop("hard_timeout", None)  # the file's bound was for its own duration
        out[table] = section
    return out


_TABLE = re.compile(r"^\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


def _deepest(text: str) -> tuple[str, int, int]:
    """Where a TOML text nests deepest: (dotted key, line number, depth), counting the
    brackets and braces outside strings (a rough count: it only has to point at the line)."""
    table, key, best = "", "", ("", 1, 0)
    depth, quote = 0, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if depth == 0:
            if (m := _TABLE.match(line)) is not None:
                table = m.group(1).strip()
                continue
            if (m := _KEY.match(line)) is not None:
                key = f"{table}.{m.group(1).strip()}" if table else m.group(1).strip()
        for ch in line:
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch in "[{":
                depth += 1
                if depth > best[2]:
                    best = (key, number, depth)
            elif ch in "]}":
                depth = max(0, depth - 1)
    return best


def _read(doc: Mapping[str, Any], path: Path, issues: list[Issue]) -> Scenario | None:
    top = Fields(doc, "", issues)
    name = top.string("name", path.stem, pattern=_NAME, what="a name of lower-case letters, digits and '-'")
    if name != path.stem:
        top.problem("name", f"must match the file name {path.stem!r} (or be left out), got {name!r}")
    description = top.string("description", "")
    if not top.has("seed"):
        top.problem("seed", "required: an integer >= 0 (every random decision of the run derives from it)")
    seed = top.integer("seed", 0, lo=0)
    check = top.choice("check", "gates", CHECKS)
    target = _target(top.table("target"))
    reconnect = _reconnect(top.table("reconnect"))
    load_f = top.table("load")
    phases = _phases(top.tables("phases"), load_f)
    load = _load(load_f, phases)
    horizon = load.duration if load.duration is not None else load.hard_timeout
    by_name = {p.name: p for p in phases}
    faults, fault_keys = read_faults(top.tables("faults"), by_name, horizon, issues)
    toxics, toxic_keys = read_toxics(top.tables("toxics"), by_name, horizon, issues)
    restarts = read_restarts(top.tables("restarts"), target, horizon, issues)
    budgets = read_budgets(top.table("budgets"), load, reconnect, faults, toxics)
    expected = read_expected_failures(top.table("expected_failures"))
    top.done()
    cross_checks(target, faults, fault_keys, toxics, toxic_keys, phases, issues)
    if check == "capacity":
        _capacity_check(faults, toxics, restarts, issues)
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
        tuple(restarts),
        expected,
        check=check,
    )


CHECKS = ("gates", "capacity")
"""`check`: what the run is judged on (docs/scenarios.md)."""


def _capacity_check(faults: list[Any], toxics: list[Any], restarts: list[Any], issues: list[Issue]) -> None:
    """A capacity check injects nothing: its verdict says whether the target held the
    load, and a fault would make that answer about the fault instead."""
    given = [(len(faults), "[[faults]]"), (len(toxics), "[[toxics]]"), (len(restarts), "[[restarts]]")]
    found = ", ".join(f"{n} {what}" for n, what in given if n)
    if found:
        issues.append(
            Issue(
                "check",
                f"'capacity' judges a run with no faults by design, and this scenario has {found}: "
                "remove them, or leave `check` out to judge the run on the gates",
            )
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
        "keepalive",
        "store",
        "replicas",
        "affinity",
    )
    if kind == "url":
        for key in reference_only:
            if f.has(key):
                f.problem(key, "only for kind = 'reference' (a URL target is configured on its own)")
    else:
        for key in ("restart_command", "restart_timeout"):
            if f.has(key):
                f.problem(key, "only for kind = 'url' (`lab run` restarts the reference server itself)")
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
    asked = f.get("protocol_version")
    if isinstance(asked, str) and is_modern(asked):
        f.problem(
            "protocol_version",
            f'{asked} is the modern era\'s revision: set era = "modern" (or "both"); protocol_version '
            f"names the handshake era's revision, one of {', '.join(map(repr, SUPPORTED_REVISIONS))}",
        )
        asked = None
    t = TargetSpec(
        kind=kind,
        url=url,
        protocol_version=(
            d.protocol_version
            if asked is None and f.has("protocol_version")
            else f.choice("protocol_version", d.protocol_version, SUPPORTED_REVISIONS)
        ),
        era=f.choice("era", d.era, ERAS),
        session_ttl=f.duration("session_ttl", d.session_ttl, positive=True),
        delete=f.choice("delete", d.delete, ("allow", "refuse")),
        tokens=tokens,
        allowed_origins=origins if origins is not None else d.allowed_origins,
        max_streams=f.integer("max_streams", d.max_streams, lo=1),
        max_rps=f.number("max_rps", d.max_rps, lo=0.0),
        retry_after=f.integer("retry_after", d.retry_after, lo=0),
        keepalive=f.duration("keepalive", d.keepalive),
        store=f.choice("store", d.store, ("volatile", "durable", "shared")),
        replicas=f.integer("replicas", d.replicas, lo=1, hi=MAX_REPLICAS),
        affinity=f.choice("affinity", d.affinity, ("none", "session")),
        restart_command=f.string_list("restart_command", what="a word of the command (no shell)") or (),
        restart_timeout=f.duration("restart_timeout", d.restart_timeout, positive=True),
    )
    if t.replicas > 1 and not f.has("affinity"):
        f.problem(
            "affinity", "required with replicas > 1: 'none' (round robin, request by request) or 'session'"
        )
    if t.replicas == 1:
        if t.store == "shared":
            f.problem("store", "'shared' needs replicas > 1 (one server has one store)")
        if f.has("affinity"):
            f.problem("affinity", "only with replicas > 1")
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
        read_timeout=f.duration("read_timeout", d.read_timeout, positive=True),
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
    client_tables = f.tables("clients")
    scripted = len(client_tables)
    if f.has("clients") and not client_tables and isinstance(f.get("clients"), list):
        f.problem("clients", "an empty list: give at least one [[load.clients]] table, or leave it out")
    if not f.has("users") and not phases and not scripted:
        f.problem("users", "required: how many concurrent clients (an integer >= 1)")
    users = f.integer("users", scripted or max(peak, 1), lo=1)
    if phases and peak > users:
        f.problem(
            "users",
            f"a phase asks for {peak} users, more than load.users ({users}); raise it or leave it out",
        )
    if scripted and users != scripted:
        f.problem(
            "users",
            f"{users} given, but [[load.clients]] lists {scripted} client(s): expected {scripted} "
            "(or leave users out: it is then the number of clients)",
        )
    spawn_rate = f.number("spawn_rate", float(users), lo=0.0, lo_open=True)
    if scripted and spawn_rate < scripted:
        f.problem(
            "spawn_rate",
            f"scripted clients all start at once (their `at` counts from the load's start): expected "
            f">= {scripted} (the number of [[load.clients]]) or leave it out, got {spawn_rate:g}",
        )
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
    if scripted and workers != 1:
        f.problem(
            "workers",
            f"scripted clients ([[load.clients]]) run in one worker: expected 1 (or leave it out), got {workers}",
        )
    elif workers > users:
        f.problem("workers", f"more workers ({workers}) than users ({users})")
    if scripted and phases:
        f.problem(
            "clients",
            "scripted clients cannot be combined with [[phases]] (the phases set the load shape, the "
            "scripts say when each client comes): remove one of them",
        )
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
        clients=_scripted_clients(client_tables, duration if duration is not None else hard_timeout),
    )
    if load.until_knee and not any(p.kind == "ramp" for p in phases):
        f.problem("until_knee", "needs a stepped ramp: [[phases]] of kind 'ramp'")
    f.done()
    return load


def _scripted_clients(tables: list[Fields], horizon: float) -> tuple[ClientScript, ...]:
    """`[[load.clients]]`, in file order; every problem named by its key (`load.clients[2].at`)."""
    scripts: list[ClientScript] = []
    seen: dict[str, str] = {}
    for f in tables:
        script = _client_script(f, horizon)
        if script.id in seen:
            f.problem(
                "id",
                f"duplicate client id {script.id!r} (also {seen[script.id]}): expected one script per client",
            )
        elif script.id:
            seen[script.id] = f.prefix
        scripts.append(script)
    return tuple(scripts)


def _client_script(f: Fields, horizon: float) -> ClientScript:
    """One `[[load.clients]]` table: `id`, `ops` and `at`, all three required."""
    if not f.has("id"):
        f.problem("id", f"required: the client ID to use, {_CLIENT_ID_WHAT}")
    client_id = f.string("id", "", pattern=CLIENT_ID, what=_CLIENT_ID_WHAT)
    ops = _client_ops(f)
    at = _client_times(f, horizon)
    f.done()
    if ops is not None and at is not None and len(ops) != len(at):
        f.problem(
            "at",
            f"{len(at)} time(s) for {len(ops)} op(s): expected one time per op (a list as long as ops)",
        )
    return ClientScript(client_id, tuple(ops or ()), tuple(at or ()))


def _client_ops(f: Fields) -> list[str] | None:
    """`ops`: a list (maybe empty) of `read`, `stream`, `write`; None when unusable."""
    choices = ", ".join(map(repr, CLIENT_OPS))
    if not f.has("ops"):
        f.problem("ops", f"required: a list of operations, each one of {choices} ([] for none)")
        return None
    value = f.get("ops")
    if not isinstance(value, list):
        f.problem("ops", f"expected a list of operations, each one of {choices}, got {describe(value)}")
        return None
    ops: list[str] = []
    for i, op in enumerate(value):
        if not isinstance(op, str) or op not in CLIENT_OPS:
            guess = did_you_mean(op, CLIENT_OPS) if isinstance(op, str) else ""
            f.problem(f"ops[{i}]", f"expected one of {choices}, got {describe(op)}{guess}")
        ops.append(op if isinstance(op, str) else "")
    return ops


def _client_times(f: Fields, horizon: float) -> list[float] | None:
    """`at`: a list (maybe empty) of seconds since the load's start, non-decreasing, each
    before the run's end; None when unusable."""
    what = "a list of start times, seconds since the load's start, one per op"
    if not f.has("at"):
        f.problem("at", f"required: {what} ([] for none)")
        return None
    value = f.get("at")
    if not isinstance(value, list):
        f.problem("at", f"expected {what}, got {describe(value)}")
        return None
    times: list[float] = []
    before = 0.0
    for i, t in enumerate(value):
        key = f"at[{i}]"
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            f.problem(key, f"expected a number of seconds >= 0, got {describe(t)}")
            times.append(before)
            continue
        seconds = float(t)
        if seconds < before:
            f.problem(
                key,
                f"expected a time >= the one before ({before:g}), got {seconds:g}: ops start in order, "
                "so the times never decrease",
            )
        elif seconds >= horizon:
            f.problem(
                key, f"never reached: expected a time before the run's end ({horizon:g}s), got {seconds:g}"
            )
        before = max(before, seconds)
        times.append(seconds)
    return times


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
