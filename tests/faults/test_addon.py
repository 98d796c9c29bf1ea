"""The addons under mitmproxy's test context: options, each fault kind, the tap, plan changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_faults_io
import pytest
from mitmproxy import exceptions

from lab.wire.sse import encode_comment, encode_event
from tests.faults.harness import Harness, call, decode, rpc, sse_stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mcpfaults_plan": '{"seed": 1, "rules": [{"kind": "storm", "rate": 2}]}'}, "rules[0].rate"),
        ({"mcpfaults_plan": '{"seed": 1, "rules": [{"kind": "nope", "rate": 1}]}'}, "unknown fault 'nope'"),
        ({"mcpfaults_plan": "/no/such/plan.json"}, "cannot read the fault plan"),
        ({"mcpfaults_plan": "{not json"}, "not JSON"),
        ({"mcpfaults_key": "zz"}, "must be hex"),
        ({"mcpfaults_key": "abcd"}, "at least 16 bytes"),
        ({"mcpfaults_run_start": "soon"}, "mcpfaults_run_start must be a number"),
        ({"mcpfaults_poll": "0"}, "mcpfaults_poll must be a finite number of seconds > 0"),
        ({"mcpfaults_admin_timeout": "-1"}, "mcpfaults_admin_timeout"),
        ({"mcpfaults_admin_url": "ftp://x"}, "must be an http:// URL"),
        ({"mcpfaults_allowed_origins": "127.0.0.1"}, "needs a scheme"),
    ],
)
async def test_bad_options_are_refused_with_a_clear_message(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    h = Harness(tmp_path, [])
    with pytest.raises(exceptions.OptionsError, match=None) as e:
        h.configure(**options)
    assert message in str(e.value)


async def test_plan_from_a_file_and_the_plan_record(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"seed": 3, "run_start": 500.0, "rules": [{"kind": "cut_stream", "rate": 0.5}]})
    )
    h = Harness(tmp_path, None, mcpfaults_plan=str(plan), mcpfaults_run_start="")
    [rec] = h.tap(type="plan")
    assert (
        rec["source"] == str(plan) and rec["seed"] == 3 and rec["run_start"] == 500.0 and rec["error"] is None
    )
    assert rec["rules"] == [{"id": "cut_stream#0", "kind": "cut_stream", "rate": 0.5}]


def test_fault_options_parse_on_their_own(tmp_path: Path) -> None:
    base = {
        "mcpfaults_plan": "",
        "mcpfaults_run_start": "",
        "mcpfaults_poll": "",
        "mcpfaults_admin_token": "t",
        "mcpfaults_admin_url": "",
        "mcpfaults_admin_timeout": "",
    }
    opts = mcp_faults_io.parse_fault_options(base)
    assert opts.plan.rules == () and opts.path is None and opts.poll == 1.0 and opts.run_start == 0.0
    assert opts.env.admin_token == "t" and opts.env.call_timeout == 2.0
    with pytest.raises(ValueError, match="mcpfaults_poll must be"):
        mcp_faults_io.parse_fault_options({**base, "mcpfaults_poll": "-3"})
    plan = tmp_path / "p.json"
    plan.write_text('{"seed": 1, "rules": []}')
    watch = mcp_faults_io.PlanFile(plan, 0.5)
    assert watch.changed(0.0) is None  # unchanged since it was read
    plan.write_text('{"seed": 2, "rules": [], "run_start": 5}')
    assert watch.changed(0.1) is None, "looked at no more than every poll seconds"
    new = watch.changed(0.6)
    assert new is not None and new.seed == 2
    plan.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        watch.changed(1.2)


def test_parse_functions_are_pure() -> None:
    assert mcp_faults_io.parse_seconds("x", "", default=2.0) == 2.0
    assert mcp_faults_io.parse_seconds("x", "1.5", default=0.0) == 1.5
    assert mcp_faults_io.parse_origin_patterns(" http://a:*, http://b ") == ("http://a:*", "http://b")
    assert mcp_faults_io.parse_key("ab" * 16) == bytes.fromhex("ab" * 16)
    plan, path = mcp_faults_io.read_plan("")
    assert plan.rules == () and path is None


# ---------------------------------------------------------------------- pass-through and the tap


async def test_pass_through_records_sent_and_forwarded(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    f = h.request(h.flow(body=call("ticker", 5, key="k-1"), headers={"origin": "http://127.0.0.1:1"}))
    h.respond(f)
    chunks = sse_stream("pS", 2, rid=5)
    out = await h.stream(f, chunks)
    assert decode(out) == decode(b"".join(chunks))
    [flow] = h.tap(type="flow")
    assert flow["conn"] == "c1:1" and flow["jsonrpc_id"] == 5 and flow["tool"] == "ticker"
    assert flow["idempotency_key"] == "k-1" and flow["session"].startswith("s_") and flow["stream"] == "post"
    assert flow["status"] == 200 and flow["answered_by"] == "server" and flow["faults"] == []
    assert flow["origin_allowed_out"] is None  # no allow-list given: unknown
    sent, fwd = h.tap(type="sent"), h.tap(type="forwarded")
    assert [s["index"] for s in sent] == [0, 1, 2, 3] and sent[0]["priming"] and not sent[1]["priming"]
    assert all(s["stream_id"] == "pS" for s in sent)
    assert [(x["index"], x["source"]["index"], x["fault"]) for x in fwd] == [(i, i, None) for i in range(4)]
    assert [x["digest"] for x in fwd] == [s["digest"] for s in sent]
    assert h.tap(type="flow_end") == [
        {"type": "flow_end", "flow": f.id, "t": pytest.approx(1000, abs=1), "reason": "complete"}
    ]
    assert f.metadata["mcp_lab"]["faults"] == [] and f.metadata["mcp_lab"]["key"] == "c1:1"


async def test_a_partial_event_is_held_back_not_ended(tmp_path: Path) -> None:
    # Regression: returning b"" from a stream callable makes mitmproxy write an empty HTTP/1.1
    # chunk — the end of a chunked body. Half an event must yield nothing at all.
    h = Harness(tmp_path, [])
    f = h.request(h.flow(body=call("echo")))
    h.respond(f)
    assert f.response is not None and callable(f.response.stream)
    assert f.response.stream(b"data: hal") == []
    assert f.response.stream(b"f\n\n") == [b"data: half\n\n"]


async def test_keepalive_comments_pass_on(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    f = h.request(h.flow("GET", body=None))
    h.respond(f)
    assert f.response is not None and callable(f.response.stream)
    assert f.response.stream(encode_comment("ping")) == [b":\n\n"]


async def test_flow_end_reasons(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    gone = h.request(h.flow("GET", conn="c1:1"))
    h.respond(gone)
    h.error(gone, "Client disconnected.")
    server = h.request(h.flow("GET", conn="c1:2"))
    h.error(server, "server closed connection")
    open_ = h.request(h.flow("GET", conn="c1:3"))
    h.respond(open_)
    h.done()
    reasons = {r["flow"]: r["reason"] for r in h.tap(type="flow_end")}
    assert reasons == {gone.id: "client_gone", server.id: "server_gone", open_.id: "proxy_stopped"}
    no_head = [r for r in h.tap(type="flow") if r["flow"] == server.id]
    assert no_head[0]["status"] is None


# ---------------------------------------------------------------------- 1..4, 13: SSE event faults


async def test_1_drop_priming(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "drop_priming", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo")))
    h.respond(f)
    out = decode(await h.stream(f, sse_stream("pA", 1)))
    assert not out[0].is_priming and len(out) == 2
    [d] = h.tap(type="dropped")
    assert d["index"] == 0 and d["fault"] == "drop_priming" and d["rule"] == "drop_priming#0"
    assert f.metadata["mcp_lab"]["faults"] == []  # event faults are in the event records


async def test_2_cross_ids_takes_an_id_of_another_stream_of_the_session(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "cross_ids", "rate": 1.0, "match": {"tools": ["ticker"]}}])
    get = h.request(h.flow("GET", conn="c1:1"))
    h.respond(get)
    await h.stream(get, sse_stream("g1", 1, rid=99, priming=False), end=False)
    f = h.request(h.flow(body=call("ticker", 2), conn="c1:2"))
    h.respond(f)
    out = decode(await h.stream(f, sse_stream("pB", 2, rid=2)))
    get_ids = {s["event_id"] for s in h.tap(type="sent", flow=get.id)}
    crossed = [e for e in out if e.id in get_ids]
    assert len(crossed) == 3  # both progress events and the response; never the priming event
    assert all(x["fault"] == "cross_ids" for x in h.tap(type="forwarded", flow=f.id)[1:])


async def test_3_replay_after_ack_resends_forwarded_events(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "replay_after_ack", "rate": 1.0, "params": {"depth": 2}}])
    f = h.request(h.flow(body=call("ticker", 3)))
    h.respond(f)
    out = decode(await h.stream(f, sse_stream("pR", 2, rid=3)))
    ids = [e.id for e in out]
    sent = [s["event_id"] for s in h.tap(type="sent")]
    # priming, m1, [m1] m2, [m1 m2] response
    assert ids == [sent[0], sent[1], sent[1], sent[2], sent[1], sent[2], sent[3]]
    replays = [x for x in h.tap(type="forwarded") if x["fault"] == "replay_after_ack"]
    assert [x["source"]["index"] for x in replays] == [1, 1, 2]


async def test_3_replay_reaches_across_a_resumption(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "replay_after_ack", "rate": 1.0, "match": {"streams": ["resume"]}}])
    first = h.request(h.flow(body=call("ticker", 1), conn="c1:1"))
    h.respond(first)
    chunks = sse_stream("pX", 3, rid=1)
    await h.stream(first, chunks[:3], end=False)
    h.error(first, "Client disconnected.")
    acked = decode(chunks[2])[0].id
    assert acked is not None
    resume = h.request(h.flow("GET", conn="c1:2", headers={"last-event-id": acked}))
    h.respond(resume)
    out = decode(await h.stream(resume, chunks[3:]))
    assert out[0].id == acked, "the acknowledged event should come again first"


async def test_4_inject_foreign_event_from_another_session(tmp_path: Path) -> None:
    rules = [
        {
            "kind": "inject_foreign",
            "rate": 1.0,
            "params": {"source": "other_session"},
            "match": {"tools": ["b"]},
        }
    ]
    h = Harness(tmp_path, rules)
    a = h.request(h.flow(body=call("a"), conn="a:1", session="sess-a"))
    h.respond(a)
    await h.stream(a, sse_stream("pA", 0, tag="TAGAAAAAAAA"))
    b = h.request(h.flow(body=call("b"), conn="b:1", session="sess-b"))
    h.respond(b)
    out = decode(await h.stream(b, sse_stream("pB", 0, tag="TAGBBBBBBBB")))
    assert any(e.id and ".TAGAAAAAAAA." in e.id for e in out)
    [inj] = [x for x in h.tap(type="forwarded", flow=b.id) if x["fault"] == "inject_foreign"]
    assert inj["source"]["flow"] == a.id


async def test_4_inject_foreign_without_sessions_takes_another_requests_message(tmp_path: Path) -> None:
    """The modern era: no session, no event IDs. The foreign message is another request's,
    and never one naming this request's ID (another client's request 1 is not foreign to
    this client's request 1 in any way a client could see)."""
    rules = [{"kind": "inject_foreign", "rate": 1.0, "match": {"tools": ["c"]}}]
    h = Harness(tmp_path, rules)
    same = h.request(h.flow(body=call("a", rid=7), conn="a:1", session=None))
    h.respond(same)
    await h.stream(same, sse_stream("pA", 1, rid=7, priming=False))
    other = h.request(h.flow(body=call("b", rid=3), conn="b:1", session=None))
    h.respond(other)
    await h.stream(other, sse_stream("pB", 1, rid=3, priming=False))
    c = h.request(h.flow(body=call("c", rid=7), conn="c:1", session=None))
    h.respond(c)
    await h.stream(c, sse_stream("pC", 1, rid=7, priming=False))
    injected = [x for x in h.tap(type="forwarded", flow=c.id) if x["fault"] == "inject_foreign"]
    assert injected and {x["source"]["flow"] for x in injected} == {other.id}


