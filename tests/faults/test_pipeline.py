"""The SSE pipe on its own: re-framing is invariant under any chunking, faults included."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lab.faults.pipeline import (
    ActivePlan,
    Memory,
    PipeContext,
    PlanHolder,
    Record,
    Remembered,
    SsePipe,
    as_record,
    js,
    reencode,
)
from lab.faults.plan import Decider, FaultKind, Target, parse_plan
from lab.wire.sse import SseDecoder, SseEvent

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


def make_pipe(
    rules: list[dict[str, Any]] | None = None, *, memory: Memory | None = None
) -> tuple[SsePipe, list[Record]]:
    plan = parse_plan({"seed": 5, "rules": rules or []})
    holder = PlanHolder(ActivePlan(plan, 0.0, 1))
    sink: list[Record] = []
    ctx = PipeContext("f1", "c1:1", Target("POST", "post", "tools/call", "echo", "s_x"), "s_x", jsonrpc_id=1)
    for r in plan.rules:
        d = holder.active.decide(r, ctx.key, 1.0)
        if d is not None and r.kind in (FaultKind.DROP_PRIMING, FaultKind.EXECUTED_THEN_LOST):
            ctx.armed[r.kind] = (r, d)
    return SsePipe(ctx, holder, sink, lambda: 1.0, memory=memory), sink


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
    assert pipe.cut is not None and pipe.cut.fault is FaultKind.CUT_STREAM
    assert [r["index"] for r in sink if r["type"] == "dropped"] == [2, 3, 4]


def test_executed_then_lost_matches_the_request_id_only() -> None:
    other = json.dumps({"jsonrpc": "2.0", "id": "1", "result": {}})  # a string ID is another request
    raw = b"data: " + other.encode() + b"\n\ndata: " + RESPONSE.encode() + b"\n\n"
    out, _, pipe = run(raw, [], [{"kind": "executed_then_lost", "rate": 1.0}])
    assert [f[1] for f in fields(out)] == [other]
    assert pipe.cut is not None and pipe.cut.fault is FaultKind.EXECUTED_THEN_LOST


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
    from lab.wire.sse import SseEvent, encode_event

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
