"""Official SDK clients through their adapters, against the real reference server, with a
wire spy (mitmdump) in between: what the application log says is checked against what the
server's ledger and the wire saw.

The Node adapter's tests skip (with the reason) where Node.js or the installed SDK is absent.
"""

from __future__ import annotations

import re
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from lab.sut.host import AdapterProcess, adapter_command, read_app_log
from lab.sut.protocol import Call, Cancel, Leave, Start
from lab.wire.redact import Redactor
from tests.livesrv import reference_server
from tests.sut.live import (
    ADMIN,
    KEY,
    ServerLedger,
    adapter_or_skip,
    by_ev,
    expire,
    outcomes,
    wait_for,
    wire_spy,
)

pytestmark = pytest.mark.live

ADAPTERS = ["python-sdk", "typescript-sdk"]
IMPLEMENTATION = {"python-sdk": "mcp", "typescript-sdk": "@modelcontextprotocol/sdk"}
RAW_SESSION_ID = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
"""The reference server's session IDs: token_urlsafe(32). Digests (64 hex) and pseudonyms do not match."""


def assert_no_raw_secret(path: Path, raw_ids: set[str]) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    assert raw_ids, "the spy saw no session ID: the check would be hollow"
    leaked = [sid for sid in raw_ids if sid in text]
    assert leaked == [], f"raw session IDs in {path.name}"
    assert RAW_SESSION_ID.findall(text) == [], f"something shaped like a session ID in {path.name}"


@pytest.mark.parametrize("name", ADAPTERS)
def test_sdk_clients_call_tools_and_leave(tmp_path: Path, name: str) -> None:
    adapter_or_skip(name)
    clients = ("c1", "c2", "c3")
    log = tmp_path / "app.jsonl"
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv, wire_spy(tmp_path, srv.url) as spy:
        with AdapterProcess(adapter_command(name), log, key=KEY) as adapter:
            ready = adapter.wait_ready()
            for c in clients:
                adapter.send(Start(c, spy.url, None, {"Authorization": "Bearer not-a-real-token-but-long"}))
                adapter.send(Call(c, f"{c}:echo", "echo", {"text": f"hello {c} é"}, f"k-{c}-echo"))
                ticker = {"count": 6, "interval_ms": 5, "close_after": 2, "retry_ms": 50}
                adapter.send(Call(c, f"{c}:ticker", "ticker", ticker, f"k-{c}-ticker"))
                adapter.send(Call(c, f"{c}:write", "ledger.append", {"entry": c}, f"k-{c}-write"))
            wait_for(log, lambda r: len(outcomes(r)) == 9)
            for c in clients:
                adapter.send(Leave(c))
            wait_for(log, lambda r: len(by_ev(r, "left")) == 3)
            assert adapter.stop() == 0
        wire = spy.records()
        raw_ids = spy.raw_session_ids()
    records = read_app_log(log)
    ledger = ServerLedger(tmp_path / "ledger.sqlite")

    # The ready line names the implementation and its version.
    assert ready["adapter"] == name and ready["implementation"]["name"] == IMPLEMENTATION[name]
    if name == "python-sdk":
        assert ready["implementation"]["version"] == version("mcp")
    else:
        assert re.fullmatch(r"\d+\.\d+\.\d+", ready["implementation"]["version"])

    # Every call came back ok; each client had its own session, named as the server names it.
    assert {c: o["status"] for c, o in outcomes(records).items()} == dict.fromkeys(
        [f"{c}:{k}" for c in clients for k in ("echo", "ticker", "write")], "ok"
    )
    started = {r["client"]: r for r in by_ev(records, "started")}
    sessions = {r["session"] for r in started.values()}
    assert len(sessions) == 3 and sessions <= ledger.sessions()
    assert all(r["protocolVersion"] == "2025-11-25" for r in started.values())

    # Each call's response was delivered once, under its JSON-RPC id, with the digest of the
    # very event the server sent; the progress notifications too.
    sent = ledger.event_digests()
    responses = [r for r in by_ev(records, "deliver", kind="response") if r["call"] is not None]
    assert sorted(r["call"] for r in responses) == sorted(outcomes(records))
    assert all(r["digest"] in sent for r in responses)
    progress = by_ev(records, "deliver", method="notifications/progress")
    assert len(progress) >= 3 * 6 and all(r["digest"] in sent for r in progress)
    for o in outcomes(records).values():
        assert o["id"] == next(r["id"] for r in responses if r["call"] == o["call"])

    # The ticker's server-initiated closes were resumed (GET + Last-Event-ID), by every client,
    # and the wire agrees with the log; a disconnect was never turned into a cancellation.
    for c in clients:
        assert by_ev(records, "reconnect", client=c, kind="resume"), c
    resumes_on_wire = [w for w in wire if w["method"] == "GET" and w["lastEventId"]]
    assert len(resumes_on_wire) == len(by_ev(records, "reconnect", kind="resume"))
    assert [w for w in wire if w["rpc"] == "notifications/cancelled"] == []

    # One write per key, and each client left with DELETE.
    assert sorted(ledger.dispatches()) == sorted((f"k-{c}-write", "performed") for c in clients)
    assert len([w for w in wire if w["method"] == "DELETE" and w["status"] == 200]) == 3

    # No raw session ID, and not the bearer token, anywhere the adapter wrote.
    for path in (log, log.with_suffix(".stderr")):
        assert_no_raw_secret(path, raw_ids)
        assert "not-a-real-token-but-long" not in path.read_text()