async def test_13_cut_stream_cuts_after_the_forwarded_bytes(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "cut_stream", "rate": 1.0, "params": {"min_index": 2}}])
    f = h.request(h.flow(body=call("ticker")))
    h.respond(f)
    chunks = sse_stream("pC", 3)
    out = await h.stream(f, [b"".join(chunks[:3]), chunks[3]], end=False)
    assert len(decode(out)) == 2
    assert h.cuts == [f]
    assert [(d["index"], d["fault"]) for d in h.tap(type="dropped")] == [(2, "cut_stream"), (3, "cut_stream")]
    assert [r["reason"] for r in h.tap(type="flow_end")] == ["cut_by_fault"]
    assert f.metadata["mcp_lab"]["cut"] is True


async def test_13_a_cut_happens_before_the_end_of_the_body(tmp_path: Path) -> None:
    # When the end of the body is processed in the same event, the cut must not wait for
    # the scheduled callback (mitmproxy would write the end of the body first).
    h = Harness(tmp_path, [{"kind": "cut_stream", "rate": 1.0, "params": {"min_index": 1}}])
    f = h.request(h.flow(body=call("ticker")))
    h.respond(f)
    assert f.response is not None and callable(f.response.stream)
    f.response.stream(b"".join(sse_stream("pE", 1)))
    assert h.cuts == []
    f.response.stream(b"")
    assert h.cuts == [f]


