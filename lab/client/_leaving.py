"""Leaving (DELETE) and stopping: nothing the client was waiting for stays open.

- `leave`: every unfinished call ends UNKNOWN (reason `left`), every recovery in progress
  ends never-recovered (path `left`), every stream is closed, then DELETE. 405 means
  "termination unsupported", never a deletion receipt; a lost answer is a reconnect kind
  (the DELETE again, within `max_delete_attempts`); a 404 says the session is gone.
- `close_all`: the same for a client whose process quits (reason and path
  `client_stopped`), and every connection still open is ended with its exchange record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.client._commands import LeaveFinished, LeaveReceipt, Purpose, SendRequest
from lab.client._model import Conn
from lab.client._reconnector import EndPath, Handler, Kind, Loss, Target
from lab.client._states import State, Trigger

_WAITED_FOR = frozenset({Purpose.CALL, Purpose.RESUME})

if TYPE_CHECKING:
    from lab.client._core import ClientCore


class Leaving:
    def __init__(self, core: ClientCore) -> None:
        self.core = core

    def handler(self) -> Handler:
        return Handler(self._ready, self._attempt, self._exhausted)

    def leave(self, now: float) -> None:
        c = self.core
        c.leave_requested = True
        self._stop_waiting(now, "left", EndPath.LEFT)
        session_loss = c.reconnector.get(Target.SESSION)
        if session_loss is not None:
            c.reconnector.end(session_loss, EndPath.LEFT)  # no new handshake for a client that goes
        if c.session.state is State.SESSION_ACTIVE and c.session_id is not None:
            c.session.process(Trigger.DELETE_SENT)
            c.http.open(Purpose.DELETE, "DELETE", now)
        elif c.session.state is State.SESSION_ACTIVE:
            c.fx.notices.append(LeaveFinished(LeaveReceipt.NO_SESSION, now))

    def close_all(self, now: float, reason: str) -> None:
        c = self.core
        c.stopped = True
        self._stop_waiting(now, reason, EndPath.CLIENT_STOPPED)
        c.reconnector.end_all(EndPath.CLIENT_STOPPED)
        for conn in list(c.http.live.values()):
            c.http.abort(conn, now, reason)

    def _stop_waiting(self, now: float, reason: str, path: EndPath) -> None:
        c = self.core
        c.calling.give_up_waiting(now, reason, path)
        standalone = c.reconnector.get(Target.STANDALONE)
        if standalone is not None:
            c.reconnector.end(standalone, path)
        c.streaming.abandon_all(now, reason)
        # Calls still waiting for their answer head carry no stream yet: their outcome is
        # decided, so close them too (a late answer must not be taken into the inbox).
        for conn in list(c.http.live.values()):
            if conn.purpose in _WAITED_FOR:
                c.http.abort(conn, now, reason)

    # ------------------------------------------------------------------ DELETE's answer

    def delete_head(self, conn: Conn, now: float) -> None:
        c = self.core
        status = conn.status or 0
        c.http.abort(conn, now, "")
        if 200 <= status < 300:
            self.done(LeaveReceipt.DELETED, now, "terminated")
        elif status == 405:
            c.session.process(Trigger.DELETE_REFUSED)
            self._forget_loss()
            c.handshake.session_event("termination_unsupported", now, version=c.protocol_version)
            c.fx.notices.append(LeaveFinished(LeaveReceipt.TERMINATION_UNSUPPORTED, now))
        else:
            self.unanswered(now, f"http_{status}", conn.retry_after)

    def unanswered(self, now: float, cause: str, retry_after: float | None = None) -> None:
        c = self.core
        if c.session.state is not State.DELETE_REQUESTED or c.stopped:
            return
        c.reconnector.lost(Target.DELETE, "", now, cause, kind=Kind.DELETE, retry_after=retry_after)

    def done(self, receipt: LeaveReceipt, now: float, what: str) -> None:
        c = self.core
        if c.session.state is State.DELETE_REQUESTED:
            c.session.process(
                Trigger.DELETE_CONFIRMED if receipt is LeaveReceipt.DELETED else Trigger.SESSION_NOT_FOUND
            )
        self._forget_loss()
        c.handshake.session_event(what, now, version=c.protocol_version)
        c.fx.notices.append(LeaveFinished(receipt, now))

    def _forget_loss(self) -> None:
        loss = self.core.reconnector.get(Target.DELETE)
        if loss is not None:
            self.core.reconnector.end(loss, EndPath.LEFT)  # no Recovery row for a DELETE

    # ------------------------------------------------------------------ DELETE again (a reconnect kind)

    def _ready(self, loss: Loss, now: float) -> bool:
        if self.core.session.state is not State.DELETE_REQUESTED:
            loss.at = None
            return False
        return True

    def _attempt(self, loss: Loss, now: float) -> SendRequest:
        return self.core.http.open(Purpose.DELETE, "DELETE", now)

    def _exhausted(self, loss: Loss, now: float) -> None:
        c = self.core
        c.session.process(Trigger.DELETE_ABANDONED)
        c.reconnector.end(loss, EndPath.ABANDONED)
        c.handshake.session_event("delete_unconfirmed", now, version=c.protocol_version)
        c.fx.notices.append(LeaveFinished(LeaveReceipt.UNCONFIRMED, now))
