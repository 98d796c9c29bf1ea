"""Leaving (DELETE) and stopping: nothing the client was waiting for stays open.

- `leave`: every unfinished call ends UNKNOWN (reason `left`), every recovery in progress
  ends never-recovered (path `left`), every stream is closed, then DELETE. 405 means
  "termination unsupported", never a deletion receipt; a lost answer is a reconnect kind
  (the DELETE again, within `max_delete_attempts`); a 404 says the session is gone.
- `close_all`: the same for a client whose process quits (reason and path
  `client_stopped`), and every connection still open is ended with its exchange record.
"""

from __future__ import annotations

from lab.client._calls import Calling
from lab.client._client_state import ClientState
from lab.client._commands import LeaveFinished, LeaveReceipt, Purpose, SendRequest
from lab.client._http import Connections
from lab.client._model import Conn
from lab.client._reconnector import EndPath, Handler, Kind, Loss, Reconnector, Target
from lab.client._states import State, Trigger
from lab.client._stream_table import StreamTable

_WAITED_FOR = frozenset({Purpose.CALL, Purpose.RESUME})


class Leaving:
    """The end of the session, asked for (DELETE) or not (the client stops). It ends the
    calls (`Calling`) and stops reading the streams (`StreamTable`); what comes on them
    no longer matters, so it needs nothing of `Streaming`."""

    __slots__ = ("calling", "http", "reconnector", "state", "table")

    def __init__(
        self,
        state: ClientState,
        *,
        http: Connections,
        reconnector: Reconnector,
        calling: Calling,
        table: StreamTable,
    ) -> None:
        self.state = state
        self.http = http
        self.reconnector = reconnector
        self.calling = calling
        self.table = table

    def handler(self) -> Handler:
        return Handler(self._ready, self._attempt, self._exhausted)

    def leave(self, now: float) -> None:
        c = self.state
        c.leave_requested = True
        self._stop_waiting(now, "left", EndPath.LEFT)
        session_loss = self.reconnector.get(Target.SESSION)
        if session_loss is not None:
            self.reconnector.end(session_loss, EndPath.LEFT)  # no new handshake for a client that goes
        if c.session.state is State.SESSION_ACTIVE and c.session_id is not None:
            c.session.process(Trigger.DELETE_SENT)
            self.http.open(Purpose.DELETE, "DELETE", now)
        elif c.session.state is State.SESSION_ACTIVE:
            c.fx.notices.append(LeaveFinished(LeaveReceipt.NO_SESSION, now))

    def close_all(self, now: float, reason: str) -> None:
        c = self.state
        c.stopped = True
        self._stop_waiting(now, reason, EndPath.CLIENT_STOPPED)
        self.reconnector.end_all(EndPath.CLIENT_STOPPED)
        for conn in list(self.http.live.values()):
            self.http.abort(conn, now, reason)

    def _stop_waiting(self, now: float, reason: str, path: EndPath) -> None:
        self.calling.give_up_waiting(now, reason, path)
        standalone = self.reconnector.get(Target.STANDALONE)
        if standalone is not None:
            self.reconnector.end(standalone, path)
        self.table.abandon_all(now, reason)
        # Calls still waiting for their answer head carry no stream yet: their outcome is
        # decided, so close them too (a late answer must not be taken into the inbox).
        for conn in list(self.http.live.values()):
            if conn.purpose in _WAITED_FOR:
                self.http.abort(conn, now, reason)

    # ------------------------------------------------------------------ DELETE's answer

    def delete_head(self, conn: Conn, now: float) -> None:
        c = self.state
        status = conn.status or 0
        self.http.abort(conn, now, "")
        if 200 <= status < 300:
            self.done(LeaveReceipt.DELETED, now, "terminated")
        elif status == 405:
            c.session.process(Trigger.DELETE_REFUSED)
            self._forget_loss()
            c.session_event("termination_unsupported", now, version=c.protocol_version)
            c.fx.notices.append(LeaveFinished(LeaveReceipt.TERMINATION_UNSUPPORTED, now))
        else:
            self.unanswered(now, f"http_{status}", conn.retry_after)

    def unanswered(self, now: float, cause: str, retry_after: float | None = None) -> None:
        c = self.state
        if c.session.state is not State.DELETE_REQUESTED or c.stopped:
            return
        self.reconnector.lost(Target.DELETE, "", now, cause, kind=Kind.DELETE, retry_after=retry_after)

    def done(self, receipt: LeaveReceipt, now: float, what: str) -> None:
        c = self.state
        if c.session.state is State.DELETE_REQUESTED:
            c.session.process(
                Trigger.DELETE_CONFIRMED if receipt is LeaveReceipt.DELETED else Trigger.SESSION_NOT_FOUND
            )
        self._forget_loss()
        c.session_event(what, now, version=c.protocol_version)
        c.fx.notices.append(LeaveFinished(receipt, now))

    def _forget_loss(self) -> None:
        loss = self.reconnector.get(Target.DELETE)
        if loss is not None:
            self.reconnector.end(loss, EndPath.LEFT)  # no Recovery row for a DELETE

    # ------------------------------------------------------------------ DELETE again (a reconnect kind)

    def _ready(self, loss: Loss, now: float) -> bool:
        if self.state.session.state is not State.DELETE_REQUESTED:
            loss.at = None
            return False
        return True

    def _attempt(self, loss: Loss, now: float) -> SendRequest:
        return self.http.open(Purpose.DELETE, "DELETE", now)

    def _exhausted(self, loss: Loss, now: float) -> None:
        c = self.state
        c.session.process(Trigger.DELETE_ABANDONED)
        self.reconnector.end(loss, EndPath.ABANDONED)
        c.session_event("delete_unconfirmed", now, version=c.protocol_version)
        c.fx.notices.append(LeaveFinished(LeaveReceipt.UNCONFIRMED, now))
