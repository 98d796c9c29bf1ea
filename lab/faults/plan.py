"""The fault plan: which faults fire, on what, when and how often — pure data and decisions.

A plan is JSON (schema `mcpLabFaultPlan.v1`). `lab run` writes it from the scenario
(`Scenario.fault_plan_json(run_start)`); the mitmproxy addon reads it:

    {"schema": "mcpLabFaultPlan.v1", "seed": 42, "run_start": 1767225600.0,
     "rules": [{"id": "storm#0", "kind": "storm", "rate": 0.5,
                "window": {"start": 10.0, "end": 40.0},
                "match": {"streams": ["resume", "get"]},
                "params": {"status": 503, "retry_after": 1.0, "shape": "burst",
                           "period": 10.0, "burst": 2.0}}]}

- `rate` is a probability in 0..1 per *decision unit*: per flow (one HTTP exchange) for
  request- and response-level faults, per SSE event for event-level faults (the kind's `unit`).
- `window` (optional) is `[start, end)` in seconds since `run_start`; `end` null = open.
- `match` (optional) narrows the flows a rule applies to; every given list must contain
  the flow's value: `http_methods` (POST/GET/DELETE), `methods` (JSON-RPC method of the
  POST body), `tools` (tool name of a `tools/call`), `sessions` (session pseudonyms
  `s_<20 hex>`), `streams` (post = any POST, get = GET without `Last-Event-ID`,
  resume = GET with it).
- `params` are per kind (each kind's `params_type` in `lab.faults.kinds`); every one has a
  default.
- `at` (optional) pins the rule to logical triggers (`lab.faults.pins`): a list of
  `{"client", "request", "ordinal"[, "attempt"][, "event"]}`; the rule then fires there
  and nowhere else, whatever its rate (which may be left out) and window.

What each kind is and does lives in its plug-in (`lab.faults.kinds`); how decisions are
derived from the seed in `lab.faults.decisions`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Final

from lab.faults.checks import Fields, Issue, describe, did_you_mean
from lab.faults.decisions import Decider, Decision, Window
from lab.faults.facts import Target
from lab.faults.kinds import NAMES, REGISTRY, FaultKind, Need, Unit, kind_of
from lab.faults.kinds.base import NoParams
from lab.faults.pins import Pin, Place

PLAN_SCHEMA: Final = "mcpLabFaultPlan.v1"
HTTP_METHODS: Final = ("POST", "GET", "DELETE")
STREAM_KINDS: Final = ("post", "get", "resume")
_SESSION_PSEUDONYM = re.compile(r"s_[0-9a-f]{20}")
_RULE_ID = re.compile(r"[A-Za-z0-9_.#:/-]{1,64}")


# ---------------------------------------------------------------------- rules


@dataclass(frozen=True, slots=True)
class Match:
    """Targeting: None = any; otherwise the flow's value must be in the set."""

    http_methods: frozenset[str] | None = None
    methods: frozenset[str] | None = None
    tools: frozenset[str] | None = None
    sessions: frozenset[str] | None = None
    streams: frozenset[str] | None = None

    def matches(self, t: Target) -> bool:
        return (
            (self.http_methods is None or t.http_method in self.http_methods)
            and (self.methods is None or t.method in self.methods)
            and (self.tools is None or t.tool in self.tools)
            and (self.sessions is None or t.session in self.sessions)
            and (self.streams is None or t.stream in self.streams)
        )

    def to_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in ("http_methods", "methods", "tools", "sessions", "streams"):
            v: frozenset[str] | None = getattr(self, name)
            if v is not None:
                out[name] = sorted(v)
        return out


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    kind: str
    """The name of a registered kind (`lab.faults.kinds.REGISTRY`)."""
    rate: float
    window: Window | None = None
    match: Match = field(default_factory=Match)
    params: Any = field(default_factory=NoParams)
    """An instance of the kind's `params_type`."""
    pins: tuple[Pin, ...] = ()
    """Where it fires, if pinned (`lab.faults.pins`): then only there, rate and window aside."""

    @property
    def spec(self) -> FaultKind[Any]:
        return kind_of(self.kind)

    @property
    def unit(self) -> Unit:
        return self.spec.unit

    def probability(self, t: float) -> float:
        """The chance of firing at `t` seconds since the run start (0 outside the window)."""
        w = self.window
        if w is not None and not w.contains(t):
            return 0.0
        return self.spec.shape(self.rate, self.params, w, t)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "rate": self.rate,
            "window": None if self.window is None else self.window.to_dict(),
            "match": self.match.to_dict(),
            "params": asdict(self.params),
            **({"at": [p.to_dict() for p in self.pins]} if self.pins else {}),
        }


def read_window(f: Fields) -> Window | None:
    """A `window` table: `start` (default 0) and `end` (optional), durations."""
    if not f.raw:
        f.done()
        return None
    start = f.duration("start", 0.0)
    end = f.optional_duration("end")
    f.done()
    if end is not None and end <= start:
        f.problem("end", f"the window must end after it starts ({end:g}s <= {start:g}s)")
        end = None
    return Window(start, end)


