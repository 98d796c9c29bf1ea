"""What a fault kind is: its declaration (params schema, unit, evidence...) and its hooks.

Each kind is a small subclass of `FaultKind`; `lab.faults.kinds` registers one instance of
each. Everything that knows about faults reads that registry: the plan and scenario
validators (`params_type`, `check`, `needs`), the mitmproxy addon (the hooks), the
checker's fault accounting (`evidence`, `not_applicable`) and docs/faults.md, which is
generated from it (`lab.faults.docs`).

The hooks are pure: they get facts and return effects, and the addon carries the effects
out (rewrite a header, answer, kill, cut, make an HTTP call). In the order a flow meets
them:

    applies(facts, env)          may this kind act on this request at all?
    on_request(scope, fired, p)  a flow-level rule fired: rewrite the request (Applied),
                                 answer it (Answer), act later (ARM) or not (NOT_APPLIED)
    on_head(answered, p)         an armed kind at the response head: Kill or None
    holds(p)                     hold a streamed answer back until the side call returned
    on_body(answered, p)         an armed kind on a complete non-streamed answer: Kill or None
    event_applies(index, p)      cheap test before an event-level rule is even sampled
    on_event(scope, fired, p)    an event rule fired on this SSE event, or an armed kind
                                 sees it: an EventEffect (insert, rename, drop, cut, race)
    side_call(...) / side_detail(status, ...)
                                 the HTTP call a race makes, and its tap `fault` record
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Final, cast

from lab.faults.checks import Fields, describe
from lab.faults.decisions import Decision, Window
from lab.faults.facts import JsonRpcId, RequestFacts, response_to
from lab.faults.memory import Memory, Remembered
from lab.wire.sse import SseEvent


class Unit(enum.StrEnum):
    """What one decision is about (what `rate` is a probability of)."""

    FLOW = "flow"
    EVENT = "event"


class Evidence(enum.StrEnum):
    """Which tap records show that a kind fired (docs/ledgers.md)."""

    FLOW = "flow"
    """an entry of the `faults` list of the flow's `flow` record"""
    FORWARDED = "forwarded"
    """a `forwarded` record with `fault` set"""
    DROPPED = "dropped"
    """a `dropped` record"""
    FAULT = "fault"
    """a `fault` record (a fault that acted outside an event: an HTTP call of the proxy)"""


class Need(enum.StrEnum):
    """What a kind needs besides the proxy itself."""

    ADMIN_CONTROL = "admin_control"
    """the reference server's admin control (`target.kind = "reference"`)"""
    MEMORY = "memory"
    """the proxy's memory of recent events (other streams, other sessions)"""
    TWO_TOKENS = "two_tokens"
    """clients holding at least two different bearer tokens"""


# ---------------------------------------------------------------------- params schema