# ---------------------------------------------------------------------- 5, 9, 10, 11: requests


async def test_5_rewrite_origin(tmp_path: Path) -> None:
    h = Harness(
        tmp_path,
        [{"kind": "rewrite_origin", "rate": 1.0, "params": {"origin": "http://evil.example"}}],
        mcpfaults_allowed_origins="http://127.0.0.1:*",
    )
    f = h.request(h.flow(body=call("echo"), headers={"origin": "http://127.0.0.1:8000"}))
    assert f.request.headers["origin"] == "http://evil.example"
    h.respond(f, 403, sse=False)
    await h.finish(f)
    [rec] = h.tap(type="flow")
    assert rec["origin_in"] == "http://127.0.0.1:8000" and rec["origin_out"] == "http://evil.example"
    assert rec["origin_allowed_out"] is False and rec["status"] == 403
    assert rec["faults"][0]["fault"] == "rewrite_origin"


async def test_origin_allowed_out_follows_the_allow_list(tmp_path: Path) -> None:
    h = Harness(tmp_path, [], mcpfaults_allowed_origins="http://127.0.0.1:*")
    ok = h.request(h.flow(body=call("echo"), conn="c:1", headers={"origin": "http://127.0.0.1:8000"}))
    bad = h.request(
        h.flow(body=call("echo"), conn="c:2", headers={"origin": "http://127.0.0.1:80.evil.example"})
    )
    for f in (ok, bad):
        h.respond(f, sse=False)
        await h.finish(f)
    assert [r["origin_allowed_out"] for r in h.tap(type="flow")] == [True, False]


