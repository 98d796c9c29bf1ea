"""What the checker decides: verdicts, witnesses, evidence, gate results, the run report.

Plain frozen dataclasses with no pandas in them, so the report writers and the
dashboards can use them without loading any ledger. Every value a witness carries is
JSON-ready (str, int, float, bool or None): a witness is written to report.json as is.

Verdicts follow Jepsen's checkers: `pass` (true), `fail` (false), `inconclusive`
(unknown). When verdicts combine, fail outranks inconclusive, and inconclusive outranks
pass: a run passes only if every gate passed. A run has one more verdict, `incomplete`:
it did not finish (interrupted, a part died, still running, abandoned) and no gate
failed. An incomplete run never passes; a violation found in it still fails it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from lab.exitcodes import ExitCode

type Scalar = str | int | float | bool | None
type JsonValue = Scalar | list[JsonValue] | dict[str, JsonValue]


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    INCOMPLETE = "incomplete"
    """Only as a run's verdict (never a gate's): the run did not finish and no gate failed."""
    NOT_APPLICABLE = "not_applicable"
    """Only as a gate's verdict: the rule does not exist in the protocol era(s) the run
    tested (docs/eras.md), e.g. a re-handshake after a lost session in the modern era,
    which has no sessions. Never a pass nor a fail, and it counts for nothing in the run's."""

    @property
    def exit_code(self) -> ExitCode:
        """The exit code of `lab report` and `lab run` (lab.exitcodes): 0 pass, 1 a gate
        failed, 2 inconclusive or incomplete."""
        if self is Verdict.PASS:
            return ExitCode.PASS
        if self is Verdict.FAIL:
            return ExitCode.GATE_FAILED
        return ExitCode.INCONCLUSIVE


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """Fail outranks inconclusive, which outranks pass; not applicable counts for nothing.
    No verdict at all is inconclusive."""
    seen = set(verdicts) - {Verdict.NOT_APPLICABLE}
    if Verdict.FAIL in seen:
        return Verdict.FAIL
    if Verdict.INCONCLUSIVE in seen or not seen:
        return Verdict.INCONCLUSIVE
    return Verdict.PASS


class Attribution(enum.StrEnum):
    """Who a witness blames.

    server: the server itself did it (visible before any fault, e.g. in the tap's `sent`
        records or the server ledger);
    client: the client did it, or failed to reject what a proxy fault showed it;
    proxy_fault_rejected: a proxy fault the client correctly rejected (counted, never a
        violation);
    unattributed: the ledgers do not say whose it is (e.g. a slow recovery);
    topology: the deployment in front of the server (a balancer's routing over replicas),
        not the server's rules nor the client.
    """

    SERVER = "server"
    CLIENT = "client"
    PROXY_FAULT_REJECTED = "proxy_fault_rejected"
    UNATTRIBUTED = "unattributed"
    TOPOLOGY = "topology"


@dataclass(frozen=True, slots=True)
class Witness:
    """One offending row, explained in one line a person can follow."""

    check: str
    """Which check of the gate found it (e.g. `not_sent_on_stream`, `server_performed_twice`)."""
    explanation: str
    attribution: Attribution
    row: Mapping[str, Scalar]
    """The ledger fields behind the explanation (names as in docs/ledgers.md)."""
    refs: tuple[str, ...] = ()
    """Where the raw evidence is, in the run folder: `proxy/tap.jsonl:<line>`,
    `clients/<file>#<table>/<rowid>`, `server/ledger.sqlite#<table>/<rowid>`, and
    `fault:<decision ID>` for the proxy fault decision involved."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One evidence minimum of a gate: the gate cannot pass unless every one holds."""

    name: str
    required: Scalar
    observed: Scalar
    ok: bool
    detail: str = ""
    from_faults: bool = False
    """Evidence only the injected faults make (404s, illegal Origins, recoveries, retried
    writes, reconnects, crossed streams): a capacity check, which injects none by design,
    does not require it (lab.checker.judge.capacity_check)."""


@dataclass(frozen=True, slots=True)
class GateResult:
    """One rule's verdict. A rule's reading leaves `number`, `gate` and `title` out: the
    judge stamps them from the rule's declaration (lab.checker.rules.base.Rule)."""

    verdict: Verdict
    summary: str
    """One line: what was measured against what, and why the verdict."""
    budget: Mapping[str, Scalar]
    measured: Mapping[str, JsonValue]
    evidence: tuple[Evidence, ...] = ()
    violations: int = 0
    """How many offending rows there are in all (witnesses are the first few)."""
    witnesses: tuple[Witness, ...] = ()
    attribution_counts: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    error: str | None = None
    """Set when the gate's own code raised: the verdict is then inconclusive."""
    truth_from: str = ""
    """Where the gate's truth came from, in words, when it says (a client under test:
    "the wire (proxy tap)", "the application log + the tap", ...)."""
    number: int = field(default=0, kw_only=True)
    """The rule's display number (the order of the rule table, docs/report.md)."""
    gate: str = field(default="", kw_only=True)
    """The rule's stable ID (`cross_stream`, `duplicate_dispatch`, ...: lab.checker.rules)."""
    title: str = field(default="", kw_only=True)


