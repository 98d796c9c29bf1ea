"""Build run folders by hand, exactly per docs/ledgers.md, for the checker's tests.

`Sim` plays a small run: clients initialize, open standalone GET streams, call tools on
POST streams, lose and resume streams, get 404s and re-initialize; the server mints real
`e1` event IDs (`EventIdCodec`). Every step writes what each part would write — the
client ledger (inbox/outbox via `lab.inbox.connect`, the record tables of
`lab.wire.client_ledger`), the server ledger, the proxy tap and the nemesis log — so the
ledgers agree with each other unless a test makes them disagree on purpose (a fault,
a server bug, a client bug). `Sim.write(run_dir)` writes the folder.

`clean_run()` is a run in which every gate passes with its evidence present; tests
add one violation to it, or take evidence away.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lab.inbox import connect
from lab.wire.client_ledger import RECORD_TYPES
from lab.wire.event_ids import EventIdCodec, message_digest, post_stream_id, session_tag
from lab.wire.redact import Redactor

T0 = 1_700_000_000.0
CODEC = EventIdCodec(b"k" * 32)
REDACT = Redactor(b"r" * 32)
ALLOWED_ORIGIN = "http://127.0.0.1"

BUDGETS: dict[str, float | int] = {
    "reconnect_qps": 5.0,
    "resume_p99_s": 5.0,
    "cross_stream_max": 0,
    "duplicate_dispatch_max": 0,
    "missing_rehandshake_max": 0,
    "origin_reject_rate": 1.0,
    "min_events": 10,
    "min_recoveries": 1,
    "min_404": 1,
    "min_illegal_origin": 1,
}

SERVER_DDL = """
CREATE TABLE sessions (session TEXT, principal TEXT, auth_subject TEXT, handshake_receipt TEXT,
    protocol_version TEXT, origin_policy TEXT, created_at REAL, expires_at REAL, generation INTEGER,
    resumable INTEGER, shadow INTEGER, ended_at REAL, end_reason TEXT);
CREATE TABLE streams (session TEXT, stream_id TEXT, opened_by TEXT, request_id TEXT, payload_digest TEXT,
    conn TEXT, opened_at REAL, last_sent_event_id TEXT, last_acked_event_id TEXT, retry_ms INTEGER,
    closed_at REAL, close_reason TEXT);
CREATE TABLE events_sent (session TEXT, stream_id TEXT, event_id TEXT, sequence INTEGER, digest TEXT,
    kind TEXT, jsonrpc_id TEXT, sent_at REAL, replay INTEGER, conn TEXT);
CREATE TABLE dispatches (idempotency_key TEXT, session TEXT, auth_subject TEXT, request_id TEXT, tool TEXT,
    effect TEXT, at REAL, arguments_digest TEXT);