async def test_9_strip_protocol_version(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "strip_protocol_version", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo")))
    assert "mcp-protocol-version" not in f.request.headers
    h.respond(f, 400, sse=False)
    await h.finish(f)
    [rec] = h.tap(type="flow")
    assert rec["protocol_version_in"] == "2025-11-25" and rec["protocol_version_out"] is None


@pytest.mark.parametrize(
    ("which", "header", "sent"),
    [
        ("name", "mcp-name", "echo-not-this-one"),
        ("method", "mcp-method", "tools/list"),
        ("version", "mcp-protocol-version", "2099-01-01"),
    ],
)
async def test_16_mismatch_header_in_the_modern_era(
    tmp_path: Path, which: str, header: str, sent: str
) -> None:
    h = Harness(tmp_path, [{"kind": "mismatch_header", "rate": 1.0, "params": {"header": which}}])
    modern = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo"}
    f = h.request(h.flow(body=call("echo"), session=None, headers=modern))
    assert f.request.headers[header] == sent
    h.respond(f, 400, sse=False)
    await h.finish(f)
    [rec] = h.tap(type="flow")
    assert rec["protocol_version_in"] == "2026-07-28"  # the client's: the flow stays the modern era's
    assert rec["faults"][0]["fault"] == "mismatch_header" and rec["faults"][0]["detail"] == {
        "header": which,
        "sent": sent,
    }


async def test_16_mismatch_header_leaves_the_handshake_era_alone(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "mismatch_header", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo")))  # 2025-11-25
    assert "mcp-name" not in f.request.headers and f.request.headers["mcp-protocol-version"] == "2025-11-25"
    h.respond(f, 200, sse=False)
    await h.finish(f)
    [rec] = h.tap(type="flow")
    assert rec["faults"] == []


async def test_15_strip_session_id(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "strip_session_id", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo")))
    assert "mcp-session-id" not in f.request.headers
    h.respond(f, 400, sse=False)
    await h.finish(f)
    # Not on an initialize (it carries no session), nor on a GET or a DELETE.
    init = h.request(
        h.flow(body={"jsonrpc": "2.0", "id": 9, "method": "initialize"}, conn="c1:2", session=None)
    )
    get = h.request(h.flow("GET", conn="c1:3"))
    delete = h.request(h.flow("DELETE", conn="c1:4"))
    assert "mcp-session-id" in get.request.headers and "mcp-session-id" in delete.request.headers
    for other in (init, get, delete):
        h.respond(other, 200, sse=False)
        await h.finish(other)
    recs = {r["conn"]: r for r in h.tap(type="flow")}
    assert [x["fault"] for x in recs["c1:1"]["faults"]] == ["strip_session_id"]
    assert recs["c1:1"]["session"] is not None  # the tap names the session the client sent
    assert all(not recs[c]["faults"] for c in ("c1:2", "c1:3", "c1:4"))


@pytest.mark.parametrize("to", ["garbage", "tampered", "other_stream", "other_session"])
async def test_10_rewrite_last_event_id(tmp_path: Path, to: str) -> None:
    h = Harness(tmp_path, [{"kind": "rewrite_last_event_id", "rate": 1.0, "params": {"to": to}}])
    # Earlier traffic the proxy remembers: another stream of this session, and another session.
    for conn, session, stream in (("c:1", "sess-1", "pO"), ("x:1", "sess-2", "pX"), ("c:2", "sess-1", "pM")):
        f = h.request(h.flow(body=call("ticker"), conn=conn, session=session))
        h.respond(f)
        await h.stream(f, sse_stream(stream, 1, tag="T" + session[-1] * 10))
    mine = [s["event_id"] for s in h.tap(type="sent") if s["stream_id"] == "pM"][-1]
    r = h.request(h.flow("GET", conn="c:3", headers={"last-event-id": mine}))
    out = r.request.headers["last-event-id"]
    assert out != mine
    if to == "garbage":
        assert out.startswith("garbage-d_")
    elif to == "tampered":
        assert out[:-1] == mine[:-1]
    elif to == "other_stream":
        assert ".pO." in out
    else:
        assert ".pX." in out
    h.respond(r, 400, sse=False)
    await h.finish(r)
    [rec] = [x for x in h.tap(type="flow") if x["conn"] == "c:3"]
    assert rec["last_event_id_in"] == mine and rec["last_event_id_out"] == out
    assert rec["faults"][0]["detail"] == {"to": to}


async def test_11_old_token_from_an_earlier_session(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "old_token", "rate": 1.0, "match": {"methods": ["tools/call"]}}])
    for conn, token, sid in (("a:1", "tok-alice", "sess-a"), ("b:1", "tok-bob", "sess-b")):
        init = h.request(
            h.flow(
                body=rpc("initialize"), conn=conn, session=None, headers={"authorization": f"Bearer {token}"}
            )
        )
        h.respond(init, sse=False, headers={"mcp-session-id": sid})
        await h.finish(init)
    f = h.request(
        h.flow(body=call("echo"), conn="b:2", session="sess-b", headers={"authorization": "Bearer tok-bob"})
    )
    assert f.request.headers["authorization"] == "Bearer tok-alice"
    h.respond(f, 403, sse=False)
    await h.finish(f)
    rec = next(x for x in h.tap(type="flow") if x["conn"] == "b:2")
    assert rec["auth_in"] != rec["auth_out"] and rec["faults"][0]["detail"]["token"] == rec["auth_out"]
    assert "tok-alice" not in h.tap_path.read_text(), "a raw token reached the tap"


async def test_11_old_token_needs_an_earlier_token(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "old_token", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo"), headers={"authorization": "Bearer only-one"}))
    assert f.request.headers["authorization"] == "Bearer only-one"
    assert f.metadata["mcp_lab"]["faults"] == []


# ---------------------------------------------------------------------- 6: storms


async def test_6_storm_is_answered_by_the_proxy(tmp_path: Path) -> None:
    rules = [{"kind": "storm", "rate": 1.0, "params": {"status": 429, "retry_after": 2.5}}]
    h = Harness(tmp_path, rules)
    f = h.request(h.flow(body=call("echo", 4)))
    assert f.response is not None and f.response.status_code == 429
    assert f.response.headers["retry-after"] == "3"
    assert json.loads(f.response.content or b"")["id"] == 4
    h.respond(f)  # no-op: mitmproxy does not call responseheaders for an addon's answer
    await h.finish(f)
    [rec] = h.tap(type="flow")
    assert rec["answered_by"] == "proxy" and rec["status"] == 429
    assert rec["faults"][0]["detail"] == {"status": 429, "shape": "sustained"}
    assert f.metadata["mcp_lab"]["answered_by"] == "proxy"
    assert [r["reason"] for r in h.tap(type="flow_end")] == ["complete"]


async def test_6_a_storm_answers_alone(tmp_path: Path) -> None:
    rules = [{"kind": "rewrite_origin", "rate": 1.0}, {"kind": "storm", "rate": 1.0}]
    h = Harness(tmp_path, rules)
    f = h.request(h.flow(body=call("echo"), headers={"origin": "http://127.0.0.1:1"}))
    assert f.response is not None and f.response.status_code == 503
    assert [x["fault"] for x in f.metadata["mcp_lab"]["faults"]] == ["storm"]
    assert f.request.headers["origin"] == "http://127.0.0.1:1"


async def test_6_storm_shapes_follow_the_clock(tmp_path: Path) -> None:
    rules = [
        {
            "kind": "storm",
            "rate": 1.0,
            "window": {"start": 10, "end": 40},
            "params": {"shape": "burst", "period": 10, "burst": 2, "send_retry_after": False},
        }
    ]
    h = Harness(tmp_path, rules)
    answered = []
    for t in (5.0, 10.5, 13.0, 20.5, 29.0, 41.0):
        h.clock.now = 1000.0 + t
        f = h.request(h.flow(body=call("echo"), conn=f"c:{t}"))
        answered.append(f.response is not None)
        if f.response is not None:
            assert "retry-after" not in f.response.headers
    assert answered == [False, True, False, True, False, False]


# ---------------------------------------------------------------------- 7, 8, 12: lost answers


async def test_7_executed_then_lost_drops_the_response_and_cuts(tmp_path: Path) -> None:
    h = Harness(
        tmp_path, [{"kind": "executed_then_lost", "rate": 1.0, "match": {"tools": ["ledger.append"]}}]
    )
    f = h.request(h.flow(body=call("ledger.append", 7, key="k")))
    h.respond(f)
    chunks = sse_stream("pW", 1, rid=7)
    out = decode(await h.stream(f, [b"".join(chunks)]))  # response and end of body together
    assert [e.is_priming for e in out] == [True, False]
    assert not any('"result"' in e.data for e in out)
    assert h.cuts == [f]
    [d] = h.tap(type="dropped")
    assert d["index"] == 2 and d["fault"] == "executed_then_lost"


async def test_7_executed_then_lost_on_a_json_answer_kills_the_flow(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "executed_then_lost", "rate": 1.0}])
    f = h.request(h.flow(body=call("ledger.append", 4, key="k-json")))
    h.respond(f, sse=False)
    assert f.error is None, "the body must be read first: the tap records what the server sent"
    await h.finish(f, body=json.dumps({"jsonrpc": "2.0", "id": 4, "result": {"receipt": "r1"}}).encode())
    assert f.error is not None and f.error.msg == "Connection killed."
    assert [r["reason"] for r in h.tap(type="flow_end")] == ["cut_by_fault"]
    [rec] = h.tap(type="flow")
    assert rec["faults"][0]["fault"] == "executed_then_lost" and rec["faults"][0]["detail"] == {"status": 200}
    [result] = h.tap(type="result")
    assert result["idempotency_key"] == "k-json" and result["is_error"] is False


