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
  request- and response-level faults, per SSE event for event-level faults (`UNIT`).
- `window` (optional) is `[start, end)` in seconds since `run_start`; `end` null = open.
- `match` (optional) narrows the flows a rule applies to; every given list must contain
  the flow's value: `http_methods` (POST/GET/DELETE), `methods` (JSON-RPC method of the
  POST body), `tools` (tool name of a `tools/call`), `sessions` (session pseudonyms
  `s_<20 hex>`), `streams` (post = any POST, get = GET without `Last-Event-ID`,
  resume = GET with it).
- `params` are per kind (`PARAMS`); every one has a default.

Decisions are derived, not drawn from a shared generator: for rule R and a stable key K
of what is decided (the flow's `x-lab-conn`, plus `#<event index>` for an event),
BLAKE2b keyed with the seed over `R.id + NUL + K` gives the decision ID (`d_` + 16 hex)
written to the tap, and, for a flow-level rule, a uniform number: it fires if that is
below the rate at that moment (so lowering a rate during a run only removes firings).
Event-level rules, which are asked on every SSE event, draw their firing indexes per flow
from a generator seeded the same way (`EventSampler`: same distribution, far cheaper).
The same seed and the same traffic therefore make the same decisions, whatever order
flows arrive in.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Final

from lab.faults.checks import Fields, Issue, describe

PLAN_SCHEMA: Final = "mcpLabFaultPlan.v1"


class FaultKind(enum.StrEnum):
    """The thirteen faults of the addon (numbered as in the fault-injection issue)."""

    DROP_PRIMING = "drop_priming"
    """1. Drop the initial empty (priming) SSE event of a stream."""
    CROSS_IDS = "cross_ids"
    """2. Give an event the ID of an event of another stream of the same session."""
    REPLAY_AFTER_ACK = "replay_after_ack"
    """3. Re-send events of the same stream that were already forwarded to the client."""
    INJECT_FOREIGN = "inject_foreign"
    """4. Insert an event of another stream or another session into a stream."""
    REWRITE_ORIGIN = "rewrite_origin"
    """5. Rewrite (or add) the request's `Origin` to an illegal value; the server must say 403."""
    STORM = "storm"
    """6. Answer 429/503 with `Retry-After` from the proxy, never touching the server."""
    EXECUTED_THEN_LOST = "executed_then_lost"
    """7. Let a tool call run on the server, then drop its JSON-RPC response and cut the client."""
    LOSE_DELETE_RESPONSE = "lose_delete_response"
    """8. Let a DELETE reach the server, then close the client connection without its response."""
    STRIP_PROTOCOL_VERSION = "strip_protocol_version"
    """9. Remove the `MCP-Protocol-Version` request header."""
    REWRITE_LAST_EVENT_ID = "rewrite_last_event_id"
    """10. Rewrite the `Last-Event-ID` of a resumption (another stream, another session, garbage)."""
    OLD_TOKEN = "old_token"
    """11. Replace `Authorization` with the token an earlier, other session was opened with."""
    EXPIRY_RACE = "expiry_race"
    """12. Expire the session (server admin control) exactly as the request's response passes."""
    CUT_STREAM = "cut_stream"
    """13. Cut the client connection of an SSE stream in the middle."""


class Unit(enum.StrEnum):
    """What one decision is about (what `rate` is a probability of)."""

    FLOW = "flow"
    EVENT = "event"


UNIT: Final[Mapping[FaultKind, Unit]] = {
    k: (
        Unit.EVENT
        if k
        in (FaultKind.CROSS_IDS, FaultKind.REPLAY_AFTER_ACK, FaultKind.INJECT_FOREIGN, FaultKind.CUT_STREAM)
        else Unit.FLOW
    )
    for k in FaultKind
}

REQUEST_KINDS: Final = frozenset(
    {
        FaultKind.REWRITE_ORIGIN,
        FaultKind.STORM,
        FaultKind.STRIP_PROTOCOL_VERSION,
        FaultKind.REWRITE_LAST_EVENT_ID,
        FaultKind.OLD_TOKEN,
    }
)
"""Faults applied to the request before it goes upstream (or instead of it: storm)."""

HTTP_METHODS: Final = ("POST", "GET", "DELETE")
STREAM_KINDS: Final = ("post", "get", "resume")
_SESSION_PSEUDONYM = re.compile(r"s_[0-9a-f]{20}")
_RULE_ID = re.compile(r"[A-Za-z0-9_.#:/-]{1,64}")
_ORIGIN = re.compile(r"null|https?://[^/\s?#]+")


# ---------------------------------------------------------------------- parameters


@dataclass(frozen=True, slots=True)
class NoParams:
    """The fault takes no parameters."""


@dataclass(frozen=True, slots=True)
class ReplayParams:
    depth: int = 1
    """How many already-forwarded events of the stream to re-send (1..16)."""


@dataclass(frozen=True, slots=True)
class ForeignParams:
    source: str = "any"
    """Where the injected event comes from: other_stream (same session), other_session, any."""


ILLEGAL_ORIGIN: Final = "http://evil.invalid"


@dataclass(frozen=True, slots=True)
class OriginParams:
    origin: str = ILLEGAL_ORIGIN
    """The illegal Origin to send (scheme://host[:port], or `null`)."""


@dataclass(frozen=True, slots=True)
class StormParams:
    status: int = 503
    """429 or 503."""
    retry_after: float = 1.0
    """Seconds advised in `Retry-After` (sent rounded up to whole seconds)."""
    send_retry_after: bool = True
    """false: answer without a `Retry-After` header."""
    shape: str = "sustained"
    """sustained: `rate` all through the window; burst: `rate` during the first `burst`
    seconds of every `period`, 0 otherwise; ramp: from `from_rate` up to `rate` over `ramp`."""
    period: float = 10.0
    burst: float = 2.0
    ramp: float | None = None
    """Ramp length in seconds; default the window's length."""
    from_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class LastEventIdParams:
    to: str = "any"
    """other_stream (an ID of another stream of the session), other_session, garbage,
    tampered (the real ID with its MAC altered), any (one of those that is available)."""


@dataclass(frozen=True, slots=True)
class ExpiryParams:
    order: str = "before"
    """before: the proxy holds the response until the server confirmed the expiry (the
    session is gone before the client sees its response); concurrent: expire and forward
    at the same time (a true race)."""


@dataclass(frozen=True, slots=True)
class CutParams:
    min_index: int = 1
    """Never cut before this event index of the flow (0 = even before the first event)."""


type Params = (
    NoParams
    | ReplayParams
    | ForeignParams
    | OriginParams
    | StormParams
    | LastEventIdParams
    | ExpiryParams
    | CutParams
)

PARAMS: Final[Mapping[FaultKind, type[Params]]] = {
    FaultKind.DROP_PRIMING: NoParams,
    FaultKind.CROSS_IDS: NoParams,
    FaultKind.REPLAY_AFTER_ACK: ReplayParams,
    FaultKind.INJECT_FOREIGN: ForeignParams,
    FaultKind.REWRITE_ORIGIN: OriginParams,
    FaultKind.STORM: StormParams,
    FaultKind.EXECUTED_THEN_LOST: NoParams,
    FaultKind.LOSE_DELETE_RESPONSE: NoParams,
    FaultKind.STRIP_PROTOCOL_VERSION: NoParams,
    FaultKind.REWRITE_LAST_EVENT_ID: LastEventIdParams,
    FaultKind.OLD_TOKEN: NoParams,
    FaultKind.EXPIRY_RACE: ExpiryParams,
    FaultKind.CUT_STREAM: CutParams,
}


def _read_params(kind: FaultKind, f: Fields, window: Window | None) -> Params:
    """The parameters of `kind` from table `f` (defaults filled in), issues recorded in `f`."""
    if kind is FaultKind.REPLAY_AFTER_ACK:
        p: Params = ReplayParams(depth=f.integer("depth", 1, lo=1, hi=16))
    elif kind is FaultKind.INJECT_FOREIGN:
        p = ForeignParams(source=f.choice("source", "any", ("other_stream", "other_session", "any")))
    elif kind is FaultKind.REWRITE_ORIGIN:
        p = OriginParams(
            origin=f.string(
                "origin",
                ILLEGAL_ORIGIN,
                pattern=_ORIGIN,
                what="an origin like 'http://evil.invalid' or 'null'",
            )
        )
    elif kind is FaultKind.STORM:
        p = _read_storm(f, window)
    elif kind is FaultKind.REWRITE_LAST_EVENT_ID:
        p = LastEventIdParams(
            to=f.choice("to", "any", ("other_stream", "other_session", "garbage", "tampered", "any"))
        )
    elif kind is FaultKind.EXPIRY_RACE:
        p = ExpiryParams(order=f.choice("order", "before", ("before", "concurrent")))
    elif kind is FaultKind.CUT_STREAM:
        p = CutParams(min_index=f.integer("min_index", 1, lo=0))
    else:
        p = NoParams()
    f.done()
    return p


def _read_storm(f: Fields, window: Window | None) -> StormParams:
    d = StormParams()
    status = f.integer("status", d.status)
    if status not in (429, 503):
        f.problem("status", f"expected 429 or 503, got {describe(status)}")
        status = d.status
    shape = f.choice("shape", d.shape, ("sustained", "burst", "ramp"))
    period = f.duration("period", d.period, positive=True)
    burst = f.duration("burst", d.burst, positive=True)
    if burst > period:
        f.problem("burst", f"the burst ({burst:g}s) must not be longer than the period ({period:g}s)")
    ramp = f.optional_duration("ramp", positive=True)
    if shape == "ramp" and ramp is None and (window is None or window.end is None):
        f.problem("ramp", "a ramp storm needs a ramp length (params.ramp) or a window with an end")
    return StormParams(
        status=status,
        retry_after=f.duration("retry_after", d.retry_after),
        send_retry_after=f.boolean("send_retry_after", True),
        shape=shape,
        period=period,
        burst=burst,
        ramp=ramp,
        from_rate=f.rate("from_rate", 0.0),
    )


# ---------------------------------------------------------------------- rules


@dataclass(frozen=True, slots=True)
class Window:
    """`[start, end)` in seconds since the run start; `end` None = until the run ends."""

    start: float = 0.0
    end: float | None = None

    def contains(self, t: float) -> bool:
        return t >= self.start and (self.end is None or t < self.end)

    def overlaps(self, other: Window) -> bool:
        a_end = math.inf if self.end is None else self.end
        b_end = math.inf if other.end is None else other.end
        return self.start < b_end and other.start < a_end

    def to_dict(self) -> dict[str, float | None]:
        return {"start": self.start, "end": self.end}


@dataclass(frozen=True, slots=True)
class Target:
    """What a rule can be matched against: the facts of one request."""

    http_method: str
    stream: str | None
    """post, get, resume (GET with Last-Event-ID), or None for others (DELETE...)."""
    method: str | None = None
    tool: str | None = None
    session: str | None = None
    """Pseudonym of the session ID the request carried."""


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
    kind: FaultKind
    rate: float
    window: Window | None = None
    match: Match = field(default_factory=Match)
    params: Params = field(default_factory=NoParams)

    @property
    def unit(self) -> Unit:
        return UNIT[self.kind]

    def probability(self, t: float) -> float:
        """The chance of firing at `t` seconds since the run start (0 outside the window)."""
        w = self.window
        if w is not None and not w.contains(t):
            return 0.0
        p = self.params
        if not isinstance(p, StormParams) or p.shape == "sustained":
            return self.rate
        since = t - (w.start if w is not None else 0.0)
        if p.shape == "burst":
            return self.rate if (since % p.period) < p.burst else 0.0
        length = p.ramp
        if length is None:
            length = (w.end - w.start) if (w is not None and w.end is not None) else 1.0
        frac = min(1.0, max(0.0, since / length))
        return p.from_rate + (self.rate - p.from_rate) * frac

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": str(self.kind),
            "rate": self.rate,
            "window": None if self.window is None else self.window.to_dict(),
            "match": self.match.to_dict(),
            "params": asdict(self.params),
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
    kind: FaultKind | None = None
    if raw_kind is None:
        f.problem("kind", f"required: one of {', '.join(k.value for k in FaultKind)}")
    elif not isinstance(raw_kind, str) or raw_kind not in FaultKind._value2member_map_:
        f.problem("kind", f"unknown fault {describe(raw_kind)}; expected one of {', '.join(FaultKind)}")
    else:
        kind = FaultKind(raw_kind)
    rule_id = f.string(
        "id", f"{raw_kind}#{index}", pattern=_RULE_ID, what="an ID of letters, digits and _.#:/- (1..64)"
    )
    if not f.has("rate"):
        f.problem("rate", "required: a number in 0..1 (probability per flow or per event)")
    rate = f.rate("rate", 0.0)
    if f.has("window"):
        window = read_window(f.table("window"))
    match = read_match(f.table("match"))
    params_table = f.table("params")
    f.done(*extra_keys)
    if kind is None:
        return None
    params = _read_params(kind, params_table, window)
    if isinstance(params, StormParams) and params.from_rate > rate:
        params_table.problem(
            "from_rate", f"must not exceed the rule's rate ({params.from_rate:g} > {rate:g})"
        )
    return Rule(rule_id, kind, rate, window, match, params)


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
            if q.kind is not r.kind or q.match != r.match:
                continue
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

    def of_kind(self, kind: FaultKind) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind is kind)

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


