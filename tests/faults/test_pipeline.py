"""The tap's SSE pipe on its own: re-framing is invariant under any chunking, faults included;
write receipts are recorded from what the server sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.checker.inputs.tap_forms import expand_all
from lab.faults import pipeline
from lab.faults.decisions import Decider
from lab.faults.events import Armed, EventFaults
from lab.faults.facts import RequestFacts, RpcFacts
from lab.faults.kinds import Unit
from lab.faults.memory import Memory, Remembered
from lab.faults.pipeline import Record, SsePipe, as_record, js, reencode
from lab.faults.plan import ActivePlan, PlanHolder, parse_plan
from lab.faults.results import ResultWatch, WriteCall, WriteCalls, result_digest
from lab.wire.sse import SseDecoder, SseEvent, encode_event

RESPONSE = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "héllo ✓"}})

# A body with everything a server may send: a priming event, CRLF and CR line ends, a
# comment, multi-line data, an event type, a retry-only block, multi-byte UTF-8.
RAW = (
    b"id: e1.AAAAAAAAAAA.0.pS.0.e3b0c44298fc.MMMMMMMMMMMMMMMM\ndata:\n\n"
    b": keep-alive\r\n\r\n"
    b'id: 2\r\nevent: message\r\ndata: {"jsonrpc":"2.0",\r\ndata: "method":"notifications/progress"}\r\n\r\n'
    b"retry: 1500\rid: 3\rdata: \xc3\xa9t\xc3\xa9\r\r"
    b"retry: 250\n\n"
    b"id: 4\ndata: " + RESPONSE.encode() + b"\n\n"
)


FACTS = RequestFacts(
    flow="f1",
    key="c1:1",
    conn="c1:1",
    http_method="POST",
    path="/mcp",
    session_id="raw",
    session="s_x",
    rpc=RpcFacts(1, "tools/call", "echo"),
    origin=None,
    last_event_id=None,
    protocol_version=None,
    token=None,
)


def make_pipe(
    rules: list[dict[str, Any]] | None = None, *, memory: Memory | None = None
) -> tuple[SsePipe, list[Record]]:
    plan = parse_plan({"seed": 5, "rules": rules or []})
    holder = PlanHolder(ActivePlan(plan, 0.0, 1))
    sink: list[Record] = []
    armed = []
    for r in plan.rules:
        d = holder.active.decide(r, FACTS.key, 1.0)
        if d is not None and r.unit is Unit.FLOW:
            armed.append(Armed(r.spec, r, d))
    faults = EventFaults(FACTS, holder, memory or Memory(), armed)
    return SsePipe("f1", "s_x", sink, lambda: 1.0, faults=faults), sink


def run(
    raw: bytes, cuts: list[int], rules: list[dict[str, Any]] | None = None
) -> tuple[bytes, list[dict[str, Any]], SsePipe]:
    pipe, sink = make_pipe(rules, memory=Memory())
    out = b""
    prev = 0
    for c in [*sorted(set(cuts)), len(raw)]:
        if c > prev:  # mitmproxy passes data chunks that are never empty; b"" means the end
            out += pipe.feed(raw[prev:c])
        prev = max(prev, c)
    out += pipe.feed(b"")
    return out, [as_record(r) for r in sink], pipe


def fields(raw: bytes) -> list[tuple[str | None, str, str | None, int | None, bool]]:
    d = SseDecoder()
    evs: list[SseEvent] = d.feed(raw)
    d.end_of_stream()
    return [(e.id, e.data, e.event, e.retry, e.has_data) for e in evs]


def without_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "t"} for r in records]


def test_reframing_keeps_every_event() -> None:
    out, sink, _ = run(RAW, [])
    assert fields(out) == fields(RAW)
    assert [r["type"] for r in sink].count("sent") == 5
    assert sum(1 for r in sink if r["type"] == "sent" and r["has_data"] and not r["priming"]) == 3


def test_split_at_every_byte_gives_the_same_events_and_records() -> None:
    whole, whole_sink, _ = run(RAW, [])
    for i in range(len(RAW) + 1):
        out, sink, _ = run(RAW, [i])
        assert fields(out) == fields(whole), f"split at byte {i}"
        assert without_time(sink) == without_time(whole_sink), f"split at byte {i}"


def test_byte_by_byte_with_faults_on() -> None:
    rules = [{"kind": "drop_priming", "rate": 1.0}, {"kind": "replay_after_ack", "rate": 1.0}]
    whole, whole_sink, _ = run(RAW, [], rules)
    out, sink, _ = run(RAW, list(range(len(RAW))), rules)
    assert fields(out) == fields(whole)
    assert without_time(sink) == without_time(whole_sink)
    assert fields(whole)[0][0] == "2", "the priming event was not dropped"


@given(st.lists(st.integers(min_value=0, max_value=len(RAW)), max_size=12))
def test_any_chunking_gives_the_same_output(cuts: list[int]) -> None:
    whole, whole_sink, _ = run(RAW, [])
    out, sink, _ = run(RAW, cuts)
    assert fields(out) == fields(whole)
    assert without_time(sink) == without_time(whole_sink)


def test_cut_mid_chunk_drops_the_rest() -> None:
    out, sink, pipe = run(RAW, [], [{"kind": "cut_stream", "rate": 1.0, "params": {"min_index": 2}}])
    assert len(fields(out)) == 2
    assert pipe.cut is not None and pipe.cut.fault == "cut_stream"
    assert [r["index"] for r in sink if r["type"] == "dropped"] == [2, 3, 4]


def test_executed_then_lost_matches_the_request_id_only() -> None:
    other = json.dumps({"jsonrpc": "2.0", "id": "1", "result": {}})  # a string ID is another request
    raw = b"data: " + other.encode() + b"\n\ndata: " + RESPONSE.encode() + b"\n\n"
    out, _, pipe = run(raw, [], [{"kind": "executed_then_lost", "rate": 1.0}])
    assert [f[1] for f in fields(out)] == [other]
    assert pipe.cut is not None and pipe.cut.fault == "executed_then_lost"


def test_memory_is_bounded() -> None:
    m = Memory(sessions=2, streams=2, depth=3, pool=4, ids=5)
    for s in range(4):
        for stream in ("a", "b", "c"):
            for i in range(5):
                m.remember(Remembered("f", i, f"s{s}", stream, f"{s}{stream}{i}", "d", "x", None))
    assert m.recent("s0", "a", 10) == []  # session evicted
    assert [r.event_id for r in m.recent("s3", "c", 10)] == ["3c2", "3c3", "3c4"]
    assert m.recent("s3", "a", 10) == []  # stream evicted within the session
    assert m.stream_of_id("0a0") is None and m.stream_of_id("3c4") == "c"  # opaque IDs: 5 kept


def test_the_fast_paths_agree_with_the_general_ones() -> None:
    for ev, eid in (
        (SseEvent(data="x y"), "e1"),
        (SseEvent(data="x"), None),
        (SseEvent(data=""), "p"),
        (SseEvent(data="a\nb"), "i"),
        (SseEvent(data="x", event="message"), "i"),
        (SseEvent(data="", has_data=False, retry=5), None),
    ):
        assert reencode(ev, eid) == encode_event(
            ev.data if ev.has_data else None, id=eid, event=ev.event, retry=ev.retry
        )
    for value in (None, "plain-id.1:2", 'quo"te', "back\\slash", "tab\t", "é"):
        assert json.loads(js(value)) == value


def test_other_stream_and_other_session_choices() -> None:
    m = Memory()
    d = Decider(1).draw("r", "k")
    m.remember(Remembered("f1", 1, "s1", "a", "id-a", "x", "x", None))
    m.remember(Remembered("f2", 1, "s1", "b", "id-b", "x", "x", None))
    m.remember(Remembered("f3", 1, "s2", "c", "id-c", "x", "x", None))
    other = m.other_stream("s1", "a", d)
    assert other is not None and other.event_id == "id-b"
    foreign = m.other_session("s1", d)
    assert foreign is not None and foreign.event_id == "id-c"
    assert m.other_stream("s9", "a", d) is None
    m.remember_token("s1", "t1")
    m.remember_token("s2", "t2")
    assert m.other_token("s2", "t2", d) == "t1"
    assert m.other_token("s1", "t1", d) == "t2"
    assert m.other_token("s1", "t2", d) is None  # the only other token is the one it has


# ---------------------------------------------------------------------- shortcuts: pass-through, short form


def long_form(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records as the checker reads them (short forms expanded)."""
    return expand_all([dict(r) for r in records])