def read_match(f: Fields) -> Match:
    def fs(v: tuple[str, ...] | None) -> frozenset[str] | None:
        return None if v is None else frozenset(v)

    m = Match(
        http_methods=fs(f.string_list("http_methods", choices=HTTP_METHODS, what="an HTTP method")),
        methods=fs(f.string_list("methods", what="a JSON-RPC method")),
        tools=fs(f.string_list("tools", what="a tool name")),
        sessions=fs(
            f.string_list(
                "sessions", pattern=_SESSION_PSEUDONYM, what="a session pseudonym like 's_<20 hex>'"
            )
        ),
        streams=fs(f.string_list("streams", choices=STREAM_KINDS, what="a stream kind")),
    )
    f.done()
    return m


def read_rule(
    f: Fields, index: int, *, window: Window | None = None, extra_keys: Sequence[str] = ()
) -> Rule | None:
    """One rule from table `f` (issues recorded); None if its kind is unusable.

    `window` is used instead of a `window` key when the caller resolved it otherwise (a
    scenario's `phase`); `extra_keys` are keys the caller reads itself.
    """
    raw_kind = f.get("kind")
    kind: FaultKind[Any] | None = None
    if raw_kind is None:
        f.problem("kind", f"required: one of {', '.join(NAMES)}")
    elif not isinstance(raw_kind, str) or raw_kind not in REGISTRY:
        guess = did_you_mean(raw_kind, NAMES) if isinstance(raw_kind, str) else ""
        f.problem("kind", f"unknown fault {describe(raw_kind)}{guess}; expected one of {', '.join(NAMES)}")
    else:
        kind = REGISTRY[raw_kind]
    rule_id = f.string(
        "id", f"{raw_kind}#{index}", pattern=_RULE_ID, what="an ID of letters, digits and _.#:/- (1..64)"
    )
    pins = read_pins(f, kind)
    if not f.has("rate") and not pins:
        f.problem("rate", "required: a number in 0..1 (probability per flow or per event), or `at`")
    rate = f.rate("rate", 1.0 if pins else 0.0)
    if f.has("window"):
        window = read_window(f.table("window"))
    match = read_match(f.table("match"))
    params_table = f.table("params")
    f.done(*extra_keys)
    if kind is None:
        return None
    params = kind.read_params(params_table, window, rate)
    return Rule(rule_id, kind.name, rate, window, match, params, pins)


def read_pins(f: Fields, kind: FaultKind[Any] | None) -> tuple[Pin, ...]:
    """The rule's `at` list (lab.faults.pins); an event-level kind's pins need `event`, a
    flow-level kind's must not have one."""
    pins: list[Pin] = []
    tables = f.tables("at")  # (once: each read reports a wrong type again)
    if f.has("at") and not tables:
        f.problem("at", "expected a non-empty list of {client, request, ordinal[, attempt][, event]} tables")
    for pf in tables:
        client = pf.string("client", "", what="a client ID (x-lab-conn before its last ':')")
        request = pf.string(
            "request", "", what="a request kind like 'POST tools/call ticker' or 'GET resume'"
        )
        for name, value in (("client", client), ("request", request)):
            if not value and not pf.has(name):
                pf.problem(name, "required")
        if not pf.has("ordinal"):
            pf.problem("ordinal", "required: an integer >= 1")
        ordinal = pf.integer("ordinal", 1, lo=1)
        attempt = pf.integer("attempt", 1, lo=1)
        event = pf.optional_integer("event", lo=0)
        pf.done()
        if kind is not None and kind.unit is Unit.EVENT and event is None:
            pf.problem("event", f"required: {kind.name} fires on an event (its index in the stream, >= 0)")
        elif kind is not None and kind.unit is not Unit.EVENT and event is not None:
            pf.problem("event", f"{kind.name} fires on a request, not on an event: leave `event` out")
            event = None
        pins.append(Pin(client, request, ordinal, event, attempt))
    return tuple(pins)


def contradictions(rules: Sequence[Rule], keys: Sequence[str]) -> list[Issue]:
    """Rules that contradict each other, and duplicate IDs.

    Two rules of one kind with the same targeting and overlapping windows contradict: it
    is unclear which rate (and parameters) holds in the overlap. `keys[i]` names rule i.
    """
    out: list[Issue] = []
    seen: dict[str, int] = {}
    for j, r in enumerate(rules):
        if r.id in seen:
            out.append(Issue(f"{keys[j]}.id", f"duplicate rule ID {r.id!r} (also {keys[seen[r.id]]})"))
        seen.setdefault(r.id, j)
        for i in range(j):
            q = rules[i]
            if q.kind != r.kind or q.match != r.match or (q.pins and r.pins):
                continue  # (pins name exact triggers: two pinned rules fire at their union)
            if (q.window or Window()).overlaps(r.window or Window()):
                out.append(
                    Issue(
                        f"{keys[j]}.window",
                        f"overlaps {keys[i]} ({q.id!r}): two {r.kind} rules with the same match and "
                        "overlapping windows contradict each other; make the windows disjoint or the "
                        "matches different",
                    )
                )
    return out


