"""What `lab selftest` runs and what it expects of each run.

One case per deliberate defect of the reference server (`lab.server.defects`), plus the
pristine server, plus the **legal shapes**: the reference server in legal but unusual
modes (polling closes after every event with `retry: 0`; answers as `application/json`;
only 2025-03-26, with no priming event and no `retry`). Each defect names the gate that
must FAIL on it, with a **server** witness of one of the named checks: a gate that fails
for another reason (a slow client, a proxy fault the client accepted) has not shown that
it catches the defect. The pristine server and every legal shape, run the same way, must
PASS every gate: a false alarm on a server that did nothing wrong fails the selftest.

The expectation is held here, next to why that check is the one that sees the defect;
docs/selftest.md shows the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from lab.server.defects import DEFECT_NAMES, DESCRIPTIONS, Defect

PRISTINE = "pristine"
"""The case without a defect: every gate must pass."""

SELFTEST_RULES: tuple[str, ...] = ("declared_capabilities", "modern_requests", "capacity")
"""Rules beyond the core that selftest runs have: its tap records what each session
declared at initialize (13); the runs of the modern era have 15; the capacity checks 16."""


@cache
def gates() -> tuple[tuple[int, str], ...]:
    """(number, ID) of the rules every selftest run has, in display order (the checker's
    registry, lab.checker.rules): the columns of the matrix. Read when asked: the checker
    (pandas) is not imported to register the subcommand (`lab --help`, every `lab` start)."""
    from lab.checker import REGISTRY

    return tuple((r.number, r.id) for r in REGISTRY.core()) + tuple(
        (REGISTRY[r].number, r) for r in SELFTEST_RULES
    )


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    """A defect name (`lab serve --defect`), or `pristine`."""
    description: str
    gate: int | None
    """The gate that must fail (None: the pristine case, every gate must pass)."""
    checks: tuple[str, ...] = ()
    """The checks of that gate, one of which must have a server witness."""
    why: str = ""
    """Why this check sees this defect on the wire."""
    server_args: tuple[str, ...] = ()
    """A legal shape's `lab serve` options."""
    scenario: str | None = None
    """A legal shape's own scenario (a name), instead of the selftest's."""
    shape: bool = False
    """A legal shape: no defect, every gate must pass."""

    @property
    def defect(self) -> str | None:
        return None if self.name == PRISTINE or self.shape else self.name

    @property
    def gate_name(self) -> str | None:
        return None if self.gate is None else dict(gates())[self.gate]


def _case(defect: Defect, gate: int, checks: tuple[str, ...], why: str, scenario: str | None = None) -> Case:
    return Case(defect.value, DESCRIPTIONS[defect], gate, checks, why, scenario=scenario)