def test_whole_events_no_fault_can_touch_pass_as_they_came() -> None:
    # CRLF line ends, a comment, an event type: re-encoding would change the bytes, not the events.
    chunk = b"id: 7\r\nevent: message\r\ndata: {}\r\n\r\n: ping\n\nid: 8\ndata: x\n\n"
    pipe, sink = make_pipe([])
    assert pipe.feed(chunk) == chunk
    half = b"id: 9\ndata: y"  # half an event is held back, never passed on
    assert pipe.feed(half) == b""
    assert fields(pipe.feed(b"\n\nid: 10\ndata: z\n\n")) == [
        ("9", "y", None, None, True),
        ("10", "z", None, None, True),
    ]
    fwd = [r for r in long_form([as_record(r) for r in sink]) if r["type"] == "forwarded"]
    assert [(r["index"], r["event_id"], r["source"], r["fault"]) for r in fwd] == [
        (i, eid, {"flow": "f1", "index": i}, None) for i, eid in enumerate(["7", "8", "9", "10"])
    ]


def test_an_untouched_forward_is_written_short_and_reads_as_before() -> None:
    _, sink, _ = run(RAW, [])
    assert not [r for r in sink if r["type"] == "forwarded"]  # every one folded into its `sent`
    records = long_form(sink)
    sent = [r for r in records if r["type"] == "sent"]
    fwd = [r for r in records if r["type"] == "forwarded"]
    assert "fwd" not in sent[0]
    assert fwd == [
        {
            "type": "forwarded",
            "flow": "f1",
            "t": 1.0,
            "index": s["index"],
            "event_id": s["event_id"],
            "digest": s["digest"],
            "source": {"flow": "f1", "index": s["index"]},
            "fault": None,
            "rule": None,
            "decision": None,
        }
        for s in sent
    ]


