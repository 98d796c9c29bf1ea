"""End to end, one test per fault: real mitmdump with addons/mcp_faults.py in front of the
real reference server on 127.0.0.1, a small httpx client, assertions on the wire and on
the tap (and, where the server is the witness, on its ledger).

One server and one proxy serve the whole module; each test installs its plan by
replacing the plan file (as `lab run` would mid-run) and waits for the tap to confirm it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.faults.plan import parse_plan
from lab.wire.event_ids import parse_event_id, session_tag
from tests.faults.live import (
    TOKENS,
    McpClient,
    Proc,
    Tap,
    fault_proxy,
    ledger_rows,
    origin_of,
    reference_server,
    server_available,
    tap_proxy,
    wait_rows,
    write_plan,
)

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not server_available(), reason="the reference server (lab/server) is not there yet"),
]


@dataclass
class Lab:
    server: Proc
    proxy: Proc
    plan_path: Path
    tap: Tap
    ledger: Path
    reloads: int = 0

    @property
    def url(self) -> str:
        return self.proxy.url + "/mcp"

    def set_plan(self, rules: list[dict[str, Any]], seed: int = 7) -> None:
        """Install a plan mid-run and wait until the proxy runs it."""
        plan = {"seed": seed, "rules": rules}
        digest = parse_plan(plan).digest
        write_plan(self.plan_path, plan)
        deadline = time.monotonic() + 10
        with McpClient(self.url, "reload", token=None) as c:
            while time.monotonic() < deadline:
                time.sleep(0.06)  # > mcpfaults_poll
                self.reloads += 1
                c.request("OPTIONS", f"reload:{self.reloads}")  # any request makes it look
                plans = self.tap.records(type="plan")
                if plans and plans[-1].get("digest") == digest:
                    return
        raise AssertionError(f"plan {digest} not activated")

    def client(self, name: str, **kw: Any) -> McpClient:
        c = McpClient(self.url, name, **kw)
        c.initialize()
        return c


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("faults-live")
    plan = tmp / "plan.json"
    write_plan(plan, {"seed": 7, "rules": []})
    tap = tmp / "proxy" / "tap.jsonl"
    with reference_server(tmp, "--tokens", TOKENS) as srv:
        upstream = origin_of(srv.url)
        with fault_proxy(tmp, upstream, plan, tap, "--set", f"mcpfaults_allowed_origins={upstream}") as px:
            yield Lab(srv, px, plan, Tap(tap), tmp / "server-ledger.sqlite")


def last_flow(lab: Lab, conn: str) -> dict[str, Any]:
    flows = lab.tap.records(type="flow", conn=conn)
    assert flows, f"no flow record for {conn}"
    return flows[-1]


def stream_of(event_id: str | None) -> str | None:
    p = parse_event_id(event_id or "")
    return None if p is None else p.stream_id


# ---------------------------------------------------------------------- 1..4: SSE events


def test_drop_priming(lab: Lab) -> None:
    lab.set_plan([{"kind": "drop_priming", "rate": 1.0, "match": {"tools": ["echo"]}}])
    with lab.client("prime") as c:
        conn = c.conn()
        ex = c.call("echo", {"text": "hi"}, conn=conn)
    assert ex.status == 200 and ex.error is None
    # An event fault changes no response head: nothing marks the response.
    assert "x-lab-fault" not in ex.headers
    assert ex.events and not ex.events[0].is_priming, "the priming event reached the client"
    assert "result" in ex.messages()[0]
    flow = last_flow(lab, conn)["flow"]
    sent = lab.tap.of_flow(flow, "sent")
    assert sent[0]["priming"] is True
    dropped = lab.tap.of_flow(flow, "dropped")
    assert [(d["index"], d["fault"]) for d in dropped] == [(0, "drop_priming")]
    assert dropped[0]["decision"].startswith("d_")
    fwd = lab.tap.of_flow(flow, "forwarded")
    assert fwd[0]["source"] == {"flow": flow, "index": 1}


def test_cross_ids_between_streams_of_one_session(lab: Lab) -> None:
    lab.set_plan([{"kind": "cross_ids", "rate": 1.0, "match": {"tools": ["ticker"]}}])
    with lab.client("cross") as c, c.standalone(get_conn := c.conn()):
        # ledger.append sends a notification on the GET stream: two other streams with events.
        c.call("ledger.append", {"entry": "cross"}, key="cross-1")
        get_flow = last_flow(lab, get_conn)["flow"]
        lab.tap.wait(type="sent", flow=get_flow, priming=False)
        conn = c.conn()
        ex = c.call("ticker", {"count": 2, "interval_ms": 1}, conn=conn)
    flow = last_flow(lab, conn)["flow"]
    own = {stream_of(s["event_id"]) for s in lab.tap.of_flow(flow, "sent")}
    assert len(own) == 1
    foreign_on_wire = [e.id for e in ex.events if e.data and stream_of(e.id) not in own]
    assert foreign_on_wire, "no event carried another stream's ID"
    # Every crossed ID is one the server sent on another stream of this same session.
    session = last_flow(lab, conn)["session"]
    others = {s["event_id"] for s in lab.tap.records(type="sent", session=session) if s["flow"] != flow}
    assert set(foreign_on_wire) <= others
    crossed = [f for f in lab.tap.of_flow(flow, "forwarded") if f["fault"] == "cross_ids"]
    assert crossed and all(f["event_id"] in others for f in crossed)
    assert all(f["source"]["flow"] == flow for f in crossed)


def test_replay_after_ack(lab: Lab) -> None:
    lab.set_plan([{"kind": "replay_after_ack", "rate": 1.0, "match": {"tools": ["ticker"]}}])
    with lab.client("replay") as c:
        conn = c.conn()
        ex = c.call("ticker", {"count": 3, "interval_ms": 1}, conn=conn)
    ids = [e.id for e in ex.events]
    assert len(ids) > len(set(ids)), f"nothing was re-sent: {ids}"
    flow = last_flow(lab, conn)["flow"]
    replays = [f for f in lab.tap.of_flow(flow, "forwarded") if f["fault"] == "replay_after_ack"]
    sent = {s["index"]: s for s in lab.tap.of_flow(flow, "sent")}
    assert replays
    for r in replays:
        assert r["source"]["flow"] == flow and sent[r["source"]["index"]]["event_id"] == r["event_id"]


def test_inject_foreign_event_from_another_session(lab: Lab) -> None:
    lab.set_plan(
        [
            {
                "kind": "inject_foreign",
                "rate": 1.0,
                "match": {"tools": ["ticker"]},
                "params": {"source": "other_session"},
            }
        ]
    )
    with lab.client("fa") as a:
        a.call("echo", {"text": "from a"})
    with lab.client("fb") as b:
        conn = b.conn()
        ex = b.call("ticker", {"count": 1, "interval_ms": 1}, conn=conn)
        assert b.session_id is not None
        tag = session_tag(b.session_id)
    tags = {p.session_tag for e in ex.events if (p := parse_event_id(e.id or "")) is not None}
    assert tags - {tag}, "no event of another session on the wire"
    flow = last_flow(lab, conn)["flow"]
    injected = [f for f in lab.tap.of_flow(flow, "forwarded") if f["fault"] == "inject_foreign"]
    assert injected and all(f["source"]["flow"] != flow for f in injected)


# ---------------------------------------------------------------------- 5, 9, 10, 11: requests


def test_rewrite_origin_is_refused_by_the_server(lab: Lab) -> None:
    lab.set_plan([{"kind": "rewrite_origin", "rate": 1.0, "match": {"methods": ["tools/call"]}}])
    legit = origin_of(lab.server.url)
    with lab.client("origin", origin=legit) as c:
        conn = c.conn()
        ex = c.call("echo", {"text": "x"}, conn=conn)
    assert ex.status == 403
    # The proxy says the refusal was its doing, for the lab's clients to count it as intended.
    assert ex.headers.get("x-lab-fault") == "rewrite_origin"
    rec = last_flow(lab, conn)
    assert rec["origin_in"] == legit and rec["origin_out"] == "http://evil.invalid"
    assert rec["origin_allowed_out"] is False and rec["status"] == 403
    assert [f["fault"] for f in rec["faults"]] == ["rewrite_origin"]
    rows = wait_rows(lab.ledger, "SELECT status, origin FROM requests WHERE conn = ?", (conn,))
    assert rows == [(403, "http://evil.invalid")]


def test_strip_protocol_version(lab: Lab) -> None:
    lab.set_plan([{"kind": "strip_protocol_version", "rate": 1.0, "match": {"tools": ["echo"]}}])
    with lab.client("nover") as c:
        conn = c.conn()
        c.call("echo", {"text": "x"}, conn=conn)
    rec = last_flow(lab, conn)
    assert rec["protocol_version_in"] == "2025-11-25" and rec["protocol_version_out"] is None
    assert [f["fault"] for f in rec["faults"]] == ["strip_protocol_version"]
    rows = wait_rows(lab.ledger, "SELECT protocol_version FROM requests WHERE conn = ?", (conn,))
    assert rows == [(None,)]


def test_strip_session_id_gets_400_from_the_reference_server(lab: Lab) -> None:
    lab.set_plan([{"kind": "strip_session_id", "rate": 1.0, "match": {"tools": ["echo"]}}])
    with lab.client("nosess") as c:
        conn = c.conn()
        c.call("echo", {"text": "x"}, conn=conn)
    rec = last_flow(lab, conn)
    assert [f["fault"] for f in rec["faults"]] == ["strip_session_id"]
    assert rec["status"] == 400 and rec["answered_by"] == "server" and rec["session"] is not None


def test_rewrite_last_event_id_to_garbage(lab: Lab) -> None:
    lab.set_plan([{"kind": "rewrite_last_event_id", "rate": 1.0, "params": {"to": "garbage"}}])
    with lab.client("cursor") as c:
        ex = c.call("ticker", {"count": 1, "interval_ms": 1})
        lei = ex.events[-1].id
        assert lei is not None
        conn = c.conn()
        resumed = c.resume(lei, conn=conn)
    assert resumed.status is not None and 400 <= resumed.status < 500
    rec = last_flow(lab, conn)
    assert rec["last_event_id_in"] == lei and rec["last_event_id_out"].startswith("garbage-d_")
    assert rec["faults"][0]["detail"] == {"to": "garbage"}
    rows = wait_rows(lab.ledger, "SELECT cursor_verdict FROM requests WHERE conn = ?", (conn,))
    assert rows == [("malformed",)]


def test_old_token_with_new_session(lab: Lab) -> None:
    lab.set_plan([{"kind": "old_token", "rate": 1.0, "match": {"methods": ["tools/call"]}}])
    with lab.client("tok-a", token="alice"), lab.client("tok-b", token="bob") as b:
        conn = b.conn()
        ex = b.call("echo", {"text": "x"}, conn=conn)
    assert ex.status in (401, 403)
    rec = last_flow(lab, conn)
    assert rec["auth_in"] != rec["auth_out"] and rec["auth_out"].startswith("t_")
    assert rec["faults"][0]["fault"] == "old_token"
    assert rec["faults"][0]["detail"] == {"token": rec["auth_out"]}


# ---------------------------------------------------------------------- 6: storms


def test_storm_is_answered_by_the_proxy(lab: Lab) -> None:
    lab.set_plan(
        [
            {
                "kind": "storm",
                "rate": 1.0,
                "match": {"tools": ["echo"]},
                "params": {"status": 429, "retry_after": 3},
            }
        ]
    )
    with lab.client("storm") as c:
        conn = c.conn()
        ex = c.call("echo", {"text": "x"}, conn=conn)
        after = c.conn()
        c.call("clock", {}, conn=after)
    assert ex.status == 429 and ex.headers.get("retry-after") == "3"
    assert ex.headers.get("x-lab-fault") == "storm"
    rec = last_flow(lab, conn)
    assert rec["answered_by"] == "proxy" and rec["status"] == 429
    assert rec["faults"][0]["fault"] == "storm"
    # The server never saw it: its ledger has the request after it, not the stormed one.
    wait_rows(lab.ledger, "SELECT 1 FROM requests WHERE conn = ?", (after,))
    assert ledger_rows(lab.ledger, "SELECT 1 FROM requests WHERE conn = ?", (conn,)) == []


# ---------------------------------------------------------------------- 7, 8, 12, 13: losses


def test_executed_then_lost(lab: Lab) -> None:
    lab.set_plan([{"kind": "executed_then_lost", "rate": 1.0, "match": {"tools": ["ledger.append"]}}])
    with lab.client("etl") as c:
        conn = c.conn()
        ex = c.call("ledger.append", {"entry": "once"}, key="etl-key-1", conn=conn)
        assert ex.error is not None, "the client connection was not cut"
        assert not any("result" in m for m in ex.messages()), "the response reached the client"
        flow = last_flow(lab, conn)["flow"]
        dropped = lab.tap.of_flow(flow, "dropped")
        assert [d["fault"] for d in dropped] == ["executed_then_lost"]
        assert lab.tap.of_flow(flow, "flow_end")[0]["reason"] == "cut_by_fault"
        performed = wait_rows(
            lab.ledger, "SELECT effect FROM dispatches WHERE idempotency_key = ?", ("etl-key-1",)
        )
        assert performed == [("performed",)]
        # The retry with the same key gets the original receipt and no second effect.
        lab.set_plan([])
        retry = c.call("ledger.append", {"entry": "once"}, key="etl-key-1")
    assert retry.status == 200 and "result" in retry.messages()[-1]
    effects = [
        r[0]
        for r in ledger_rows(
            lab.ledger, "SELECT effect FROM dispatches WHERE idempotency_key = ?", ("etl-key-1",)
        )
    ]
    assert effects.count("performed") == 1


def test_lose_delete_response(lab: Lab) -> None:
    lab.set_plan([{"kind": "lose_delete_response", "rate": 1.0}])
    with lab.client("del") as c:
        conn = c.conn()
        ex = c.delete(conn=conn)
        assert ex.status is None and ex.error is not None
        lab.set_plan([])
        after = c.call("echo", {"text": "x"})
    assert after.status == 404, "the server did not perform the DELETE"
    rec = last_flow(lab, conn)
    assert rec["status"] == 200 and rec["faults"][0]["fault"] == "lose_delete_response"
    assert lab.tap.of_flow(rec["flow"], "flow_end")[0]["reason"] == "cut_by_fault"


def test_expiry_races_the_response(lab: Lab) -> None:
    lab.set_plan([{"kind": "expiry_race", "rate": 1.0, "match": {"tools": ["echo"]}}])
    with lab.client("expire") as c:
        conn = c.conn()
        ex = c.call("echo", {"text": "x"}, conn=conn)
        assert ex.status == 200 and "result" in ex.messages()[-1], "the response itself must pass"
        flow = last_flow(lab, conn)["flow"]
        faults = lab.tap.records(type="fault", flow=flow)
        assert [(f["fault"], f["detail"]["admin_status"]) for f in faults] == [("expiry_race", 200)]
        later = c.call("clock", {})
    assert later.status == 404


def test_cut_stream_then_resume(lab: Lab) -> None:
    lab.set_plan(
        [{"kind": "cut_stream", "rate": 1.0, "match": {"tools": ["ticker"]}, "params": {"min_index": 3}}]
    )
    with lab.client("cut") as c:
        conn = c.conn()
        ex = c.call("ticker", {"count": 6, "interval_ms": 5}, conn=conn)
        assert ex.error is not None and len(ex.events) == 3
        last = ex.events[-1].id
        assert last is not None
        resumed = c.resume(last)
    flow = last_flow(lab, conn)["flow"]
    assert lab.tap.of_flow(flow, "dropped")[0]["index"] == 3
    assert lab.tap.of_flow(flow, "flow_end")[0]["reason"] == "cut_by_fault"
    assert resumed.status == 200 and "result" in resumed.messages()[-1]
    assert resumed.events[0].id != last


def test_pinned_faults_fire_at_their_triggers_only(lab: Lab) -> None:
    # "cut after event 3 of the 2nd ticker call of client `pinned`", and the protocol
    # version stripped from its 1st echo call: each once, there, whatever the rates.
    lab.set_plan(
        [
            {
                "kind": "cut_stream",
                "at": [{"client": "pinned", "request": "POST tools/call ticker", "ordinal": 2, "event": 3}],
            },
            {
                "kind": "strip_protocol_version",
                "at": [{"client": "pinned", "request": "POST tools/call echo", "ordinal": 1}],
            },
        ]
    )
    with lab.client("pinned") as c:
        tickers = [c.conn() for _ in range(3)]
        outcomes = [c.call("ticker", {"count": 6, "interval_ms": 0}, conn=conn) for conn in tickers]
        echoes = [c.conn() for _ in range(2)]
        answers = [c.call("echo", {"text": "hi"}, conn=conn) for conn in echoes]
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert len(outcomes[1].events) == 3  # events 0, 1, 2 passed; 3 was where it was cut
    cut = [lab.tap.of_flow(last_flow(lab, conn)["flow"], "dropped") for conn in tickers]
    # (what the server sent after the cut is recorded as dropped by it: from index 3 on)
    assert [[(d["index"], d["fault"]) for d in dropped][:1] for dropped in cut] == [
        [],
        [(3, "cut_stream")],
        [],
    ]
    assert [a.status for a in answers] == [200, 200]
    stripped = [last_flow(lab, conn) for conn in echoes]
    assert [[f["fault"] for f in rec.get("faults") or []] for rec in stripped] == [
        ["strip_protocol_version"],
        [],
    ]
    assert [rec["protocol_version_out"] for rec in stripped] == [None, "2025-11-25"]


# ---------------------------------------------------------------------- determinism, changes


def _decisions(lab: Lab, name: str, seed: int) -> list[tuple[int, str | None]]:
    lab.set_plan([{"kind": "replay_after_ack", "rate": 0.5, "match": {"tools": ["ticker"]}}], seed=seed)
    with lab.client(name) as c:
        conn = c.conn()
        c.call("ticker", {"count": 16, "interval_ms": 0}, conn=conn)
    flow = last_flow(lab, conn)["flow"]
    return [(f["index"], f["decision"]) for f in lab.tap.of_flow(flow, "forwarded")]


def test_same_seed_same_decisions(lab: Lab) -> None:
    first = _decisions(lab, "det", seed=11)
    again = _decisions(lab, "det", seed=11)
    other = _decisions(lab, "det", seed=12)
    fired = [d for _, d in first if d is not None]
    assert 0 < len(fired) < 17
    assert first == again
    assert other != first


def test_a_bad_plan_file_keeps_the_running_plan(lab: Lab) -> None:
    lab.set_plan([{"kind": "storm", "rate": 1.0, "match": {"tools": ["clock"]}}])
    lab.plan_path.write_text(json.dumps({"seed": 1, "rules": [{"kind": "storm", "rate": 2}]}))
    deadline = time.monotonic() + 5
    with lab.client("badplan") as c:
        while time.monotonic() < deadline and not [p for p in lab.tap.records(type="plan") if p.get("error")]:
            time.sleep(0.06)
            c.request("OPTIONS", c.conn())
        errors = [p for p in lab.tap.records(type="plan") if p.get("error")]
        assert errors and "rules[0].rate" in errors[-1]["error"]
        assert c.call("clock", {}).status == 503, "the previous plan should still be running"


# ---------------------------------------------------------------------- 14: kill_session, any server


def test_kill_session_deletes_the_session_as_the_response_passes(lab: Lab) -> None:
    lab.set_plan([{"kind": "kill_session", "rate": 1.0, "match": {"tools": ["echo"]}}])
    with lab.client("kill") as c:
        conn = c.conn()
        ex = c.call("echo", {"text": "x"}, conn=conn)
        assert ex.status == 200 and "result" in ex.messages()[-1], "the response itself must pass"
        flow = last_flow(lab, conn)["flow"]
        [fault] = lab.tap.records(type="fault", flow=flow)
        assert fault["fault"] == "kill_session" and fault["detail"]["order"] == "before"
        assert fault["detail"]["delete_status"] == 200
        assert fault["detail"]["session"] == last_flow(lab, conn)["session"]
        lab.set_plan([])
        later = c.call("clock", {})
    assert later.status == 404, "the proxy's DELETE did not end the session"
    ended = ledger_rows(
        lab.ledger, "SELECT COUNT(*) FROM sessions WHERE session = ?", (fault["detail"]["session"],)
    )
    assert ended == [(1,)]
    reasons = ledger_rows(
        lab.ledger, "SELECT end_reason FROM sessions WHERE session = ?", (fault["detail"]["session"],)
    )
    assert reasons == [("deleted",)]
    assert c.session_id is not None and c.session_id not in lab.tap.path.read_text()


def test_kill_session_against_a_server_that_refuses_delete(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    write_plan(
        plan, {"seed": 3, "rules": [{"kind": "kill_session", "rate": 1.0, "match": {"tools": ["echo"]}}]}
    )
    tap = Tap(tmp_path / "tap.jsonl")
    with (
        reference_server(tmp_path, "--tokens", TOKENS, "--delete", "refuse") as srv,
        fault_proxy(tmp_path, origin_of(srv.url), plan, tap.path) as px,
        McpClient(px.url + "/mcp", "refused") as c,
    ):
        c.initialize()
        conn = c.conn()
        ex = c.call("echo", {"text": "x"}, conn=conn)
        assert ex.status == 200
        [fault] = tap.wait(type="fault")
        assert fault["detail"]["delete_status"] == 405  # not applicable: recorded as it came
        assert c.call("echo", {"text": "still here"}).status == 200


# ---------------------------------------------------------------------- write receipts on the wire


def test_write_receipts_are_recorded_from_what_the_server_sent(lab: Lab) -> None:
    from lab.faults.results import result_digest

    lab.set_plan([{"kind": "executed_then_lost", "rate": 1.0, "match": {"tools": ["ledger.append"]}}])
    with lab.client("receipt") as c:
        lost = c.call("ledger.append", {"entry": "r"}, key="wire-key-1")
        assert lost.error is not None
        lab.set_plan([])
        retry = c.call("ledger.append", {"entry": "r"}, key="wire-key-1")
    answer = retry.messages()[-1]
    results = lab.tap.wait(type="result", idempotency_key="wire-key-1")
    deadline = time.monotonic() + 5
    while len(results) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        results = lab.tap.records(type="result", idempotency_key="wire-key-1")
    # The lost answer (dropped by the proxy, but sent by the server) and the retry's.
    assert len(results) == 2 and {r["tool"] for r in results} == {"ledger.append"}
    assert all(r["auth"] and r["auth"].startswith("t_") and r["is_error"] is False for r in results)
    # One receipt: the retry returned the original answer, so the server sent one result
    # digest twice (the lost answer and the retry's), and it is the digest of that answer.
    assert [r["result_digest"] for r in results] == [result_digest(answer["result"])] * 2


def test_the_tap_runs_alone(tmp_path: Path) -> None:
    # -s addons/mcp_tap.py without the fault addon: a proxy that only records.
    tap = Tap(tmp_path / "tap.jsonl")
    with (
        reference_server(tmp_path, "--tokens", TOKENS) as srv,
        tap_proxy(tmp_path, origin_of(srv.url), tap.path) as px,
        McpClient(px.url + "/mcp", "alone") as c,
    ):
        c.initialize()
        ex = c.call("ticker", {"count": 3, "interval_ms": 1}, key="alone-1")
        assert ex.status == 200 and "result" in ex.messages()[-1]
        [result] = tap.wait(type="result")
    flow = next(r for r in tap.records(type="flow") if r["flow"] == result["flow"])
    assert flow["faults"] == [] and flow["tool"] == "ticker"
    sent, fwd = tap.of_flow(flow["flow"], "sent"), tap.of_flow(flow["flow"], "forwarded")
    assert len(sent) == len(fwd) == len(ex.events) and all(x["fault"] is None for x in fwd)
    assert tap.records(type="plan") == [], "no fault addon, no plan"