# ---------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    rules: tuple[Rule, ...] = ()
    run_start: float | None = None
    """Epoch seconds the windows count from (None: the addon's option or start time)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": PLAN_SCHEMA,
            "seed": self.seed,
            "run_start": self.run_start,
            "rules": [r.to_dict() for r in self.rules],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @property
    def digest(self) -> str:
        """16 hex of SHA-256 of the canonical JSON: names a plan version in the tap."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


EMPTY_PLAN: Final = Plan(seed=0)


class PlanError(ValueError):
    """A plan that cannot be used; `issues` lists every problem found."""

    def __init__(self, issues: Sequence[Issue], source: str = "plan") -> None:
        self.issues = tuple(issues)
        self.source = source
        super().__init__(f"{source}: " + "; ".join(str(i) for i in self.issues))


def parse_plan(source: str | bytes | Mapping[str, object], *, name: str = "plan") -> Plan:
    """A `Plan` from JSON text or an already-decoded mapping; PlanError lists every problem."""
    issues: list[Issue] = []
    obj: object = source
    if isinstance(source, str | bytes):
        try:
            obj = json.loads(source)
        except ValueError as e:
            raise PlanError([Issue("", f"not JSON: {e}")], name) from None
    f = Fields(obj, "", issues)
    schema = f.get("schema")
    if schema is not None and schema != PLAN_SCHEMA:
        f.problem("schema", f"expected {PLAN_SCHEMA!r}, got {describe(schema)}")
    if not f.has("seed"):
        f.problem("seed", "required: an integer >= 0")
    seed = f.integer("seed", 0, lo=0)
    run_start = f.number("run_start", -1.0, lo=0.0)
    rules: list[Rule] = []
    keys: list[str] = []
    for i, rf in enumerate(f.tables("rules")):
        r = read_rule(rf, i)
        if r is not None:
            rules.append(r)
            keys.append(rf.prefix)
    f.done()
    issues.extend(contradictions(rules, keys))
    if issues:
        raise PlanError(issues, name)
    return Plan(seed, tuple(rules), None if run_start < 0 else run_start)


# ---------------------------------------------------------------------- the plan as the proxy runs it


@dataclass(frozen=True)
class ActivePlan:
    """A plan as the addon runs it: with its decider and the run start it counts from."""

    plan: Plan
    run_start: float
    version: int = 0

    @cached_property
    def decider(self) -> Decider:
        return Decider(self.plan.seed)

    @cached_property
    def flow_rules(self) -> tuple[Rule, ...]:
        """Flow-level rules in the order they are tried on a request: a kind that answers
        alone first (a storm), then by kind number."""
        flow = [r for r in self.plan.rules if r.unit is Unit.FLOW]
        return tuple(sorted(flow, key=lambda r: (not r.spec.answers_alone, r.spec.number)))

    @cached_property
    def event_rules(self) -> tuple[Rule, ...]:
        """Event-level rules in the order their hooks run on an event."""
        event = [r for r in self.plan.rules if r.unit is Unit.EVENT]
        return tuple(sorted(event, key=lambda r: r.spec.event_order))

    @cached_property
    def needs_memory(self) -> bool:
        return any(Need.MEMORY in r.spec.needs for r in self.plan.rules)

    @cached_property
    def pinned(self) -> bool:
        """Whether a rule is pinned: then the proxy counts each client's requests by kind."""
        return any(r.pins for r in self.plan.rules)

    @cached_property
    def pins_by_rule(self) -> dict[str, dict[Place, tuple[int, ...]]]:
        """A pinned rule's places, each with its event indexes (none for a flow-level rule)."""
        out: dict[str, dict[Place, tuple[int, ...]]] = {}
        for r in self.plan.rules:
            if r.pins:
                places: dict[Place, list[int]] = {}
                for p in r.pins:
                    places.setdefault(p.place, []).extend(() if p.event is None else (p.event,))
                out[r.id] = {k: tuple(v) for k, v in places.items()}
        return out

    def decide(self, rule: Rule, key: str, now: float, place: Place | None = None) -> Decision | None:
        if rule.pins:  # fires at its pins, and only there
            pinned = place is not None and place in self.pins_by_rule[rule.id]
            return self.decider.draw(rule.id, key) if pinned else None
        return self.decider.decide(rule.id, rule.probability(now - self.run_start), key)


class PlanHolder:
    """The one mutable reference to the active plan; swapped whole when the plan changes."""

    __slots__ = ("active",)

    def __init__(self, active: ActivePlan | None = None) -> None:
        self.active = active or ActivePlan(EMPTY_PLAN, 0.0)