async def test_7_not_for_notifications(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "executed_then_lost", "rate": 1.0}])
    f = h.request(h.flow(body=rpc("notifications/initialized", None)))
    h.respond(f, 202, sse=False)
    assert f.error is None


async def test_7_8_a_refusal_is_not_lost(tmp_path: Path) -> None:
    h = Harness(
        tmp_path, [{"kind": "lose_delete_response", "rate": 1.0}, {"kind": "executed_then_lost", "rate": 1.0}]
    )
    for f in (h.request(h.flow("DELETE", conn="c:1")), h.request(h.flow(body=call("echo"), conn="c:2"))):
        h.respond(f, 404, sse=False)
        await h.finish(f, body=b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "gone"}}')
        assert f.error is None and f.metadata["mcp_lab"]["faults"] == []


async def test_8_lose_delete_response(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "lose_delete_response", "rate": 1.0}])
    f = h.request(h.flow("DELETE"))
    h.respond(f, 200, sse=False)
    assert f.error is not None
    h.error(f)
    [rec] = h.tap(type="flow")
    assert rec["status"] == 200 and rec["faults"][0]["fault"] == "lose_delete_response"
    assert [r["reason"] for r in h.tap(type="flow_end")] == ["cut_by_fault"]


async def test_12_expiry_race_holds_the_answer_until_the_session_expired(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo", 3), session="raw-session-id"))
    h.respond(f)
    assert f.response is not None and not callable(f.response.stream), "order 'before' holds the answer"
    assert h.calls == [] and h.tap(type="flow") == []
    body = b"".join(sse_stream("pZ", 1, rid=3))
    await h.finish(f, body=body)
    [c] = h.calls
    assert (c.method, c.host, c.port, c.path) == ("POST", "127.0.0.1", 9, "/lab-admin/expire")
    assert dict(c.headers)["mcp-session-id"] == "raw-session-id"
    assert dict(c.headers)["x-lab-admin-token"] == "admin-token"
    assert "raw-session-id" not in repr(c), "a side call must not print the raw session ID"
    [fault] = h.tap(type="fault")
    assert fault["fault"] == "expiry_race" and fault["detail"]["admin_status"] == 200
    assert fault["detail"]["order"] == "before" and fault["detail"]["session"].startswith("s_")
    assert decode(f.response.content or b"") == decode(body), "the whole answer passes, after the call"
    assert [x["fault"] for x in h.tap(type="forwarded")] == [None, None, None]
    assert "raw-session-id" not in h.tap_path.read_text()


async def test_12_the_held_answer_waits_without_blocking_the_loop(tmp_path: Path) -> None:
    import asyncio

    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0}])
    release = asyncio.Event()
    progress: list[str] = []

    async def slow(call: Any) -> int:
        await release.wait()
        return 200

    h.addon.caller = slow
    f = h.request(h.flow(body=call("echo", 3)))
    h.respond(f)
    f.response.content = b"".join(sse_stream("pW", 0, rid=3))  # type: ignore[union-attr]
    held = asyncio.ensure_future(h.addon.response(f))
    for _ in range(5):
        await asyncio.sleep(0)
        progress.append("loop ran")
    assert not held.done() and len(progress) == 5, "the loop must go on while the answer is held"
    release.set()
    await held
    assert h.tap(type="fault")[0]["detail"]["admin_status"] == 200


