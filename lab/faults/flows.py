"""The faults of one flow, from its request to its end (pure): the addon asks, then acts.

The mitmproxy addon (addons/mcp_faults.py) calls one method per hook and carries out what
it returns: an answer of the proxy's own, a kill, the event faults for the tap's SSE
pipe, the races' side calls. Everything the tap needs to know about what was done is in
`meta` (the addon puts it in `flow.metadata["mcp_lab"]`, see `lab.faults.records`).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from lab.faults.events import Armed, EventFaults
from lab.faults.facts import RequestFacts, answers_request
from lab.faults.kinds.base import (
    ARM,
    Answer,
    Answered,
    Applied,
    Fired,
    HttpCall,
    Kill,
    ProxyEnv,
    RequestScope,
    Upstream,
)
from lab.faults.memory import Memory
from lab.faults.pins import Ordinals, Place
from lab.faults.plan import ActivePlan, PlanHolder


class FlowFaults:
    __slots__ = ("armed", "events", "facts", "faults", "meta", "place")

    def __init__(self, facts: RequestFacts) -> None:
        self.facts = facts
        self.faults: list[dict[str, object]] = []
        """The request and response faults applied (the tap's `flow.faults`)."""
        self.armed: list[Armed] = []
        self.events: EventFaults | None = None
        self.place: Place | None = None
        """Where the request stands among its client's requests, when the plan has pins."""
        self.meta: dict[str, Any] = {
            "key": facts.key,
            "stream": facts.stream,
            "faults": self.faults,
            "answered_by": "server",
        }

    def on_request(
        self,
        active: ActivePlan,
        env: ProxyEnv,
        headers: MutableMapping[str, str],
        memory: Memory,
        token_name: Callable[[str | None], str | None],
        now: float,
        ordinals: Ordinals | None = None,
    ) -> Answer | None:
        """Try every flow-level rule on the request (changing `headers`); an answer of the
        proxy's own ends it (a storm answers alone). `ordinals` counts the requests for
        pinned rules (the proxy's one counter)."""
        facts = self.facts
        if active.pinned and ordinals is not None:
            self.place = ordinals.place(facts)
        for rule in active.flow_rules:
            kind = rule.spec
            if not rule.match.matches(facts.target) or not kind.applies(facts, env):
                continue
            d = active.decide(rule, facts.key, now, self.place)
            if d is None:
                continue
            fired = Fired(kind.name, rule.id, d.id)
            effect = kind.on_request(RequestScope(facts, headers, memory, d, token_name), fired, rule.params)
            if isinstance(effect, Answer):
                self.meta["answered_by"] = "proxy"
                self.faults.append(fired.tag(effect.detail))
                return effect
            if isinstance(effect, Applied):
                self.faults.append(fired.tag(effect.detail))
                if effect.origin_illegal:
                    self.meta["origin_rewritten"] = True
            elif effect is ARM:
                self.armed.append(Armed(kind, rule, d))
        return None

    def fault_tag(self) -> str | None:
        """The response's `x-lab-fault` value (lab.wire.extensions.LAB_FAULT_HEADER): the
        kinds of the request and response faults applied so far, in the order applied,
        each once; None when the flow is untouched."""
        if not self.faults:
            return None
        return ",".join(dict.fromkeys(str(f["fault"]) for f in self.faults))

    def on_head(self, status: int, sse: bool) -> Kill | None:
        """The response head: an armed kind may kill the flow here."""
        for a in self.armed:
            kill = a.kind.on_head(Answered(status, sse), a.rule.params)
            if kill is not None:
                return self._killed(a, kill)
        return None

    def stream(
        self, holder: PlanHolder, memory: Memory, last_event_id: str | None, on_race: Callable[[Armed], None]
    ) -> EventFaults:
        """The event faults of an SSE answer (the tap's pipe runs them on every event)."""
        self.events = EventFaults(
            self.facts,
            holder,
            memory,
            self.armed,
            last_event_id=last_event_id,
            on_race=on_race,
            place=self.place,
        )
        return self.events

    def holds(self) -> bool:
        """Whether an armed race wants the answer held back until its side call returned."""
        return any(a.kind.holds(a.rule.params) for a in self.armed)

    def on_body(self, status: int, sse: bool, body: bytes) -> Kill | list[tuple[Armed, bool]]:
        """A complete answer that was not streamed (JSON, or an SSE answer held back): a kill,
        or the races to run now, each with whether to wait for it before the answer passes."""
        races = []
        for a in sorted(self.armed, key=lambda a: a.kind.number):
            kill = a.kind.on_body(Answered(status, sse), a.rule.params)
            if kill is not None:
                return self._killed(a, kill)
            holds = a.kind.holds(a.rule.params)
            if (sse and not holds) or not answers_request(body, sse, self.facts.rpc.id):
                continue  # on a held SSE answer, the other races act as its events pass
            races.append((a, holds))
            if self.events is not None:
                self.events.disarm(a.kind.name)
        return races

    def side_call(self, a: Armed, upstream: Upstream, env: ProxyEnv) -> HttpCall | None:
        return a.kind.side_call(self.facts, upstream, env, a.rule.params)

    def fault_record(self, a: Armed, status: int, t: float) -> dict[str, Any]:
        """The tap `fault` record of a race's side call that returned `status`."""
        detail = a.kind.side_detail(status, self.facts, a.rule.params)
        return {"type": "fault", "t": t, **a.fired.tag(), "flow": self.facts.flow, "detail": detail}

    def _killed(self, a: Armed, kill: Kill) -> Kill:
        self.faults.append(a.fired.tag(kill.detail))
        self.meta["cut"] = True
        return kill
