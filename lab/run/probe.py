"""The rollout probe: a few MCP sessions that come back to their old cursors.

The load's clients keep their sessions busy, so none of them comes back with a cursor
of a stream opened before a rollback after its session expired — yet that is what the
rollout's last promise is about. The probe plays that client, through the whole chain
(so the tap and the server ledger record it like any other), in three moves:

    open()            before the rollback: sessions (resumable ones) each start a long
                      `ticker` call, read a few events and go away mid-stream: the
                      stream goes on, and its last event ID is the *old cursor*
    keep_alive()      while it waits for the rollback and its return: a `ping` in each
                      session, so that a busy box, slow to carry the moves, cannot let
                      a session expire before it comes back (its TTL counts idle time)
    come_back()       after the rollback, within the session TTL: resume each old cursor
                      (the documented rollback answers 200 and replays), and open a new
                      stream in the old session (it must carry no event ID)
    come_back_late()  once the sessions have been idle past their TTL: resume each old
                      cursor again (the documented rejection: 404, the session is gone)

It judges nothing: `lab.checker.rules.rollout` reads what the wire shows. Its own account
of each move goes to `phases.jsonl` (type `probe`). Requests carry `x-lab-conn:
probe-<n>:<k>`; no raw session ID is ever written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from lab.wire import jsonrpc
from lab.wire.extensions import LAB_CONN_HEADER
from lab.wire.revisions import LAST_EVENT_ID_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from lab.wire.sse import SseDecoder, SseEvent

READ_TIMEOUT = 5.0
TICKER = {"count": 600, "interval_ms": 100}
"""Long enough to outlive the probe's moves (a minute of progress)."""


@dataclass
class ProbeSession:
    name: str
    sid: str
    version: str
    cursor: str | None = None
    conns: int = 0
    next_id: int = 1

    def conn(self) -> str:
        self.conns += 1
        return f"{self.name}:{self.conns}"