async def test_12_expiry_race_on_a_json_answer(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo")))
    h.respond(f, sse=False)
    await h.finish(f, body=b'{"jsonrpc": "2.0", "id": 1, "result": {}}')
    assert len(h.calls) == 1 and h.tap(type="fault")[0]["detail"]["order"] == "before"


async def test_12_no_race_when_the_answer_is_not_the_response(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0}])
    f = h.request(h.flow(body=call("echo", 5)))
    h.respond(f)
    await h.finish(f, body=encode_event("", id="p0"))  # the stream ended before the response
    assert h.calls == [] and h.tap(type="fault") == []


async def test_12_concurrent_order_streams_and_races(tmp_path: Path) -> None:
    import asyncio

    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0, "params": {"order": "concurrent"}}])
    f = h.request(h.flow(body=call("echo", 1)))
    h.respond(f)
    out = await h.stream(f, sse_stream("pQ", 0), end=False)
    assert len(decode(out)) == 2
    for _ in range(200):
        if h.tap(type="fault"):
            break
        await asyncio.sleep(0.01)
    assert h.tap(type="fault")[0]["detail"]["order"] == "concurrent" and len(h.calls) == 1


async def test_12_without_an_admin_token_nothing_fires(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "expiry_race", "rate": 1.0}], mcpfaults_admin_token="")
    f = h.request(h.flow(body=call("echo")))
    h.respond(f)
    await h.finish(f, body=b"".join(sse_stream("pN", 0)))
    assert h.calls == [] and h.tap(type="fault") == []


# ---------------------------------------------------------------------- 14: kill_session


@pytest.mark.parametrize("order", ["before", "concurrent"])
async def test_14_kill_session_sends_a_real_delete(tmp_path: Path, order: str) -> None:
    import asyncio

    h = Harness(tmp_path, [{"kind": "kill_session", "rate": 1.0, "params": {"order": order}}])
    f = h.request(
        h.flow(
            body=call("echo", 2),
            session="raw-sid",
            headers={"authorization": "Bearer tok", "origin": "http://o"},
        )
    )
    h.respond(f)
    body = b"".join(sse_stream("pK", 0, rid=2))
    if order == "before":
        await h.finish(f, body=body)
    else:
        await h.stream(f, [body])
        for _ in range(100):
            if h.calls:
                break
            await asyncio.sleep(0.01)
    [c] = h.calls
    headers = dict(c.headers)
    assert (c.method, c.path, c.port) == ("DELETE", "/mcp", 9)
    assert headers["mcp-session-id"] == "raw-sid" and headers["authorization"] == "Bearer tok"
    assert headers["mcp-protocol-version"] == "2025-11-25" and headers["origin"] == "http://o"
    await asyncio.sleep(0.01)
    [fault] = h.tap(type="fault")
    assert fault["fault"] == "kill_session" and fault["flow"] == f.id
    assert fault["detail"] == {"delete_status": 200, "session": fault["detail"]["session"], "order": order}
    assert fault["detail"]["session"].startswith("s_") and fault["decision"].startswith("d_")
    text = h.tap_path.read_text()
    assert "raw-sid" not in text and "Bearer tok" not in text