@pytest.mark.parametrize("name", ADAPTERS)
def test_what_an_sdk_does_when_the_server_expires_its_session(tmp_path: Path, name: str) -> None:
    """Records what the SDK does (the checker judges it): the log must agree with the wire."""
    adapter_or_skip(name)
    log = tmp_path / "app.jsonl"
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv, wire_spy(tmp_path, srv.url) as spy:
        with AdapterProcess(adapter_command(name), log, key=KEY) as adapter:
            adapter.wait_ready()
            adapter.send(Start("c1", spy.url, None))
            adapter.send(Call("c1", "before", "echo", {"text": "a"}, "k-before"))
            records = wait_for(log, lambda r: "before" in outcomes(r))
            pseudonym = by_ev(records, "started")[0]["session"]
            redactor = Redactor(KEY)
            (raw,) = [s for s in spy.raw_session_ids() if redactor.session(s) == pseudonym]
            expired_at = time.time()
            expire(srv.url, raw)
            adapter.send(Call("c1", "after", "echo", {"text": "b"}, "k-after"))
            wait_for(log, lambda r: "after" in outcomes(r))
            time.sleep(2.5)  # the SDK's own reconnect attempts of its GET stream play out
            adapter.send(Call("c1", "again", "echo", {"text": "c"}, "k-again"))
            wait_for(log, lambda r: "again" in outcomes(r))
            adapter.send(Leave("c1"))
            wait_for(log, lambda r: bool(by_ev(r, "left")))
            assert adapter.stop() == 0
        wire = spy.records()
        raw_ids = spy.raw_session_ids()
    records = read_app_log(log)
    results = outcomes(records)
    assert results["before"]["status"] == "ok"

    after_expiry = [w for w in wire if w["t"] > expired_at]
    posts = [w for w in after_expiry if w["method"] == "POST" and w["rpc"] == "tools/call"]
    initializes = [w for w in after_expiry if w["rpc"] == "initialize"]
    # The log agrees with the wire: each call the server answered 404 failed in the application,
    # and a new session on the wire would show as a `reinitialize` reconnect in the log.
    assert len(posts) == 2 and all(w["status"] == 404 for w in posts)
    assert results["after"]["status"] != "ok" and results["again"]["status"] != "ok"
    assert len(initializes) == len(by_ev(records, "reconnect", kind="reinitialize"))
    # What the pinned SDKs do today (docs/clients.md, "What the shipped SDKs do"): they keep
    # the dead session ID on every later request and never send a new initialize.
    assert all(w["sent"] == raw for w in after_expiry), "the SDK changed: update docs/clients.md"
    assert initializes == []
    assert {results[c]["session"] for c in ("after", "again")} == {pseudonym}
    for path in (log, log.with_suffix(".stderr")):
        assert_no_raw_secret(path, raw_ids)


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_cancel_the_application_asks_for_is_a_notifications_cancelled(tmp_path: Path, name: str) -> None:
    adapter_or_skip(name)
    log = tmp_path / "app.jsonl"
    with reference_server(tmp_path, "--admin-token", ADMIN) as srv, wire_spy(tmp_path, srv.url) as spy:
        with AdapterProcess(adapter_command(name), log, key=KEY) as adapter:
            adapter.wait_ready()
            adapter.send(Start("c1", spy.url, None))
            adapter.send(Call("c1", "long", "ticker", {"count": 200, "interval_ms": 50}, "k-long"))
            wait_for(log, lambda r: len(by_ev(r, "deliver", method="notifications/progress")) >= 2)
            adapter.send(Cancel("long"))
            records = wait_for(log, lambda r: "long" in outcomes(r), timeout=5)
            adapter.send(Leave("c1"))
            wait_for(log, lambda r: bool(by_ev(r, "left")))
        wire = spy.records()
    assert outcomes(records)["long"]["status"] == "cancelled"
    assert outcomes(records)["long"]["elapsed_s"] < 5.0
    assert [w["status"] for w in wire if w["rpc"] == "notifications/cancelled"] == [202]


@pytest.mark.parametrize("name", ADAPTERS)
def test_an_older_session_era_revision_is_asked_for_the_sdks_way(tmp_path: Path, name: str) -> None:
    adapter_or_skip(name)
    log = tmp_path / "app.jsonl"
    versions = ("2025-03-26", "2025-06-18")
    with reference_server(tmp_path) as srv, AdapterProcess(adapter_command(name), log, key=KEY) as adapter:
        adapter.wait_ready()
        for v in versions:
            adapter.send(Start(v, srv.url, v))
            adapter.send(Call(v, f"{v}:echo", "echo", {"text": v}, f"k-{v}"))
        records = wait_for(log, lambda r: len(outcomes(r)) == 2)
        adapter.stop()
    if name == "typescript-sdk":
        # Its Client always asks for its newest revision: the adapter says so instead of pretending.
        assert {r["client"] for r in by_ev(records, "start_failed")} == set(versions)
        assert all("2025-11-25 only" in r["error"] for r in by_ev(records, "start_failed"))
        return
    assert {r["client"]: r["protocolVersion"] for r in by_ev(records, "started")} == {v: v for v in versions}
    assert {c: o["status"] for c, o in outcomes(records).items()} == {f"{v}:echo": "ok" for v in versions}
    db = ServerLedger(tmp_path / "ledger.sqlite").db
    assert sorted(r[0] for r in db.execute("SELECT protocol_version FROM sessions")) == list(versions)
