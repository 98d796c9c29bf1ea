"""What a rule declares, and the registry that holds every rule (as `lab.faults.kinds` holds
the fault kinds).

A rule judges; it does not measure: it reads the measures of `lab.checker.truth` (and the
lab's health, the timeline) through the `Context`, and answers one `GateResult`. Each
rule module declares one `Rule` and `lab.checker.rules` registers it; the judge, the
report, JUnit, `lab run --client` and the selftest read the registry, and there is no
other list of rules.

One rule serves both kinds of client where it applies to both: the lab's own clients
(their ledgers are evidence: `Audience.LAB`) and a client under test (no client ledger:
the wire and its application log, `Audience.UNDER_TEST`). `check` is the reading of the
lab's clients, `check_under_test` the reading of a client under test; a rule that gives
the same `check` for both reads nothing client-specific.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from lab.checker.context import Context
from lab.checker.model import Attribution, GateResult
from lab.wire.revisions import BOTH_ERAS

type Check = Callable[[Context], GateResult]

HANDSHAKE_ONLY = frozenset({"handshake"})
"""A rule of sessions or resumption: the modern era (2026-07-28) removed both."""


class Audience(enum.StrEnum):
    """Whose clients a run's load was, and so whose ledgers a rule may read."""

    LAB = "lab"
    """The lab's own clients: their ledgers (inbox, outbox, reconnects, recoveries)."""
    UNDER_TEST = "under_test"
    """A client the lab did not write: the wire (proxy tap) and its application log."""


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    """Stable identifier: report.json's key, JUnit's test name, `[expected_failures]`'s entry."""
    number: int
    """Display order (the report's "gate N"); unique, never an identity."""
    title: str
    blames: tuple[Attribution, ...]
    """Whom its witnesses can blame."""
    evidence: str
    """What it needs to decide, in words (without it the rule is inconclusive)."""
    check: Check | None
    """The reading for the lab's own clients (None: the rule does not apply to them)."""
    check_under_test: Check | None = None
    """The reading for a client under test (None: the rule does not apply to one)."""
    budget_key: str | None = None
    """The run.json `budgets` key it is judged against, if any."""
    applies: Callable[[Context], bool] | None = None
    """For a rule that only some scenarios have (phases, rollout knobs): does this run have it?"""
    placed_in_time: bool = False
    """Its violations can be placed in a capacity step by the times of their rows."""
    server_times: Callable[[Context], Sequence[float]] | None = None
    """For a rule placed in time: the times of all the server's own offending sends."""
    judged_to_knee: bool = False
    """In a capacity ramp past its knee, judged on the rows before the first step past it."""
    liveness: bool = False
    """It judges liveness (calls that never recovered): an interrupted run cannot fail on it."""
    eras: frozenset[str] = BOTH_ERAS
    """The protocol eras the rule exists in (docs/eras.md); in a run of none of them it is
    not applicable, never a pass or a fail."""
    era_note: str = ""
    """Why it does not exist in the era(s) it lacks, in words, for the report."""
    judged_without_faults: bool = False
    """In a capacity check (no faults by design), the evidence only faults make is not
    required, and the rule still judges what it has (gate 1: every event the server sent
    and the clients accepted). Otherwise a rule left without that evidence is not
    applicable there (lab.checker.judge.capacity_check)."""

    def check_for(self, audience: Audience) -> Check | None:
        return self.check if audience is Audience.LAB else self.check_under_test


class RuleError(ValueError):
    """A rule that cannot be registered: its ID or number is taken, or it judges no one."""


class Registry:
    """Every rule by ID, in display order. Refuses a duplicate ID or number."""

    def __init__(self) -> None:
        self._rules: dict[str, Rule] = {}

    def register(self, rule: Rule) -> Rule:
        if not rule.id or not rule.id.replace("_", "").isalnum():
            raise RuleError(f"rule ID {rule.id!r}: expected letters, digits and underscores")
        if rule.id in self._rules:
            raise RuleError(f"rule ID {rule.id!r} is already registered (gate {self._rules[rule.id].number})")
        taken = next((r for r in self._rules.values() if r.number == rule.number), None)
        if taken is not None:
            raise RuleError(f"rule {rule.id!r}: number {rule.number} is already rule {taken.id!r}'s")
        if rule.check is None and rule.check_under_test is None:
            raise RuleError(f"rule {rule.id!r} judges no one: give check or check_under_test")
        self._rules[rule.id] = rule
        return rule

    def unregister(self, rule_id: str) -> None:
        self._rules.pop(rule_id, None)

    @contextmanager
    def registered(self, rule: Rule) -> Iterator[Rule]:
        """A rule registered for the `with` block only (a test's toy rule)."""
        self.register(rule)
        try:
            yield rule
        finally:
            self.unregister(rule.id)

    def __getitem__(self, rule_id: str) -> Rule:
        return self._rules[rule_id]

    def __iter__(self) -> Iterator[Rule]:
        return iter(sorted(self._rules.values(), key=lambda r: r.number))

    def __contains__(self, rule_id: object) -> bool:
        return rule_id in self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self)

    def for_audience(self, audience: Audience) -> tuple[Rule, ...]:
        """The rules that judge this kind of client, in display order."""
        return tuple(r for r in self if r.check_for(audience) is not None)

    def core(self) -> tuple[Rule, ...]:
        """The rules every run of the lab's clients has (no `applies`): the gate table."""
        return tuple(r for r in self.for_audience(Audience.LAB) if r.applies is None)
