"""The one reconnector: every way the client gets a stream, a call or its session back.

A *loss* is something the client must get back: a tool call (its stream, then the call
itself), the standalone GET stream, the session, or the answer to a DELETE. Each way of
getting it back is a *kind* (`KINDS`, one table), and every kind goes through the same
steps, written once, here:

    lose     `lost()`: a loss is detected. The first loss of a recovery is kept (its time
             and cause); a later failure of the same recovery only counts.
    plan     the next attempt, never before the server's advice (SSE `retry`,
             `Retry-After`), with backoff and jitter otherwise (`plan_reconnect`).
    budget   when due (`tick()`), the shared `ReconnectBudget` lets it go now or says when.
    attempt  the kind's handler sends the request; a `ReconnectAttempt` row is written.
    give up  after the kind's attempts: fall back to the next kind of the table (a
             resumption becomes a re-sent call or a reopened stream), else the handler
             ends the recovery unrecovered.
    end      `recovered()` or `end()`: one `Recovery` row, built in `_end` and nowhere
             else. `recovered_at` NULL means it never recovered, whatever the reason
             (`path`: abandoned, session_lost, cancelled, left, client_stopped).

Only losses of a call or of the standalone stream are recoveries with a row (gate 5 is
about streams and calls coming back). A new handshake and a repeated DELETE are
reconnects like the others (planned, budgeted, recorded as attempts), but not streams:
their time shows in the reconnects table, and a new handshake in the `reinitialized`
flag of the recoveries it served.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lab.client._client_state import ClientState
from lab.client._commands import SendRequest
from lab.client._config import ClientConfig
from lab.client._reconnect import RandomSource, ReconnectBudget, plan_reconnect
from lab.wire.client_ledger import ReconnectAttempt, Recovery


class Kind(enum.StrEnum):
    """A way of getting something back (the `kind` column of the reconnects table)."""

    RESUME = "resume"
    """GET + `Last-Event-ID` on the lost stream (a call's, or the standalone one)."""
    RESEND = "resend"
    """The call again: same idempotency key, new JSON-RPC request ID."""
    REOPEN = "reopen"
    """A fresh standalone GET stream (the old one cannot be resumed)."""
    REINITIALIZE = "reinitialize"
    """A new handshake without a session ID."""
    DELETE = "delete"
    """The DELETE again (its answer was lost)."""


class Target(enum.StrEnum):
    """What is being got back (one loss per target at a time)."""

    CALL = "call"
    STANDALONE = "standalone"
    SESSION = "session"
    DELETE = "delete"


RECOVERY_TARGETS = frozenset({Target.CALL, Target.STANDALONE})
"""Targets whose recoveries are written as `Recovery` rows."""


class EndPath(enum.StrEnum):
    """`Recovery.path` of a recovery that never recovered (recovered_at NULL)."""

    ABANDONED = "abandoned"
    """Every kind's attempts were used up."""
    SESSION_LOST = "session_lost"
    """The session ended (404) while the call or stream was being recovered."""
    CANCELLED = "cancelled"
    """The application cancelled the call."""
    LEFT = "left"
    """The client left (DELETE) still waiting."""
    CLIENT_STOPPED = "client_stopped"
    """The client stopped (its process quit) still waiting."""


@dataclass(frozen=True, slots=True)
class KindRule:
    recovered_path: str
    """`Recovery.path` when an attempt of this kind brings the thing back."""
    fallback: Mapping[Target, Kind]
    """The next kind to try, by target, when this one gives up or cannot be tried."""
    limit: Callable[[ClientConfig], int | None]
    """Attempts of this kind per recovery before giving up; None: never gives up (the
    client cannot do anything without a session)."""


KINDS: Mapping[Kind, KindRule] = {
    Kind.RESUME: KindRule(
        "resumed", {Target.CALL: Kind.RESEND, Target.STANDALONE: Kind.REOPEN}, lambda c: c.max_attempts
    ),
    Kind.RESEND: KindRule("retried", {}, lambda c: c.max_attempts),
    Kind.REOPEN: KindRule("reopened", {}, lambda c: c.max_attempts),
    Kind.REINITIALIZE: KindRule("reinitialized", {}, lambda c: None),
    Kind.DELETE: KindRule("deleted", {}, lambda c: c.max_delete_attempts - 1),
}


@dataclass(eq=False, slots=True)
class Loss:
    """One recovery in progress, from its first loss to its end."""

    target: Target
    name: str
    """Which one of its target: the operation key of a call, else ""."""
    subject: str
    """The stream first lost (`Recovery.stream_key`); "" when there is none."""
    operation_key: str | None
    kind: Kind
    first_cause: str
    lost_at: float
    cause: str = ""
    """Why the next attempt is needed (the latest failure)."""
    at: float | None = None
    """When the next attempt is due; None while none is planned (one in flight, or parked)."""
    advised: float | None = None
    planned: float = 0.0
    tries: dict[Kind, int] = field(default_factory=dict)
    """Attempts made, per kind."""
    attempts: int = 0
    """Attempts made, all kinds."""
    reinitialized: bool = False

    def tried(self, kind: Kind) -> int:
        return self.tries.get(kind, 0)


@dataclass(frozen=True, slots=True)
class Handler:
    """What one kind does; the rest of the steps are the reconnector's."""

    ready: Callable[[Loss, float], bool]
    """Is the attempt still wanted and possible now? If not, the handler itself parks
    the loss (`at = None`) or moves it on (falls back, ends it)."""
    attempt: Callable[[Loss, float], SendRequest]
    exhausted: Callable[[Loss, float], None]
    """The kind's attempts are used up: fall back (`Reconnector.fall_back`) or end."""


class Reconnector:
    """The steps of every kind. What each kind does is a `Handler` of the part that owns
    what it reconnects; the parts sit above this module, so they are not imported here:
    `handlers` makes the table of them (the core's `reconnect_handlers`)."""

    __slots__ = ("_handlers", "_losses", "_make_handlers", "budget", "config", "rng", "state")

    def __init__(
        self,
        state: ClientState,
        config: ClientConfig,
        *,
        budget: ReconnectBudget,
        rng: RandomSource,
        handlers: Callable[[], dict[Kind, Handler]],
    ) -> None:
        self.state = state
        self.config = config
        self.budget = budget
        self.rng = rng
        self._make_handlers = handlers
        self._losses: dict[tuple[Target, str], Loss] = {}
        self._handlers: dict[Kind, Handler] | None = None

    @property
    def handlers(self) -> dict[Kind, Handler]:
        """Each kind's handler, which lives with what it reconnects. Made on first use:
        five handlers of bound methods, ~1.5 KiB that a client which never loses anything
        does not need (a Locust worker holds thousands of those)."""
        if self._handlers is None:
            self._handlers = self._make_handlers()
        return self._handlers

    def get(self, target: Target, name: str = "") -> Loss | None:
        return self._losses.get((target, name))

    def open(
        self,
        target: Target,
        name: str,
        now: float,
        cause: str,
        *,
        kind: Kind,
        subject: str = "",
        operation_key: str | None = None,
        lost_at: float | None = None,
    ) -> Loss:
        """The loss of (target, name), created at its first loss if there is none."""
        loss = self._losses.get((target, name))
        if loss is None:
            loss = Loss(
                target, name, subject, operation_key, kind, cause, now if lost_at is None else lost_at
            )
            self._losses[(target, name)] = loss
        return loss

    # ------------------------------------------------------------------ lose, plan, give up

    def lost(
        self,
        target: Target,
        name: str,
        now: float,
        cause: str,
        *,
        kind: Kind,
        subject: str = "",
        operation_key: str | None = None,
        retry_ms: int | None = None,
        retry_after: float | None = None,
        immediate: bool = False,
    ) -> Loss:
        """A loss (or another failure of the recovery in progress): plan the next attempt
        of `kind`, or give up when its attempts are used up."""
        loss = self.open(target, name, now, cause, kind=kind, subject=subject, operation_key=operation_key)
        loss.kind, loss.cause, loss.at = kind, cause, None
        tried = loss.tried(kind)
        limit = KINDS[kind].limit(self.config)
        if limit is not None and tried >= limit:
            self.handlers[kind].exhausted(loss, now)
            return loss
        if immediate:
            loss.at, loss.advised, loss.planned = now, None, 0.0
        else:
            plan = plan_reconnect(
                now,
                tried,
                self.config.backoff,
                self.rng,
                retry_ms=retry_ms,
                retry_after=retry_after,
            )
            loss.at, loss.advised, loss.planned = plan.at, plan.advised_delay, plan.delay
        return loss

    def fall_back(self, loss: Loss, now: float, cause: str, *, after: Kind) -> bool:
        """Move on to the kind the table names after `after` (False if there is none)."""
        nxt = KINDS[after].fallback.get(loss.target)
        if nxt is None:
            return False
        self.lost(loss.target, loss.name, now, cause, kind=nxt)
        return True

    def park(self, loss: Loss, kind: Kind, cause: str) -> None:
        """Plan nothing: something else will bring it back (then `recovered` ends it as
        `kind` would have), e.g. the next handshake opens a new standalone stream."""
        loss.kind, loss.cause, loss.at = kind, cause, None

    # ------------------------------------------------------------------ budget and attempt

    def next_wakeup(self) -> float | None:
        if not self._losses:
            return None
        return min((loss.at for loss in self._losses.values() if loss.at is not None), default=None)

    def tick(self, now: float) -> None:
        for key, loss in list(self._losses.items()):
            if loss.at is not None and now >= loss.at and self._losses.get(key) is loss:
                self.attempt(loss, now)

    def attempt(self, loss: Loss, now: float) -> None:
        """Make the planned attempt now, if the kind still wants it and the budget allows."""
        handler = self.handlers[loss.kind]
        if not handler.ready(loss, now):
            return
        budget = self.budget
        if not budget.try_acquire(now):
            # Wait for the next token, with a little jitter so that everything the budget
            # held back does not fire at the same instant.
            loss.at = budget.next_available(now) + self.rng.random() * 0.05
            return
        loss.at = None
        kind = loss.kind
        send = handler.attempt(loss, now)
        self.state.fx.records.append(
            ReconnectAttempt(
                self.config.client_id,
                str(kind),
                loss.subject or None,
                loss.cause,
                loss.advised,
                loss.planned,
                loss.lost_at,
                now,
                now - loss.lost_at,
                loss.tried(kind),
                send.conn_id,
                self.state.generation,
            )
        )
        loss.tries[kind] = loss.tried(kind) + 1
        loss.attempts += 1

    # ------------------------------------------------------------------ the end of a recovery

    def recovered(self, loss: Loss, now: float) -> None:
        self._end(loss, now, KINDS[loss.kind].recovered_path)

    def end(self, loss: Loss, path: EndPath) -> None:
        """The recovery ends without the thing coming back (recovered_at NULL)."""
        self._end(loss, None, str(path))

    def end_all(self, path: EndPath) -> None:
        for loss in list(self._losses.values()):
            self.end(loss, path)

    def session_reestablished(self) -> None:
        """A new handshake succeeded after a loss: every recovery in progress went through it."""
        for loss in self._losses.values():
            loss.reinitialized = True

    def _end(self, loss: Loss, recovered_at: float | None, path: str) -> None:
        """The only place a Recovery row is built."""
        if self._losses.get((loss.target, loss.name)) is not loss:
            return  # ended already
        del self._losses[(loss.target, loss.name)]
        if loss.target not in RECOVERY_TARGETS:
            return
        self.state.fx.records.append(
            Recovery(
                self.config.client_id,
                loss.subject,
                loss.operation_key,
                loss.first_cause,
                loss.lost_at,
                recovered_at,
                path,
                loss.attempts,
                loss.reinitialized,
            )
        )