async def test_14_a_405_is_recorded_as_it_came(tmp_path: Path) -> None:
    h = Harness(tmp_path, [{"kind": "kill_session", "rate": 1.0}])
    h.call_status = 405
    f = h.request(h.flow(body=call("echo", 2)))
    h.respond(f, sse=False)
    await h.finish(f, body=b'{"jsonrpc": "2.0", "id": 2, "result": {}}')
    assert h.tap(type="fault")[0]["detail"]["delete_status"] == 405


async def test_14_no_answer_is_minus_one(tmp_path: Path) -> None:
    # A real call to a port nothing listens on: the async client gives -1, it does not raise.
    from lab.faults.kinds.base import HttpCall
    from lab.run.options import free_port

    port = free_port()
    status = await mcp_faults_io.http_call(HttpCall("DELETE", "127.0.0.1", port, "/mcp", (), 0.5))
    assert status == -1


# ---------------------------------------------------------------------- decisions and changes


async def test_decisions_do_not_depend_on_arrival_order(tmp_path: Path) -> None:
    rules = [{"kind": "cut_stream", "rate": 0.3, "params": {"min_index": 0}}]
    conns = [f"c{i}:1" for i in range(30)]

    async def run(order: list[str], where: Path) -> dict[str, list[str]]:
        h = Harness(where, rules, seed=42)
        for conn in order:
            f = h.request(h.flow(body=call("ticker"), conn=conn))
            h.respond(f)
            await h.stream(f, sse_stream("pD", 3))
        flows = {r["flow"]: r["conn"] for r in h.tap(type="flow")}
        out: dict[str, list[str]] = {}
        for d in h.tap(type="dropped"):
            out.setdefault(flows[d["flow"]], []).append(f"{d['index']}:{d['decision']}")
        return out

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    forward = await run(conns, tmp_path / "a")
    backward = await run(list(reversed(conns)), tmp_path / "b")
    assert forward == backward and 0 < len(forward) < len(conns)


async def test_two_proxies_with_one_seed_make_the_same_decisions(tmp_path: Path) -> None:
    # Two addon instances fed the same traffic with one seed: the same decisions, same IDs.
    rules = [
        {"kind": "rewrite_origin", "rate": 0.4, "match": {"tools": ["echo"]}},
        {"kind": "strip_protocol_version", "rate": 0.4},
        {"kind": "drop_priming", "rate": 0.5},
        {"kind": "kill_session", "rate": 0.3, "params": {"order": "concurrent"}},
        {"kind": "cut_stream", "rate": 0.05, "params": {"min_index": 2}},
        {"kind": "replay_after_ack", "rate": 0.2},
        {"kind": "cross_ids", "rate": 0.2},
    ]

    async def decisions(seed: int, where: Path) -> list[tuple[str, str, object]]:
        import asyncio

        where.mkdir()
        h = Harness(where, rules, seed=seed)
        for i in range(24):
            tool = "echo" if i % 2 else "ticker"
            f = h.request(h.flow(body=call(tool, i), conn=f"c{i % 5}:{i}", session=f"sess-{i % 3}"))
            h.respond(f)
            await h.stream(f, sse_stream(f"p{i}", 4, rid=i, tag="T" + "ABCDEFGHIJ"[i % 3] * 10))
        await asyncio.sleep(0.01)  # let concurrent races write their records
        conn = {r["flow"]: r["conn"] for r in h.tap(type="flow")}
        out: list[tuple[str, str, object]] = []
        for r in h.tap():
            if r["type"] == "flow":
                out += [(r["conn"], x["fault"], x["decision"]) for x in r["faults"]]
            elif r["type"] in ("forwarded", "dropped", "fault") and r.get("decision"):
                out.append((conn[r["flow"]], r["fault"], (r.get("index"), r["decision"])))
        return sorted(out, key=repr)

    first = await decisions(21, tmp_path / "a")
    second = await decisions(21, tmp_path / "b")
    other = await decisions(22, tmp_path / "c")
    assert first == second
    assert {f for _, f, _ in first} >= {"rewrite_origin", "drop_priming", "kill_session", "replay_after_ack"}
    assert other != first


async def test_plan_file_changes_are_picked_up_and_bad_ones_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"seed": 1, "rules": []}))
    h = Harness(tmp_path, None, mcpfaults_plan=str(plan), mcpfaults_poll="0.5")
    tmp = tmp_path / "plan.tmp"
    tmp.write_text(json.dumps({"seed": 1, "rules": [{"kind": "storm", "rate": 1.0}]}))
    tmp.replace(plan)
    h.clock.now += 1.0
    f = h.request(h.flow(body=call("echo"), conn="c:1"))
    assert f.response is not None and f.response.status_code == 503
    plan.write_text("{broken")
    h.clock.now += 1.0
    g = h.request(h.flow(body=call("echo"), conn="c:2"))
    assert g.response is not None, "the last good plan keeps running"
    records = h.tap(type="plan")
    assert [r["version"] for r in records if r["error"] is None] == [1, 2]
    assert "not JSON" in records[-1]["error"]