CREATE TABLE requests (at REAL, method TEXT, conn TEXT, session TEXT, status INTEGER, reason TEXT,
    origin TEXT, origin_allowed INTEGER, protocol_version TEXT, last_event_id TEXT, cursor_verdict TEXT);
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT);
INSERT INTO meta VALUES ('schema', 'mcpServerLedger.v1');
"""


@dataclass
class Stream:
    client: str
    generation: int
    key: str
    stream_id: str
    session: str
    tag: str
    request_id: int | None
    flow: str = ""
    conn: str = ""
    conn_id: int = 0
    sequence: int = 0
    index: int = 0
    """Index of the next event on the current flow."""


@dataclass
class Event:
    event_id: str
    digest: str
    data: str
    flow: str
    index: int
    stream: Stream


@dataclass
class ClientState:
    client_id: str
    generation: int = 0
    session: str = ""
    raw_session: str = ""
    next_conn: int = 1
    next_get: int = 1
    sessions: dict[int, str] = field(default_factory=dict)


@dataclass
class Sim:
    t: float = T0
    budgets: dict[str, float | int] = field(default_factory=lambda: dict(BUDGETS))
    complete: bool = True
    tap: list[dict[str, Any]] = field(default_factory=list)
    nemesis: list[dict[str, Any]] = field(default_factory=list)
    client_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    server_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    clients: dict[str, ClientState] = field(default_factory=dict)
    fault_windows: list[dict[str, Any]] = field(default_factory=list)
    flows: int = 0
    messages: int = 0
    opaque_ids: bool = False
    """Event IDs like a server that is not ours: `ev<n>`, no stream in them (the tap's
    `stream_id` is then null)."""
    per_session_ids: bool = False
    """With `opaque_ids`: numbered per session (`1`, `2`, … in every session), as IDs need
    only be unique within a session."""
    per_stream_ids: bool = False
    """With `opaque_ids`: numbered per stream (`0`, `1`, … on every stream): a server bug,
    as IDs must be unique across a session's streams."""
    tap_kinds: bool = False
    """The tap's `sent` records also say each message's `kind` and `jsonrpc_id`."""
    events: int = 0
    session_events: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ plumbing

    def tick(self, dt: float = 0.01) -> float:
        self.t += dt
        return self.t

    def client_row(self, table: str, **row: Any) -> None:
        self.client_rows.setdefault(table, []).append(row)

    def server_row(self, table: str, **row: Any) -> None:
        self.server_rows.setdefault(table, []).append(row)

    def _conn(self, client: str) -> tuple[str, int]:
        c = self.clients[client]
        n = c.next_conn
        c.next_conn += 1
        return f"{client}:{n}", n

    def _flow(self) -> str:
        self.flows += 1
        return f"f{self.flows}"

    def flow_record(
        self, flow: str, conn: str | None, method: str, session: str | None, **extra: Any
    ) -> None:
        record: dict[str, Any] = {
            "type": "flow",
            "flow": flow,
            "t": self.t,
            "conn": conn,
            "method": method,
            "path": "/mcp",
            "session": session,
            "jsonrpc_id": None,
            "jsonrpc_method": None,
            "idempotency_key": None,
            "origin_in": ALLOWED_ORIGIN,
            "origin_out": ALLOWED_ORIGIN,
            "origin_allowed_out": True,
            "last_event_id_in": None,
            "last_event_id_out": None,
            "status": 200,
            "answered_by": "server",
            "faults": [],
        }
        record.update(extra)
        self.tap.append(record)

    def exchange(
        self,
        client: str,
        conn_id: int,
        purpose: str,
        method: str,
        stream_key: str | None,
        status: int | None,
        *,
        carried: bool = True,
        started_at: float | None = None,
        ended_at: float | None = None,
        last_event_id: str | None = None,
        generation: int | None = None,
        session: str | None = None,
    ) -> None:
        c = self.clients[client]
        self.client_row(
            "http_exchanges",
            client_id=client,
            conn_id=conn_id,
            purpose=purpose,
            method=method,
            stream_key=stream_key,
            status=status,
            session=(session or c.session) if carried else None,
            session_generation=c.generation if generation is None else generation,
            carried_session=int(carried),
            started_at=self.t if started_at is None else started_at,
            ended_at=self.t + 0.005 if ended_at is None else ended_at,
            error="",
            last_event_id=last_event_id,
        )

    # ------------------------------------------------------------------ sessions

    def initialize(self, client: str) -> None:
        c = self.clients.setdefault(client, ClientState(client))
        c.generation += 1
        c.raw_session = f"raw-session-{client}-{c.generation}"
        c.session = REDACT.session(c.raw_session) or ""
        c.sessions[c.generation] = c.session
        conn, n = self._conn(client)
        self.tick()
        self.flow_record(self._flow(), conn, "POST", None, jsonrpc_method="initialize", session_out=c.session)
        self.exchange(client, n, "initialize", "POST", None, 200, carried=False)
        self.server_row(
            "requests",
            at=self.t,
            method="POST",
            conn=conn,
            session=None,
            status=200,
            reason=None,
            origin=ALLOWED_ORIGIN,
            origin_allowed=1,
            protocol_version=None,
            last_event_id=None,
            cursor_verdict=None,
        )
        self.server_row(
            "sessions",
            session=c.session,
            principal=client,
            auth_subject=f"subject-{client}",
            handshake_receipt="0" * 64,
            protocol_version="2025-11-25",
            origin_policy=ALLOWED_ORIGIN,
            created_at=self.t,
            expires_at=self.t + 600,
            generation=0,
            resumable=1,
            shadow=0,
            ended_at=None,
            end_reason=None,
        )
        self.client_row(
            "sessions",
            client_id=client,
            session=c.session,
            session_generation=c.generation,
            what="established",
            protocol_version="2025-11-25",
            at=self.t,
        )

    def request(
        self,
        client: str,
        purpose: str,
        method: str,
        status: int,
        *,
        stream_key: str | None = None,
        carried: bool = True,
        origin: str = ALLOWED_ORIGIN,
        origin_out: str | None = None,
        faults: list[dict[str, Any]] | None = None,
        started_at: float | None = None,
        generation: int | None = None,
    ) -> str:
        """A request without events (a notification, a refused call, ...); returns its conn.
        `generation`: the session generation it carries (default: the current one)."""
        c = self.clients[client]
        session = c.session if generation is None else c.sessions[generation]
        conn, n = self._conn(client)
        self.tick()
        out = origin if origin_out is None else origin_out
        allowed = out == ALLOWED_ORIGIN
        self.flow_record(
            self._flow(),
            conn,
            method,
            session if carried else None,
            origin_in=origin,
            origin_out=out,
            origin_allowed_out=allowed,
            status=status,
            faults=faults or [],
        )
        self.exchange(
            client,
            n,
            purpose,
            method,
            stream_key,
            status,
            carried=carried,
            started_at=started_at,
            generation=generation,
            session=session,
        )
        self.server_row(
            "requests",
            at=self.t,
            method=method,
            conn=conn,
            session=session if carried else None,
            status=status,
            reason=None if status < 400 else f"status_{status}",
            origin=out,
            origin_allowed=int(allowed),
            protocol_version="2025-11-25",
            last_event_id=None,
            cursor_verdict=None,
        )
        return conn

    # ------------------------------------------------------------------ streams

    def open_get(self, client: str) -> Stream:
        c = self.clients[client]
        n = c.next_get
        c.next_get += 1
        tag = session_tag(c.raw_session)
        st = Stream(client, c.generation, f"get:{n}", f"g{n}x{c.generation}", c.session, tag, None)
        self._open(st, "GET", "standalone")
        return st

    def call(self, client: str, request_id: int, *, idempotency_key: str | None = None) -> Stream:
        c = self.clients[client]
        tag = session_tag(c.raw_session)
        st = Stream(
            client,
            c.generation,
            f"post:{request_id}",
            post_stream_id(tag, request_id),
            c.session,
            tag,
            request_id,
        )
        self._open(st, "POST", "call", idempotency_key=idempotency_key)
        return st

    def json_call(self, client: str, request_id: int) -> None:
        """A tool call answered with `application/json`: no SSE event, no event ID; the
        client accepts the body with a synthetic ID `~<conn>.<n>`."""
        c = self.clients[client]
        conn, n = self._conn(client)
        self.tick()
        self.flow_record(
            self._flow(), conn, "POST", c.session, jsonrpc_id=request_id, jsonrpc_method="tools/call"
        )
        self.exchange(client, n, "call", "POST", f"post:{request_id}", 200)
        data = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"json": True}})
        t = self.tick(0.001)
        self.client_row(
            "inbox",
            client_id=client,
            session_generation=c.generation,
            stream_key=f"post:{request_id}",
            event_id=f"~{n}.1",
            message_digest=message_digest(data),
            sequence=None,
            server_stream_id=None,
            kind="response",
            jsonrpc_id=str(request_id),
            method=None,
            conn_id=n,
            accepted_at=t,
            data=data,
        )

    def _open(self, st: Stream, method: str, purpose: str, *, idempotency_key: str | None = None) -> None:
        st.conn, st.conn_id = self._conn(st.client)
        st.flow = self._flow()
        st.index = 0
        self.tick()
        self.flow_record(
            st.flow,
            st.conn,
            method,
            st.session,
            jsonrpc_id=st.request_id,
            jsonrpc_method="tools/call" if method == "POST" else None,
            idempotency_key=idempotency_key,
        )
        self.exchange(st.client, st.conn_id, purpose, method, st.key, 200)
        self.server_row(
            "streams",
            session=st.session,
            stream_id=st.stream_id,
            opened_by=method,
            request_id=None if st.request_id is None else str(st.request_id),
            payload_digest=None,
            conn=st.conn,
            opened_at=self.t,
            last_sent_event_id=None,
            last_acked_event_id=None,
            retry_ms=1000,
            closed_at=None,
            close_reason=None,
        )
        self.send(st, "", kind="priming")

    def send(
        self,
        st: Stream,
        data: str,
        *,
        kind: str = "notification",
        accept: bool = True,
        jsonrpc_id: str | None = None,
        minted_for: Stream | None = None,
    ) -> Event:
        """The server sends one event on the stream's current flow (unfaulted); the client
        accepts it under the stream's key unless `accept` is false. `minted_for` makes the
        server mint the ID of another stream: a server bug."""
        home = minted_for or st
        seq = home.sequence
        home.sequence += 1
        self.events += 1
        if self.opaque_ids and self.per_stream_ids:
            event_id = str(seq)
        elif self.opaque_ids and self.per_session_ids:
            n = self.session_events[st.session] = self.session_events.get(st.session, 0) + 1
            event_id = str(n)
        elif self.opaque_ids:
            event_id = f"ev{self.events}"
        else:
            event_id = CODEC.mint(home.tag, 0, home.stream_id, seq, data)
        ev = Event(event_id, message_digest(data), data, st.flow, st.index, home)
        self._sent(st, ev, kind=kind, sequence=seq, jsonrpc_id=jsonrpc_id)
        if accept:
            self.accept(st, ev, kind=kind, jsonrpc_id=jsonrpc_id)
        return ev

    def resend(self, st: Stream, ev: Event, *, accept: bool = True) -> Event:
        """The server sends an event it sent before (same ID, same data) on `st`'s
        current flow: a replay; on another stream than the event's, a server bug."""
        again = Event(ev.event_id, ev.digest, ev.data, st.flow, st.index, ev.stream)
        kind, rid = _kind_of(ev.data)
        self._sent(st, again, kind=kind, sequence=None, jsonrpc_id=rid, replay=1)
        if accept:
            self.accept(st, again, kind=kind, jsonrpc_id=rid)
        return again

    def _sent(
        self,
        st: Stream,
        ev: Event,
        *,
        kind: str,
        sequence: int | None,
        jsonrpc_id: str | None,
        replay: int = 0,
    ) -> None:
        event_id, digest, home = ev.event_id, ev.digest, ev.stream
        t = self.tick(0.001)
        index = st.index
        st.index += 1
        record: dict[str, Any] = {
            "type": "sent",
            "flow": st.flow,
            "t": t,
            "index": index,
            "event_id": event_id,
            "digest": digest,
            "has_data": bool(ev.data),
            "priming": kind == "priming",
            "stream_id": None if self.opaque_ids else home.stream_id,
            "session": st.session,
        }
        if self.tap_kinds:
            record |= {"kind": kind, "jsonrpc_id": jsonrpc_id}
        self.tap.append(record)
        self.tap.append(
            {
                "type": "forwarded",
                "flow": st.flow,
                "t": t,
                "index": index,
                "event_id": event_id,
                "digest": digest,
                "source": {"flow": st.flow, "index": index},
                "fault": None,
                "rule": None,
                "decision": None,
            }
        )
        self.server_row(
            "events_sent",
            session=st.session,
            stream_id=home.stream_id,
            event_id=event_id,
            sequence=sequence,
            digest=digest,
            kind=kind,
            jsonrpc_id=jsonrpc_id,
            sent_at=t,
            replay=replay,
            conn=st.conn,
        )

    def accept(
        self,
        st: Stream,
        ev: Event,
        *,
        kind: str,
        jsonrpc_id: str | None = None,
        dispatch_key: str | None = None,
    ) -> None:
        """The client accepts `ev` under `st`'s key (inbox receipt + outbox dispatch)."""
        t = self.tick(0.001)
        self.client_row(
            "inbox",
            client_id=st.client,
            session_generation=st.generation,
            stream_key=st.key,
            event_id=ev.event_id,
            message_digest=ev.digest,
            sequence=None,
            server_stream_id=None if self.opaque_ids else ev.stream.stream_id,
            kind=kind,
            jsonrpc_id=jsonrpc_id,
            method=None,
            conn_id=st.conn_id,
            accepted_at=t,
            data=ev.data,
        )
        if kind != "priming":
            key = dispatch_key or f"ev:{st.generation}:{st.key}:{ev.event_id}"
            self.client_row(
                "outbox",
                client_id=st.client,
                dispatch_key=key,
                session_generation=st.generation,
                stream_key=st.key,
                event_id=ev.event_id,
                message_digest=ev.digest,
                kind=kind,
                created_at=t,
            )

    def respond(self, st: Stream, *, accept: bool = True) -> Event:
        data = json.dumps({"jsonrpc": "2.0", "id": st.request_id, "result": {"ok": True, "stream": st.key}})
        return self.send(st, data, kind="response", accept=accept, jsonrpc_id=str(st.request_id))

    def notify(self, st: Stream, n: int) -> list[Event]:
        # Every message distinct (as progress notifications are): same data twice would be
        # a repeated message, which gate 2 counts per digest.
        out = []
        for _ in range(n):
            self.messages += 1
            params = {"progress": self.messages, "k": st.key}
            out.append(
                self.send(
                    st, json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})
                )
            )
        return out

    def cut_and_resume(self, st: Stream, *, after: float = 0.2, advised: float | None = 0.1) -> float:
        """The stream's connection drops; the client resumes with GET + Last-Event-ID of its
        last event. Writes the reconnect and the recovery (recovered at the next event)."""
        lost_at = self.tick()
        last = self._last_event_id(st)
        sent_at = self.tick(after)
        st.conn, st.conn_id = self._conn(st.client)
        st.flow = self._flow()
        st.index = 0
        self.flow_record(st.flow, st.conn, "GET", st.session, last_event_id_in=last, last_event_id_out=last)
        self.exchange(st.client, st.conn_id, "resume", "GET", st.key, 200, last_event_id=last)
        self.reconnect_row(st, "connection_lost", advised, after, lost_at, sent_at, attempt=0)
        return lost_at

    def reconnect_row(
        self,
        st: Stream,
        cause: str,
        advised: float | None,
        planned: float,
        lost_at: float,
        sent_at: float,
        *,
        attempt: int,
    ) -> None:
        """The client's `reconnects` row of a resumption of `st` on its current connection."""
        self.client_row(
            "reconnects",
            client_id=st.client,
            kind="resume",
            stream_key=st.key,
            cause=cause,
            advised_delay=advised,
            planned_delay=planned,
            lost_at=lost_at,
            sent_at=sent_at,
            waited=sent_at - lost_at,
            attempt=attempt,
            conn_id=st.conn_id,
            session_generation=st.generation,
        )

    def recovered(
        self, st: Stream, lost_at: float, recovered_at: float | None, path: str = "resumed"
    ) -> None:
        self.client_row(
            "recoveries",
            client_id=st.client,
            stream_key=st.key,
            operation_key=None,
            cause="connection_lost",
            lost_at=lost_at,
            recovered_at=recovered_at,
            path=path,
            attempts=1,
            reinitialized=0,
        )

    def _last_event_id(self, st: Stream) -> str:
        for row in reversed(self.client_rows.get("inbox", [])):
            if row["client_id"] == st.client and row["stream_key"] == st.key:
                return str(row["event_id"])
        raise AssertionError(f"no event accepted on {st.key}")

    def forward_foreign(
        self, onto: Stream, ev: Event, *, accept: bool, fault: str = "cross_stream", made_up: bool = False
    ) -> None:
        """The proxy forwards `ev` (sent on another stream; or, `made_up`, never sent by
        the server at all) on `onto`'s flow: a crossing fault. The client accepts it (a
        violation) or rejects it (as it should)."""
        t = self.tick(0.001)
        index = onto.index
        onto.index += 1
        self.tap.append(
            {
                "type": "forwarded",
                "flow": onto.flow,
                "t": t,
                "index": index,
                "event_id": ev.event_id,
                "digest": ev.digest,
                "source": None if made_up else {"flow": ev.flow, "index": ev.index},
                "fault": fault,
                "rule": "r-cross",
                "decision": f"d{len(self.tap)}",
            }
        )
        if accept:
            self.accept(onto, ev, kind="notification")
        else:
            self.reject(onto, ev, "crossed_stream", "event ID is other_stream", at=t)

    def reject(self, st: Stream, ev: Event, reason: str, detail: str, *, at: float | None = None) -> None:
        """The client refuses `ev` on `st`'s current connection (`events_rejected`)."""
        self.client_row(
            "events_rejected",
            client_id=st.client,
            conn_id=st.conn_id,
            session_generation=st.generation,
            stream_key=st.key,
            event_id=ev.event_id,
            digest=ev.digest,
            reason=reason,
            detail=detail,
            at=self.tick() if at is None else at,
        )

    def dispatch(
        self, client: str, key: str, request_id: int, effect: str, arguments: str | None = None
    ) -> None:
        """A server dispatch; `arguments` names what was asked (by default, unique per key)."""
        c = self.clients[client]
        self.server_row(
            "dispatches",
            idempotency_key=key,
            session=c.session,
            auth_subject=f"subject-{client}",
            request_id=str(request_id),
            tool="ledger.append",
            effect=effect,
            at=self.tick(),
            arguments_digest=f"args-{arguments or key}",
        )

    def result(
        self,
        st: Stream,
        key: str | None,
        result: str,
        *,
        is_error: bool = False,
        tool: str = "ledger.append",
        index: int | None = None,
    ) -> None:
        """The tap's record of the server's answer to the tool call on `st` (its result
        digest); `index`: that of the SSE event that carried it on `st`'s flow."""
        self.tap.append(
            {
                "type": "result",
                "flow": st.flow,
                "t": self.tick(0.001),
                "session": st.session,
                "auth": f"t_{st.client}",
                "jsonrpc_id": st.request_id,
                "idempotency_key": key,
                "tool": tool,
                "is_error": is_error,
                "result_digest": message_digest(result),
                "index": index,
            }
        )

    def operation(self, client: str, key: str, attempts: int) -> None:
        self.client_row(
            "operations",
            client_id=client,
            operation_key=key,
            tool="ledger.append",
            write=1,
            outcome="ok",
            reason="",
            attempts=attempts,
            started_at=self.t - 1,
            finished_at=self.t,
            session_generation=self.clients[client].generation,
        )

    # ------------------------------------------------------------------ writing

    def run_json(self) -> dict[str, Any]:
        return {
            "schema": "mcpLabRun.v1",
            "run_id": "test-run",
            "scenario": {"name": "built-by-hand"},
            "scenario_file": "scenarios/test.toml",
            "seed": 7,
            "started_at": T0,
            "stopped_at": self.t + 1,
            "complete": self.complete,
            "end_reason": "event_target" if self.complete else "interrupted",
            "budgets": self.budgets,
            "budget_split": [],
            "fault_windows": self.fault_windows,
            "processes": [],
            "versions": {"lab": "0.1.0"},
            "target": {"kind": "reference", "url": "http://127.0.0.1:1/mcp"},
        }

    def write(self, run_dir: Path, *, server: bool = True, tap: bool = True) -> Path:
        (run_dir / "clients").mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(self.run_json(), indent=1), encoding="utf-8")
        self._write_client(run_dir / "clients" / "worker-1.sqlite")
        if server:
            (run_dir / "server").mkdir(exist_ok=True)
            self._write_server(run_dir / "server" / "ledger.sqlite")
        if tap:
            (run_dir / "proxy").mkdir(exist_ok=True)
            lines = "".join(json.dumps(r) + "\n" for r in self.tap)
            (run_dir / "proxy" / "tap.jsonl").write_text(lines, encoding="utf-8")
        if self.nemesis:
            lines = "".join(json.dumps(r) + "\n" for r in self.nemesis)
            (run_dir / "nemesis.jsonl").write_text(lines, encoding="utf-8")
        return run_dir

    def _write_client(self, path: Path) -> None:
        db = connect(path)
        for rtype in RECORD_TYPES:
            cols = ", ".join(f.name for f in fields(rtype))
            db.execute(f"CREATE TABLE IF NOT EXISTS {rtype.table} ({cols})")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('ledger', 'mcpClientLedger.v1')")
        _insert_all(db, self.client_rows)
        db.close()

    def _write_server(self, path: Path) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.executescript(SERVER_DDL)
        _insert_all(db, self.server_rows)
        db.close()