def test_a_planned_event_fault_still_writes_its_forwarded_record_with_the_fault() -> None:
    body = b"".join(
        encode_event(json.dumps({"jsonrpc": "2.0", "method": "m", "n": i}), id=f"x{i}") for i in range(4)
    )
    out, sink, _ = run(body, [], [{"kind": "replay_after_ack", "rate": 1.0}])
    written = [r for r in sink if r["type"] == "forwarded"]  # as written, not expanded
    faulted = [r for r in written if r["fault"] is not None]
    assert faulted and all(r["fault"] == "replay_after_ack" for r in faulted)
    assert all(r["rule"] and r["decision"].startswith("d_") for r in faulted)
    # An event forwarded after copies keeps its long form too (its record follows theirs).
    assert all(
        r["source"] == {"flow": "f1", "index": r["source"]["index"]} for r in written if not r["fault"]
    )
    records = long_form(sink)
    fwd = [r for r in records if r["type"] == "forwarded"]
    assert [r["index"] for r in fwd] == list(range(len(fwd))) == list(range(len(fields(out))))
    assert [r["event_id"] for r in fwd] == [e[0] for e in fields(out)]


# ---------------------------------------------------------------------- write receipts (the tap's `result`)


def _watch(
    calls: WriteCalls | None = None, own: WriteCall | None = None, session: str | None = "s_x"
) -> SsePipe:
    results = ResultWatch("f9", session, own, calls or WriteCalls())
    return SsePipe("f9", session, [], lambda: 5.0, results=results)


def _response(rid: object, **body: object) -> bytes:
    return encode_event(json.dumps({"jsonrpc": "2.0", "id": rid, **body}), id=f"e-{rid}")