async def test_set_command_changes_the_plan(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    h.configure(
        mcpfaults_plan=json.dumps({"seed": 1, "rules": [{"kind": "strip_protocol_version", "rate": 1}]})
    )
    f = h.request(h.flow(body=call("echo")))
    assert "mcp-protocol-version" not in f.request.headers


async def test_window_limits_a_fault_in_time(tmp_path: Path) -> None:
    rules = [{"kind": "strip_protocol_version", "rate": 1.0, "window": {"start": "5s", "end": "10s"}}]
    h = Harness(tmp_path, rules)
    stripped = []
    for t in (1.0, 6.0, 11.0):
        h.clock.now = 1000.0 + t
        f = h.request(h.flow(body=call("echo"), conn=f"c:{t}"))
        stripped.append("mcp-protocol-version" not in f.request.headers)
    assert stripped == [False, True, False]


async def test_event_type_and_retry_survive_reframing(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    f = h.request(h.flow("GET"))
    h.respond(f)
    raw = encode_event("x", id="1", event="message", retry=250) + encode_event(None, retry=1000)
    out = decode(await h.stream(f, [raw]))
    assert [(e.id, e.event, e.retry, e.data, e.has_data) for e in out] == [
        ("1", "message", 250, "x", True),
        (None, None, 1000, "", False),
    ]
    assert [s["retry"] for s in h.tap(type="sent")] == [250, 1000]


async def test_a_flow_still_waiting_for_its_answer_when_the_proxy_stops_gets_its_flow_record(
    tmp_path: Path,
) -> None:
    # Without its `flow` record, a request the upstream never answered before the proxy
    # stopped would be known only by its end: its connection, and so its client, unknown.
    h = Harness(tmp_path, [])
    waiting = h.request(h.flow("POST", conn="c9:1", body=call("echo")))
    h.done()
    heads = [r for r in h.tap(type="flow") if r["flow"] == waiting.id]
    assert len(heads) == 1 and heads[0]["status"] is None and heads[0]["conn"] == "c9:1"
    ends = [r for r in h.tap(type="flow_end") if r["flow"] == waiting.id]
    assert [e["reason"] for e in ends] == ["proxy_stopped"]


INIT_REQUEST = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "t"},
    },
}
INIT_RESULT = {
    "jsonrpc": "2.0",
    "id": 0,
    "result": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
    },
}


@pytest.mark.parametrize("sse", [True, False])
async def test_the_tap_records_what_an_initialize_declared(tmp_path: Path, sse: bool) -> None:
    h = Harness(tmp_path, [])
    f = h.request(h.flow(body=INIT_REQUEST, session=None))
    h.respond(f, sse=sse, headers={"mcp-session-id": "raw-sid-1"})
    if sse:
        await h.stream(f, [f"id: p0\ndata: {json.dumps(INIT_RESULT)}\n\n".encode()])
    else:
        await h.finish(f, json.dumps(INIT_RESULT).encode())
    [rec] = h.tap(type="capabilities")
    assert rec["flow"] == f.id and rec["session"] is not None and rec["session"] != "raw-sid-1"
    assert rec["server"] == ["logging", "tools", "tools.listChanged"] and rec["client"] == ["sampling"]
    # The session is the pseudonym every later record of that session carries.
    [flow_rec] = h.tap(type="flow")
    assert flow_rec["session_out"] == rec["session"]


TOOLS_RESULT = {
    "jsonrpc": "2.0",
    "id": 3,
    "result": {
        "tools": [
            {"name": "echo", "inputSchema": {}, "annotations": {"readOnlyHint": True, "title": "Echo"}},
            {
                "name": "append",
                "inputSchema": {},
                "annotations": {"idempotentHint": False, "readOnlyHint": "yes"},
            },
            {"name": "bare", "inputSchema": {}},
            # The server's word that it honours the idempotency key (only `true` counts).
            {"name": "keyed", "inputSchema": {}, "_meta": {"mcp-lab/idempotency-key": True}},
            {"name": "half", "inputSchema": {}, "_meta": {"mcp-lab/idempotency-key": "yes"}},
            {"inputSchema": {}},  # no name: not a tool anyone can call
        ]
    },
}


@pytest.mark.parametrize("sse", [True, False])
async def test_the_tap_records_what_a_tools_list_annotated(tmp_path: Path, sse: bool) -> None:
    # The retry rule's two hints, only as booleans (a string is no hint), per listed tool.
    h = Harness(tmp_path, [])
    f = h.request(h.flow(body={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
    h.respond(f, sse=sse)
    if sse:
        await h.stream(f, [f"id: p0\ndata: {json.dumps(TOOLS_RESULT)}\n\n".encode()])
    else:
        await h.finish(f, json.dumps(TOOLS_RESULT).encode())
    [rec] = h.tap(type="tools")
    assert rec["flow"] == f.id and rec["session"] is not None
    assert rec["tools"] == {
        "echo": {"readOnlyHint": True},
        "append": {"idempotentHint": False},
        "bare": {},
        "keyed": {"mcp-lab/idempotency-key": True},
        "half": {},
    }


async def test_sent_records_name_only_the_methods_that_need_a_capability(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    f = h.request(h.flow("GET", conn="c1:5"))
    h.respond(f)
    notes = [
        {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "x://1"}},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1, "progressToken": 1}},
    ]
    await h.stream(f, [f"id: e{i}\ndata: {json.dumps(n)}\n\n".encode() for i, n in enumerate(notes)])
    sent = h.tap(type="sent")
    assert [s.get("method") for s in sent] == ["notifications/resources/updated", None]