class Spec[T]:
    """How one parameter is read and checked (issues named by key), and how docs describe it."""

    def read(self, f: Fields, name: str, default: T) -> T:
        raise NotImplementedError

    def expected(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class IntSpec(Spec[int]):
    lo: int | None = None
    hi: int | None = None

    def read(self, f: Fields, name: str, default: int) -> int:
        return f.integer(name, default, lo=self.lo, hi=self.hi)

    def expected(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"integer {self.lo}..{self.hi}"
        return "integer" + (f" >= {self.lo}" if self.lo is not None else "")


@dataclass(frozen=True, slots=True)
class ChoiceSpec(Spec[str]):
    choices: tuple[str, ...]

    def read(self, f: Fields, name: str, default: str) -> str:
        return f.choice(name, default, self.choices)

    def expected(self) -> str:
        return " \\| ".join(self.choices)


@dataclass(frozen=True, slots=True)
class IntChoiceSpec(Spec[int]):
    choices: tuple[int, ...]

    def read(self, f: Fields, name: str, default: int) -> int:
        value = f.integer(name, default)
        if value not in self.choices:
            f.problem(name, f"expected {' or '.join(map(str, self.choices))}, got {describe(value)}")
            return default
        return value

    def expected(self) -> str:
        return " \\| ".join(map(str, self.choices))


@dataclass(frozen=True, slots=True)
class DurationSpec(Spec[float]):
    positive: bool = False

    def read(self, f: Fields, name: str, default: float) -> float:
        return f.duration(name, default, positive=self.positive)

    def expected(self) -> str:
        return "duration" + (" > 0" if self.positive else "")


@dataclass(frozen=True, slots=True)
class OptionalDurationSpec(Spec[float | None]):
    positive: bool = False

    def read(self, f: Fields, name: str, default: float | None) -> float | None:
        got = f.optional_duration(name, positive=self.positive)
        return default if got is None else got

    def expected(self) -> str:
        return "duration" + (" > 0" if self.positive else "")


@dataclass(frozen=True, slots=True)
class BoolSpec(Spec[bool]):
    def read(self, f: Fields, name: str, default: bool) -> bool:
        return f.boolean(name, default)

    def expected(self) -> str:
        return "true \\| false"


@dataclass(frozen=True, slots=True)
class RateSpec(Spec[float]):
    def read(self, f: Fields, name: str, default: float) -> float:
        return f.rate(name, default)

    def expected(self) -> str:
        return "number 0..1"


@dataclass(frozen=True, slots=True)
class StrSpec(Spec[str]):
    pattern: re.Pattern[str]
    what: str
    """What a good value looks like, for messages and docs."""

    def read(self, f: Fields, name: str, default: str) -> str:
        return f.string(name, default, pattern=self.pattern, what=self.what)

    def expected(self) -> str:
        return self.what


def param[T](default: T, spec: Spec[T], doc: str, *, default_doc: str | None = None) -> T:
    """A parameter of a kind's params dataclass: its default, how it is read, and its docs."""
    meta = {"spec": spec, "doc": doc, "default_doc": default_doc}
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class NoParams:
    """The fault takes no parameters."""


@dataclass(frozen=True, slots=True)
class ParamDoc:
    name: str
    expected: str
    default: str
    doc: str


def read_params(cls: type[Any], f: Fields) -> object:
    """An instance of the params dataclass `cls` from table `f`, every key read by its spec."""
    values: dict[str, object] = {}
    for fl in fields(cls):
        spec: Spec[Any] = fl.metadata["spec"]
        values[fl.name] = spec.read(f, fl.name, fl.default)
    f.done()
    return cls(**values)


def params_docs(cls: type[Any]) -> list[ParamDoc]:
    out = []
    for fl in fields(cls):
        d = fl.default
        shown = fl.metadata.get("default_doc") or (
            "—" if d is MISSING or d is None else str(d).lower() if isinstance(d, bool) else f"`{d}`"
        )
        out.append(ParamDoc(fl.name, fl.metadata["spec"].expected(), shown, fl.metadata["doc"]))
    return out


# ---------------------------------------------------------------------- what hooks get and return


@dataclass(frozen=True, slots=True)
class Fired:
    """A fault that fired: what the tap writes next to what it did."""

    fault: str
    rule: str
    decision: str

    def tag(self, detail: Mapping[str, object] | None = None) -> dict[str, object]:
        out: dict[str, object] = {"fault": self.fault, "rule": self.rule, "decision": self.decision}
        if detail:
            out["detail"] = dict(detail)
        return out


@dataclass(frozen=True, slots=True)
class ProxyEnv:
    """What the proxy was configured with, as far as kinds care."""

    admin_token: str = ""
    """Token of the reference server's admin control ("" = none: kinds that need it never fire)."""
    admin_url: str = ""
    """The expire control; "" = the upstream's `/lab-admin/expire`."""
    call_timeout: float = 2.0
    """Seconds a side call (admin control, DELETE) may take."""


@dataclass(slots=True)
class RequestScope:
    """A flow-level rule fired on a request: what its hook may read and change."""

    facts: RequestFacts
    headers: MutableMapping[str, str]
    """The request's headers as they will go to the server (change them here)."""
    memory: Memory
    decision: Decision
    token_name: Callable[[str | None], str | None]
    """A bearer token's pseudonym (`t_…`), for the tap."""


class Outcome(enum.Enum):
    ARM = "arm"
    """Act later, at the response (head, body or events)."""
    NOT_APPLIED = "not_applied"
    """Nothing fitting was available (e.g. no earlier token): nothing done, nothing written."""


ARM: Final = Outcome.ARM
NOT_APPLIED: Final = Outcome.NOT_APPLIED


@dataclass(frozen=True, slots=True)
class Applied:
    """The request was changed; `detail` goes to the tap with the fault."""

    detail: Mapping[str, object] | None = None
    origin_illegal: bool = False
    """The request's Origin is now one the server must refuse (the tap's `origin_allowed_out`)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The proxy answers the request itself; the server never sees it."""

    status: int
    headers: Mapping[str, str]
    body: str
    detail: Mapping[str, object] | None = None


type RequestEffect = Applied | Answer | Outcome


@dataclass(frozen=True, slots=True)
class Answered:
    """The server's response head, as armed kinds see it."""

    status: int
    sse: bool

    @property
    def ok(self) -> bool:
        """A success: something was performed (a refusal performed nothing)."""
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class Kill:
    """Close the client connection without the response; `detail` goes to the tap."""

    detail: Mapping[str, object] | None = None


class EventScope:
    """One SSE event of a flow, as event hooks see it."""

    __slots__ = (
        "_response",
        "decision",
        "event",
        "event_id",
        "index",
        "jsonrpc_id",
        "memory",
        "session",
        "stream",
    )

    def __init__(
        self,
        index: int,
        event: SseEvent,
        stream: str,
        session: str | None,
        jsonrpc_id: JsonRpcId | None,
        memory: Memory | None,
        decision: Decision,
    ) -> None:
        self.index = index
        self.event = event
        self.event_id = event.id
        self.stream = stream
        """The logical stream: the `e1` stream ID, else inherited from a resumption's cursor,
        else `flow:<flow id>`."""
        self.session = session
        self.jsonrpc_id = jsonrpc_id
        self.memory = memory
        self.decision = decision
        self._response: bool | None = None

    def is_response(self) -> bool:
        """Whether this event is the JSON-RPC response to the flow's own request."""
        if self._response is None:
            ev = self.event
            self._response = ev.is_message and response_to(ev.data, self.jsonrpc_id) is not None
        return self._response


@dataclass(frozen=True, slots=True)
class EventEffect:
    """What an event hook does to one event (the addon combines the effects of all hooks)."""

    insert: Sequence[Remembered] = ()
    """Events forwarded before this one (copies of what the server sent elsewhere)."""
    rename: str | None = None
    """Forward this event under another ID."""
    drop: bool = False
    """Do not forward this event."""
    cut: bool = False
    """Drop this event and every later one, and close the client connection."""
    race: bool = False
    """Start this kind's side call now, without holding the event back."""
    done: bool = False
    """An armed kind is finished with this flow (it is asked about no later event)."""


DONE: Final = EventEffect(done=True)


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the flow's request went, as a side call needs it."""

    host: str
    port: int
    path: str
    headers: Mapping[str, str]
    """The request's headers as they went to the server."""


@dataclass(frozen=True, slots=True)
class HttpCall:
    """An HTTP/1.1 request the proxy makes itself (the admin control, a DELETE)."""

    method: str
    host: str
    port: int
    path: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    """May carry a raw session ID or token: kept out of repr, never written."""
    timeout: float = 2.0


# ---------------------------------------------------------------------- the kind


class FaultKind[P]:
    """One kind of fault. Subclasses set the class attributes and override the hooks they use."""

    name: ClassVar[str]
    number: ClassVar[int]
    """Its number in docs/faults.md (the order kinds are listed and tried on a request)."""
    family: ClassVar[str]
    unit: ClassVar[Unit]
    summary: ClassVar[str]
    """What it does, one paragraph (docs)."""
    applies_to: ClassVar[str]
    """What it applies to, a few words (docs)."""
    evidence: ClassVar[tuple[Evidence, ...]]
    breaks_streams: ClassVar[bool] = False
    """Whether it ends streams early (clients must recover: the resume gate needs recoveries)."""
    feeds: ClassVar[frozenset[int]] = frozenset()
    """The gates whose evidence it makes (1..6, docs/report.md)."""
    needs: ClassVar[frozenset[Need]] = frozenset()
    answers_alone: ClassVar[bool] = False
    """Whether it answers a request alone: it is tried before every other flow-level kind,
    so that no other request fault applies to a request it answers."""
    event_order: ClassVar[int] = 100
    """Per SSE event, hooks run in this order (lowest first)."""
    not_modern: ClassVar[str | None] = None
    """Why it has no meaning in the modern era (2026-07-28: no session, no event IDs, no
    resumption), in a few words; None: it applies there too. A scenario of the modern era
    only refuses such a fault, saying this (docs/eras.md)."""
    only_modern: ClassVar[str | None] = None
    """Why it has no meaning in the handshake era, in a few words; None: it applies there.
    A scenario of the handshake era only refuses such a fault, saying this."""
    params_type: type[P]

    # ------------------------------------------------------------------ validation

    def read_params(self, f: Fields, window: Window | None, rate: float) -> P:
        """The parameters from table `f` (defaults filled in); issues are recorded in `f`."""
        p = cast(P, read_params(self.params_type, f))
        self.check(p, f, window, rate)
        return p

    def check(self, params: P, f: Fields, window: Window | None, rate: float) -> None:
        """Rules across parameters (record problems with `f.problem(key, ...)`)."""

    def shape(self, rate: float, params: P, window: Window | None, t: float) -> float:
        """The chance of firing at `t` seconds since the run start, inside the window."""
        return rate

    # ------------------------------------------------------------------ hooks

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return True

    def on_request(self, scope: RequestScope, fired: Fired, params: P) -> RequestEffect:
        return ARM

    def on_head(self, answered: Answered, params: P) -> Kill | None:
        return None

    def holds(self, params: P) -> bool:
        return False

    def on_body(self, answered: Answered, params: P) -> Kill | None:
        return None

    def event_applies(self, index: int, params: P) -> bool:
        return True

    def on_event(self, scope: EventScope, fired: Fired, params: P) -> EventEffect | None:
        return None

    def side_call(self, facts: RequestFacts, upstream: Upstream, env: ProxyEnv, params: P) -> HttpCall | None:
        return None

    def side_detail(self, status: int, facts: RequestFacts, params: P) -> dict[str, object]:
        return {"status": status}

    # ------------------------------------------------------------------ accounting

    def not_applicable(self, detail: Mapping[str, object]) -> str | None:
        """Why a `fault` record of this kind shows the target could not take it (None: it could)."""
        return None