# ---------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Decision:
    """A seed-derived decision: `id` goes to the tap; `draw` in [0, 1) was compared to the rate."""

    rule: str
    id: str
    draw: float
    bits: int
    """64 more pseudo-random bits, for choices made once the fault fires (`pick`)."""

    def pick(self, n: int) -> int:
        """A deterministic index in range(n) (n >= 1)."""
        return self.bits % n


class Decider:
    """Decisions of one seed. `draw` always answers; `decide` answers only when a rule fires.

    The hash is BLAKE2b keyed with the seed (a MAC, like HMAC, at about half the cost: it
    runs for every rule on every SSE event that passes the proxy).
    """

    __slots__ = ("_key", "_prefixes")

    _SCALE: Final = 2.0**64

    def __init__(self, seed: int) -> None:
        self._key = hashlib.blake2b(
            b"mcp-lab/fault-decision\x00" + str(seed).encode(), digest_size=32
        ).digest()
        self._prefixes: dict[str, bytes] = {}

    def _digest(self, rule_id: str, key: str) -> bytes:
        prefix = self._prefixes.get(rule_id)
        if prefix is None:
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            prefix = self._prefixes[rule_id] = rule_id.encode() + b"\x00"
        return hashlib.blake2b(prefix + key.encode(), key=self._key, digest_size=24).digest()

    @staticmethod
    def _decision(rule_id: str, d: bytes) -> Decision:
        return Decision(
            rule=rule_id,
            id="d_" + d[:8].hex(),
            draw=int.from_bytes(d[8:16]) / Decider._SCALE,
            bits=int.from_bytes(d[16:24]),
        )

    def draw(self, rule_id: str, key: str) -> Decision:
        return self._decision(rule_id, self._digest(rule_id, key))

    def sampler(self, rule: Rule, flow_key: str) -> EventSampler:
        """Which event indexes of one flow `rule` fires on (for event-level rules)."""
        return EventSampler(rule.rate, self._digest(rule.id, "events\x00" + flow_key))

    def decide(self, rule: Rule, key: str, t: float) -> Decision | None:
        """The decision for `key` if `rule` fires at `t` (seconds since the run start), else None."""
        p = rule.probability(t)
        if p <= 0.0:
            return None
        d = self._digest(rule.id, key)
        if int.from_bytes(d[8:16]) >= p * self._SCALE:
            return None
        return self._decision(rule.id, d)