def _kind_of(data: str) -> tuple[str, str | None]:
    """(kind, JSON-RPC id as text) of a message, as the client and the server ledger say it."""
    msg = json.loads(data) if data else {}
    if "method" in msg:
        return ("request" if "id" in msg else "notification"), None
    rid = None if msg.get("id") is None else str(msg["id"])
    return ("error" if "error" in msg else "response"), rid


def _insert_all(db: sqlite3.Connection, tables: dict[str, list[dict[str, Any]]]) -> None:
    db.execute("BEGIN")
    for table, rows in tables.items():
        for row in rows:
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            db.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values()))
    db.execute("COMMIT")


@dataclass
class CleanRun:
    """A run in which every gate passes, and handles on its parts for tests to add to."""

    sim: Sim
    get_a: Stream
    post_a: Stream
    get_b: Stream
    post_b: Stream


def clean_run() -> CleanRun:
    sim = Sim()
    sim.fault_windows = [{"fault": "cross_stream", "start": T0, "end": T0 + 60}]
    sim.initialize("a")
    sim.initialize("b")
    get_a = sim.open_get("a")
    get_b = sim.open_get("b")
    post_a = sim.call("a", 2, idempotency_key="op-a-1")
    post_b = sim.call("b", 2)
    sim.notify(get_a, 3)
    sim.notify(get_b, 3)
    sim.notify(post_a, 3)
    sim.notify(post_b, 2)
    # A crossing fault, rejected as it should be: evidence for gate 1.
    foreign = sim.notify(post_b, 1)[0]
    sim.forward_foreign(post_a, foreign, accept=False)
    # A cut, a resume (within the advised delay and the budget), a recovery.
    lost = sim.cut_and_resume(post_a, after=0.3, advised=0.2)
    sim.notify(post_a, 1)
    sim.recovered(post_a, lost, sim.t)
    sim.respond(post_a)
    sim.respond(post_b)
    # A write whose response was lost, retried with the same key: the server replays.
    sim.dispatch("a", "op-a-1", 2, "performed")
    sim.dispatch("a", "op-a-1", 3, "replayed")
    sim.operation("a", "op-a-1", attempts=2)
    # An Origin rewritten by the proxy, refused by the server.
    sim.request(
        "b",
        "call",
        "POST",
        403,
        stream_key="post:9",
        origin_out="http://evil.example",
        faults=[{"fault": "origin_rewrite", "rule": "r-origin", "decision": "d-o"}],
    )
    # The session of b expires: 404, then a new initialize without a session ID.
    sim.request("b", "call", "POST", 404, stream_key="post:10")
    sim.tick(0.1)
    sim.initialize("b")
    sim.open_get("b")
    sim.nemesis.append(
        {
            "type": "toxic_added",
            "t": sim.tick(),
            "proxy": "mcp",
            "toxic": "lat1",
            "kind": "latency",
            "stream": "downstream",
            "toxicity": 1.0,
            "attributes": {"latency": 50},
        }
    )
    return CleanRun(sim, get_a, post_a, get_b, post_b)