CASES: tuple[Case, ...] = (
    Case(PRISTINE, "the reference server with no defect, in the same black-box mode", None),
    _case(
        Defect.SHARED_EVENT_STORE,
        1,
        ("sent_off_home",),
        "a resumption replays events another session's stream (same request id) sent first: "
        "their home, looked up across sessions, is that other stream (foreign_session)",
    ),
    _case(
        Defect.REPLAY_OTHER_STREAMS,
        1,
        ("sent_off_home",),
        "a resumption replays events first sent on the session's other streams",
    ),
    _case(
        Defect.REPLAY_FROM_START,
        1,
        ("replayed_before_cursor",),
        "a resumption replays events first sent at or before the cursor",
    ),
    _case(
        Defect.UNKNOWN_CURSOR_SILENT,
        5,
        ("silent_resumption",),
        "a resumption whose cursor the server never sent in the session (the proxy's garbage "
        "Last-Event-ID) is answered 200 and carries no message for longer than the budget",
    ),
    _case(
        Defect.REPLAY_MISORDERED,
        1,
        ("replayed_out_of_order", "event_after_response"),
        "a resumption delivers the response before progress the server first sent before it",
    ),
    _case(
        Defect.NO_IDEMPOTENCY,
        2,
        ("wire_different_results",),
        "a retried write (same subject and key) is answered with a second, different result",
    ),
    _case(
        Defect.ANY_ORIGIN,
        4,
        ("not_rejected",),
        "requests with an Origin outside the allow-list (rewritten by the proxy) are served",
    ),
    _case(
        Defect.UNKNOWN_SESSION_400,
        3,
        ("terminated_session_not_404",),
        "after a DELETE of the session answered 2xx, a request carrying it gets 400, not 404",
    ),
    _case(
        Defect.RESPONSE_ON_GET,
        1,
        ("response_on_standalone_get",),
        "JSON-RPC responses are sent on the standalone GET stream",
    ),
    _case(
        Defect.NO_PRIMING,
        5,
        ("no_priming",),
        "2025-11-25 POST streams start with a message instead of the priming event",
    ),
    _case(
        Defect.NO_RETRY_FIELD,
        6,
        ("close_without_retry",),
        "the server ends a POST stream's connection before its response (and resumes it "
        "later) without sending a `retry` field first",
    ),
    _case(
        Defect.DELETED_SESSION_ALIVE,
        3,
        ("terminated_session_not_404",),
        "after a DELETE of the session answered 2xx, a request carrying it is still served",
    ),
    _case(
        Defect.SLOW_RESUME,
        5,
        ("slow_recovery",),
        "the target's own share of the recoveries, timed at the proxy from the resumption it "
        "forwarded to the first event the target sent back, is over the budget",
    ),
    _case(
        Defect.BROADCAST,
        1,
        ("broadcast",),
        "each progress notification goes out live on its POST stream and, at the same moment, "
        "on the session's standalone GET stream: one message on two streams",
    ),
    _case(
        Defect.RESUME_FORGET,
        5,
        ("unreplayed_resumption",),
        "a resumption on a cursor the server did send owes the messages the server had sent on "
        "that stream after it; the resumed stream carries none of them (it streams on, or closes)",
    ),
    _case(
        Defect.RESUME_EMPTY,
        5,
        ("unreplayed_resumption",),
        "a resumption on a known cursor is closed at once after a fresh priming event, with none "
        "of the messages it owed",
    ),
    _case(
        Defect.SERVE_WITHOUT_SESSION,
        3,
        ("served_without_session",),
        "the proxy removes MCP-Session-Id from some POSTs after the handshake (strip_session_id); "
        "the server serves them instead of answering 400",
    ),
    _case(
        Defect.UNDECLARED_CAPABILITY,
        13,
        ("undeclared_capability",),
        "the server sends notifications/resources/updated; its InitializeResult (in the tap) "
        "declares no `resources`",
    ),
    _case(
        Defect.PER_STREAM_IDS,
        1,
        ("event_id_reused", "sent_off_home"),
        "every stream counts its IDs from 0: the second stream of a session reuses the first's "
        "IDs live, and a resumption from such an ID is sent the first stream's events",
    ),
    _case(
        Defect.MODERN_HEADERS_UNCHECKED,
        15,
        ("mismatch_accepted",),
        "the proxy makes a modern-era request's Mcp-Method or Mcp-Name disagree with its body: the "
        "server serves it (2xx) instead of answering 400",
        scenario="selftest-modern",
    ),
    _case(
        Defect.MODERN_MINTS_SESSION,
        15,
        ("session_minted",),
        "the tap records the Mcp-Session-Id of every answer: a modern-era request's answer carries one",
        scenario="selftest-modern",
    ),
    _case(
        Defect.MODERN_SENDS_AFTER_CLOSE,
        1,
        ("response_to_another_request", "rejected_unexplained", "event_after_response"),
        "the proxy cuts modern-era ticker streams (each cut is that call's cancellation): the call "
        "runs on and its later progress and answer reach another open response, where they do not belong",
        scenario="selftest-modern",
    ),
    _case(
        Defect.MODERN_NO_IDEMPOTENCY,
        2,
        ("wire_different_results",),
        "in a run of both eras, a write re-issued after its answer was lost is answered with a second, "
        "different result, by the modern era's path only: the report's by-era verdicts show gate 2 "
        "failing for the modern clients and holding for the handshake ones",
        scenario="selftest-dual",
    ),
    _case(
        Defect.STALLS_AT_CAPACITY,
        16,
        ("unanswered",),
        "in a capacity check, requests the proxy forwarded and that the target never answered are the "
        "target's, phase by phase, over the share the budget allows",
        scenario="capacity-short",
    ),
)
SHAPES: tuple[Case, ...] = (
    Case(
        "shape-poll",
        "legal shape: the server ends every ticker stream's connection after each event, advising "
        "`retry: 0`; each call is a chain of resumptions",
        None,
        scenario="selftest-poll",
        shape=True,
    ),
    Case(
        "shape-json",
        "legal shape: every tools/call but the ticker's is answered as application/json (no SSE, no "
        "event ID); a lost answer is re-sent, with its key",
        None,
        server_args=("--json-answers",),
        shape=True,
    ),
    Case(
        "shape-2025-03-26",
        "legal shape: the server negotiates only 2025-03-26: no priming event, no version header, no "
        "`retry` field",
        None,
        server_args=("--protocol-versions", "2025-03-26"),
        scenario="selftest-2025-03-26",
        shape=True,
    ),
    Case(
        "shape-dual-era",
        "legal shape: both protocol eras at once, the pristine server serving each its own way: "
        "half the clients with sessions and resumption, half in 2026-07-28 (no session, re-issues)",
        None,
        scenario="selftest-dual",
        shape=True,
    ),
    Case(
        "shape-capacity",
        "legal shape: the pristine server under a capacity check (no faults by design): the capacity "
        "rule passes, and the rules whose evidence only faults make are not applicable",
        None,
        scenario="capacity-short",
        shape=True,
    ),
)
"""Legal but unusual servers: each must pass every gate (a false alarm fails the selftest)."""

ALL_CASES: tuple[Case, ...] = CASES + SHAPES
BY_NAME: dict[str, Case] = {c.name: c for c in ALL_CASES}

assert {c.name for c in CASES} == {PRISTINE, *DEFECT_NAMES}, "a defect without a selftest case"


def select(names: list[str] | None) -> list[Case]:
    """The cases to run, in table order: every case (defects, pristine, legal shapes), or
    exactly the named ones (`pristine` names the pristine run, `shape-…` a legal shape).
    Unknown names raise ValueError naming them and the known ones."""
    if not names:
        return list(ALL_CASES)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [c for c in ALL_CASES if c.name in set(names)]