class EventSampler:
    """The event indexes of one flow that one event-level rule fires on.

    Equivalent to an independent draw with probability `rate` per index, but drawn as
    geometric gaps between firings from a generator seeded by (seed, rule, flow key), so
    the cost per event is a comparison, not a hash. Deterministic per flow: other flows,
    and the order flows arrive in, do not change it. Indexes must be asked in increasing
    order (each at most once); a rule's window is applied by the caller.
    """

    __slots__ = ("_log_q", "_next", "_rng")

    def __init__(self, rate: float, seed: bytes) -> None:
        self._rng = random.Random(int.from_bytes(seed))
        self._log_q = math.log1p(-rate) if 0.0 < rate < 1.0 else (0.0 if rate >= 1.0 else -math.inf)
        self._next = self._after(-1)

    def _after(self, index: int) -> int:
        """The next firing index after `index`."""
        if self._log_q == 0.0:
            return index + 1
        if self._log_q == -math.inf:
            return 1 << 62
        u = 1.0 - self._rng.random()  # in (0, 1]
        return index + 1 + int(math.log(u) / self._log_q)

    @property
    def next(self) -> int:
        """The next index it may fire on (no index before it will)."""
        return self._next

    def hits(self, index: int) -> bool:
        while self._next < index:
            self._next = self._after(self._next)
        if self._next == index:
            self._next = self._after(index)
            return True
        return False