def test_a_write_answer_on_its_own_stream_is_recorded_from_what_the_server_sent() -> None:
    own = WriteCall(7, "key-7", "ledger.append", "t_abc")
    pipe = _watch(own=own)
    result = {"content": [{"type": "text", "text": "receipt r-1 ✓"}], "isError": False}
    progress = encode_event(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress"}), id="p")
    pipe.feed(progress + _response(7, result=result) + _response(8, result={"other": 1}))
    [rec] = [as_record(r) for r in pipe.sink if as_record(r)["type"] == "result"]
    assert rec == {
        "type": "result",
        "flow": "f9",
        "t": 5.0,
        "session": "s_x",
        "auth": "t_abc",
        "jsonrpc_id": 7,
        "idempotency_key": "key-7",
        "tool": "ledger.append",
        "is_error": False,
        "result_digest": result_digest(result),
        "index": 1,  # the second event of the flow, as on its `sent` record
    }
    sent = [as_record(r) for r in pipe.sink if as_record(r)["type"] == "sent"]
    assert sent[1]["index"] == 1 and sent[1]["event_id"] == "e-7"
    # The digest is of the canonical JSON: key order and spacing do not change it.
    assert result_digest({"b": 1, "a": "é"}) == result_digest(json.loads('{ "a" : "é", "b" : 1 }'))
    assert result_digest({"a": 1}) != result_digest({"a": 2})


def test_errors_and_is_error_results_are_marked() -> None:
    own = WriteCall("w", "k", "ledger.append", None)
    pipe = _watch(own=own)
    pipe.feed(_response("w", error={"code": -32000, "message": "no"}))
    pipe.feed(_response("w", result={"isError": True, "content": []}))
    pipe.feed(_response(1, result={}))  # id 1 is not "w": a string id differs from a number
    recs = [as_record(r) for r in pipe.sink if as_record(r)["type"] == "result"]
    assert [(r["jsonrpc_id"], r["is_error"]) for r in recs] == [("w", True), ("w", True)]
    assert recs[0]["result_digest"] == result_digest({"code": -32000, "message": "no"})


def test_a_write_answer_replayed_on_a_get_of_the_session_is_recorded() -> None:
    calls = WriteCalls()
    calls.note("s_x", WriteCall(3, "key-3", "ledger.append", "t_1"))
    pipe = _watch(calls)
    pipe.feed(_response(3, result={"receipt": "r"}) + _response(4, result={}))
    recs = [as_record(r) for r in pipe.sink if as_record(r)["type"] == "result"]
    assert [(r["idempotency_key"], r["auth"]) for r in recs] == [("key-3", "t_1")]
    other = _watch(calls, session="s_other")  # another session's id 3 is another request
    other.feed(_response(3, result={}))
    assert not [r for r in other.sink if as_record(r)["type"] == "result"]


def test_a_dropped_response_is_still_a_result_the_server_sent() -> None:
    out, _, _ = run(RAW, [], [{"kind": "executed_then_lost", "rate": 1.0}])
    assert b'"result"' not in out
    own = WriteCall(1, "k", "echo", None)
    pipe, sink2 = make_pipe([{"kind": "executed_then_lost", "rate": 1.0}])
    pipe.results = ResultWatch("f1", "s_x", own, WriteCalls())
    pipe.feed(RAW)
    types = [as_record(r)["type"] for r in sink2]
    assert "result" in types and types.index("result") > types.index("sent")
    assert pipe.cut is not None


def test_write_calls_are_bounded() -> None:
    calls = WriteCalls(limit=3)
    for i in range(5):
        calls.note(f"s{i % 2}", WriteCall(i, f"k{i}", "t", None))
    assert calls.get("s0", 0) is None and calls.get("s0", 4) is not None
    assert calls.has("s1") and not calls.has("s9") and not calls.has(None)


def test_a_chunk_no_fault_is_due_on_passes_as_it_came_and_is_still_remembered() -> None:
    """Under rules that fire rarely (and need the memory), a chunk of whole events none
    of which a rule is due on goes on as the very bytes that came (no re-encoding), and
    each of its messages is remembered as a forwarded one would be."""
    memory = Memory()
    pipe, sink = make_pipe([{"kind": "replay_after_ack", "rate": 1e-9}], memory=memory)
    first = encode_event('{"jsonrpc": "2.0", "method": "m", "params": {"n": 0}}', id="a0")
    pipe.feed(first)  # the first event asks the rules: their next firing is far away
    chunk = b"".join(
        encode_event(json.dumps({"jsonrpc": "2.0", "method": "m", "params": {"n": n}}), id=f"a{n}")
        for n in range(1, 4)
    )
    assert pipe.feed(chunk) is chunk
    stream = "flow:f1"  # opaque IDs: the flow's own stream
    assert [r.event_id for r in memory.queue("s_x", stream)] == ["a0", "a1", "a2", "a3"]
    sent = [as_record(r) for r in sink if as_record(r)["type"] == "sent"]
    assert [r.get("fwd") for r in sent] == [0, 1, 2, 3]  # each forwarded untouched, in order


def test_an_event_past_the_bound_is_given_up_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    # A target that sends one event without end: the pipe holds at most the bound (and a
    # chunk), then says so once, forwards and records nothing more of the stream.
    monkeypatch.setattr(pipeline, "MAX_EVENT_CHARS", 200_000)
    sink: list[Record] = []
    pipe = SsePipe("f1", "s_x", sink, lambda: 5.0)
    assert pipe.feed(b'id: 1\ndata: {"jsonrpc":"2.0","method":"x"}\n\n') != b""
    out = [pipe.feed(b"data: " + b"x" * 65536) for _ in range(8)]
    assert out[:3] == [b"", b"", b""]  # half an event is never passed on
    assert pipe.over_limit is not None and 200_000 < pipe.over_limit <= 200_000 + 65536 + 6
    oversize = [as_record(r) for r in sink if as_record(r)["type"] == "oversize"]
    assert oversize == [
        {"type": "oversize", "flow": "f1", "t": 5.0, "index": 1, "chars": pipe.over_limit, "limit": 200_000}
    ]
    before = len(sink)
    assert pipe.feed(b"\n\nid: 2\ndata: {}\n\n") == b"" and pipe.feed(b"") == b""
    assert len(sink) == before  # nothing more recorded
    assert pipe._decoder.pending_chars == 0  # what was held is let go


def test_an_event_within_the_bound_passes_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: the same event under a larger bound is held until its end, then passed.
    monkeypatch.setattr(pipeline, "MAX_EVENT_CHARS", 10_000_000)
    sink: list[Record] = []
    pipe = SsePipe("f1", "s_x", sink, lambda: 5.0)
    for _ in range(8):
        assert pipe.feed(b"data: " + b"x" * 65536) == b""
    assert pipe.feed(b"\n\n").count(b"data: ") == 8 and pipe.over_limit is None