@dataclass
class Probe:
    url: str
    protocol_version: str
    origin: str | None = None
    token: str | None = None
    log: Callable[[dict[str, Any]], None] = lambda record: None
    sessions: list[ProbeSession] = field(default_factory=list)
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=httpx.Timeout(READ_TIMEOUT)))

    def close(self) -> None:
        self.client.close()

    def _headers(self, s: ProbeSession | None, conn: str, extra: dict[str, str]) -> dict[str, str]:
        h = {LAB_CONN_HEADER: conn, **extra}
        if self.origin:
            h["origin"] = self.origin
        if self.token:
            h["authorization"] = f"Bearer {self.token}"
        if s is not None:
            h[SESSION_HEADER] = s.sid
            h[PROTOCOL_VERSION_HEADER] = s.version
        return h

    @contextmanager
    def _stream(
        self, method: str, s: ProbeSession | None, conn: str, body: object | None, extra: dict[str, str]
    ) -> Iterator[tuple[httpx.Response, Iterator[SseEvent]]]:
        accept = "application/json, text/event-stream" if method == "POST" else "text/event-stream"
        headers = self._headers(s, conn, {"accept": accept, **extra})
        if body is not None:
            headers["content-type"] = "application/json"
        content = None if body is None else json.dumps(body)
        with self.client.stream(method, self.url, content=content, headers=headers) as r:

            def events() -> Iterator[SseEvent]:
                dec = SseDecoder()
                for chunk in r.iter_raw():
                    yield from dec.feed(chunk)

            yield r, events()

    def _read(self, events: Iterator[SseEvent], want: int, with_id: bool) -> list[SseEvent]:
        """Up to `want` message events (with an ID if `with_id`), within READ_TIMEOUT."""
        out: list[SseEvent] = []
        deadline = time.monotonic() + READ_TIMEOUT
        try:
            for ev in events:
                if ev.is_message and (ev.id is not None or not with_id):
                    out.append(ev)
                if len(out) >= want or time.monotonic() > deadline:
                    break
        except httpx.HTTPError:
            pass
        return out

    def _initialize(self, name: str) -> ProbeSession | None:
        body = jsonrpc.request(
            0,
            "initialize",
            {
                "protocolVersion": self.protocol_version,
                "capabilities": {},
                "clientInfo": {"name": "lab-rollout-probe", "version": "1"},
            },
        )
        with self._stream("POST", None, f"{name}:0", body, {}) as (r, events):
            sid = r.headers.get(SESSION_HEADER)
            if r.status_code != 200 or not sid:
                self.log({"type": "probe", "t": time.time(), "action": "open", "status": r.status_code})
                return None
            if r.headers.get("content-type", "").startswith("application/json"):
                result = json.loads(r.read())
            else:
                result = next((json.loads(e.data) for e in events if e.is_message), {})
        s = ProbeSession(
            name, sid, str(result.get("result", {}).get("protocolVersion", self.protocol_version))
        )
        note = jsonrpc.notification("notifications/initialized")
        self.client.post(
            self.url,
            content=json.dumps(note),
            headers=self._headers(
                s,
                s.conn(),
                {"content-type": "application/json", "accept": "application/json, text/event-stream"},
            ),
        )
        return s

    def open(self, count: int, tries: int = 20, within: float = 10.0, before: float | None = None) -> None:
        """`count` sessions whose ticker stream carries event IDs, each left mid-stream
        (at most `tries` sessions, for at most `within` seconds, and none started after the
        epoch time `before`: a session opened after the rollback has no old cursor, and
        trying on would delay the probe's coming back past its sessions' TTL)."""
        deadline = time.monotonic() + within
        for n in range(tries):
            if len(self.sessions) >= count or time.monotonic() > deadline:
                return
            if before is not None and time.time() >= before:
                return
            try:
                s = self._initialize(f"probe-{n}")
                if s is None:
                    continue
                call = jsonrpc.request(
                    s.next_id,
                    "tools/call",
                    {"name": "ticker", "arguments": TICKER, "_meta": {"progressToken": 1}},
                )
                s.next_id += 1
                conn = s.conn()
                with self._stream("POST", s, conn, call, {}) as (r, events):
                    seen = self._read(events, 3, with_id=False) if r.status_code == 200 else []
                ids = [e.id for e in seen if e.id]
                s.cursor = ids[-1] if ids else None
                self.log(
                    {
                        "type": "probe",
                        "t": time.time(),
                        "action": "open",
                        "conn": conn,
                        "status": r.status_code,
                        "resumable": s.cursor is not None,
                    }
                )
                if s.cursor is not None:
                    self.sessions.append(s)
            except httpx.HTTPError as e:
                self.log({"type": "probe", "t": time.time(), "action": "open", "error": type(e).__name__})

    def _resume(self, s: ProbeSession, action: str) -> None:
        assert s.cursor is not None
        conn = s.conn()
        try:
            with self._stream("GET", s, conn, None, {LAST_EVENT_ID_HEADER: s.cursor}) as (r, events):
                got = self._read(events, 1, with_id=False) if r.status_code == 200 else []
            self.log(
                {
                    "type": "probe",
                    "t": time.time(),
                    "action": action,
                    "conn": conn,
                    "status": r.status_code,
                    "replayed": len(got),
                }
            )
        except httpx.HTTPError as e:
            self.log(
                {"type": "probe", "t": time.time(), "action": action, "conn": conn, "error": type(e).__name__}
            )

    def keep_alive(self) -> None:
        """A `ping` in each old session: the server counts a session's TTL from its last
        request, and the cursors must come back to a session that still lives."""
        for s in self.sessions:
            conn = s.conn()
            body = jsonrpc.request(s.next_id, "ping", {})
            s.next_id += 1
            record: dict[str, Any] = {"type": "probe", "action": "keep_alive", "conn": conn}
            try:
                with self._stream("POST", s, conn, body, {}) as (r, _events):
                    r.read()
                record["status"] = r.status_code
            except httpx.HTTPError as e:
                record["error"] = type(e).__name__
            self.log({**record, "t": time.time()})

    def come_back(self) -> None:
        """Resume each old cursor, and open a new stream in each old session."""
        for s in self.sessions:
            self._resume(s, "resume_old_cursor")
            conn = s.conn()
            call = jsonrpc.request(
                s.next_id, "tools/call", {"name": "echo", "arguments": {"text": "after rollback"}}
            )
            s.next_id += 1
            try:
                with self._stream("POST", s, conn, call, {}) as (r, events):
                    got = self._read(events, 1, with_id=False) if r.status_code == 200 else []
                self.log(
                    {
                        "type": "probe",
                        "t": time.time(),
                        "action": "new_stream",
                        "conn": conn,
                        "status": r.status_code,
                        "with_event_id": any(e.id for e in got),
                    }
                )
            except httpx.HTTPError as e:
                self.log(
                    {"type": "probe", "t": time.time(), "action": "new_stream", "error": type(e).__name__}
                )

    def come_back_late(self) -> None:
        """Resume each old cursor once its session has been idle past its TTL."""
        for s in self.sessions:
            self._resume(s, "resume_expired_cursor")