def decide(failed: bool, evidence: Iterable[Evidence]) -> Verdict:
    """A found violation fails the gate whatever the evidence; otherwise thin evidence
    makes it inconclusive, never a pass."""
    if failed:
        return Verdict.FAIL
    if all(e.ok for e in evidence):
        return Verdict.PASS
    return Verdict.INCONCLUSIVE


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong with an input file (or the run), named by its path in the run folder."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """One input file as the loader found it.

    status: ok | missing | error (unreadable, corrupted or of an unknown schema)
    rows: rows read per table or record type
    """

    path: str
    kind: str
    schema: str
    status: str
    error: str | None = None
    rows: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FaultCount:
    """How many times one fault kind fired, and where that was seen.

    by_source keys: tap_flow (flow.faults), tap_forwarded, tap_dropped, tap_fault (the
    tap's `fault` records), nemesis (toxics added; the kind is `toxic:<type>`).
    configured: the kind appears in run.json's fault_windows.
    """

    fault: str
    total: int
    by_source: Mapping[str, int]
    configured: bool


@dataclass(frozen=True, slots=True)
class NotApplicable:
    """A configured fault that this target made impossible to apply (e.g. a DELETE the
    target answers 405), said plainly in the report."""

    fault: str
    reason: str
    count: int


@dataclass(frozen=True, slots=True)
class Collapse:
    """A stretch of the run where throughput fell to about nothing while clients were
    active (times epoch s)."""

    start: float
    end: float
    throughput: int
    """Answered requests plus events sent in the stretch."""
    active_clients: int
    """The most clients with a request open in any second of the stretch."""
    typical_per_bin: float
    bin_s: float


@dataclass(frozen=True, slots=True)
class Liveness:
    """What never finished, next to the gates. None where the ledgers cannot say."""

    calls_without_outcome: int | None
    """Calls (tool-call operations) that never got an outcome by the end of the run."""
    clients_stuck: tuple[str, ...]
    """Clients with such a call at the end."""
    collapses: tuple[Collapse, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run as run.json describes it (None where run.json does not say)."""

    run_id: str
    complete: bool | None
    end_reason: str | None
    started_at: float | None
    stopped_at: float | None
    scenario: str | None
    seed: Scalar
    target: str | None
    fault_windows: tuple[tuple[str, float, float], ...] = ()
    overrides: Mapping[str, object] = field(default_factory=dict)
    """What the command line changed in the scenario (run.json `overrides`)."""


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the baseline (known failures) says about one gate, and what the run showed."""

    gate: str
    status: str
    """`known` (listed, failed), `fixed` (listed, passed: remove it from the baseline),
    `unseen` (listed, inconclusive: nothing learned)."""


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """Who the load was (run.json `client`): the lab's own clients or a client under test."""

    kind: str
    """`lab`, `python-sdk`, `typescript-sdk` or `cmd`."""
    implementation: str | None
    """`name version` of the implementation (its adapters' `ready` lines), when known."""
    expected_failures: tuple[str, ...] = ()
    baseline: str | None = None
    """Where the known failures come from (a file, `scenario`), or None."""


@dataclass(frozen=True, slots=True)
class RunReport:
    run: RunInfo
    verdict: Verdict
    gates: tuple[GateResult, ...]
    budgets: Mapping[str, Scalar]
    budgets_defaulted: tuple[str, ...]
    event_count: int | None
    event_count_source: str
    sources: tuple[SourceInfo, ...]
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]
    """What the loader noticed without refusing anything (skipped records, cut-off last
    lines, tables read as empty)."""
    faults: tuple[FaultCount, ...]
    faults_never_fired: tuple[str, ...]
    checked_at: float
    check_seconds: float
    incomplete: bool = False
    """The run did not finish (run.json `complete` false, or a run still `running` or
    `abandoned`): the verdict is then never better than incomplete."""
    faults_not_applicable: tuple[NotApplicable, ...] = ()
    liveness: Liveness | None = None
    sections: Mapping[str, JsonValue] = field(default_factory=dict)
    """Report sections beside the gates (`lab.checker.judge.sections`): `phases`, `capacity`,
    `rollout`, `processes`, as report.json writes them."""
    client: ClientInfo | None = None
    expectations: tuple[Expectation, ...] = ()
    """The baseline's known failures as this run found them (lab.checker.judge.baseline)."""


def made_inconclusive(
    result: GateResult, evidence: Evidence, said: str, note: str | None = None
) -> GateResult:
    """`result` turned INCONCLUSIVE by a finding: `said` appended to its summary, the unmet
    `evidence` to its evidence, and `note` (default: `said`) to its notes. One way for every
    "limited by the lab" qualification to demote a gate."""
    return replace(
        result,
        verdict=Verdict.INCONCLUSIVE,
        summary=f"{result.summary}; {said}",
        evidence=(*result.evidence, evidence),
        notes=(*result.notes, said if note is None else note),
    )
