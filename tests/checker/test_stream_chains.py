"""Resumption chains of any depth resolve to the stream they resume, in one pass.

A server that polls (closes a call's stream after every event, `retry: 0`) makes every
event a new resumption of the one before: the chain is as long as the stream. Here a
POST stream with opaque event IDs is resumed 100 times in a row, each resumption
carrying one new event; every flow must carry the POST's logical stream, and every
event's home must be that stream (a cap on resolution rounds judged the deep links off
their stream: gate 1 then blamed a legal server)."""

from __future__ import annotations

from pathlib import Path

from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.load import load_run
from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Verdict
from lab.checker.truth.streams import stream_truth
from lab.sut.protocol import message_digest
from tests.sut.wire_builder import T0, Wire

LINKS = 100


def polling_chain(run_dir: Path, links: int) -> tuple[str, list[str]]:
    """(the POST's flow, every resumption flow): one event per flow, opaque IDs."""
    w = Wire()
    c = w.init("c1", T0)
    assert c.session is not None
    post = w._flow(c, T0 + 0.1, "POST", session=c.session, rpc_method="tools/call", rpc_id=2, key="k1")
    flows = [post]
    t = T0 + 0.2
    for n in range(links + 1):
        flow = flows[-1]
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": 2, "progress": n},
        }
        event_id = f"x{n:04d}"  # opaque: says nothing about its stream
        w.tap.append(
            {
                "type": "sent",
                "flow": flow,
                "t": t,
                "index": 0,
                "event_id": event_id,
                "digest": message_digest(message),
                "has_data": True,
                "priming": False,
                "stream_id": None,
                "session": c.session,
                "retry": 0,
            }
        )
        w.forward(flow, 0, t, event_id, message_digest(message), (flow, 0))
        w.deliver(c, t + 0.001, message, None)
        w._end(flow, t + 0.002)
        if n < links:
            flows.append(w._flow(c, t + 0.003, "GET", session=c.session, cursor=event_id))
        t += 0.01
    w.write(run_dir)
    return post, flows[1:]


def test_a_100_link_resumption_chain_resolves_to_its_post_stream(tmp_path: Path) -> None:
    post, resumptions = polling_chain(tmp_path / "run", LINKS)
    data = load_run(tmp_path / "run")
    truth = stream_truth(Context(data, parse_budgets(data.run)))
    logical = dict(zip(truth.flows["flow"], truth.flows["logical"], strict=True))
    assert len(resumptions) == LINKS
    assert {logical[f] for f in resumptions} == {logical[post]}
    assert logical[post] == f"flow:{post}"
    homes = truth.sent.loc[truth.sent["priming"].eq(False), "home"]
    assert len(homes) == LINKS + 1
    assert set(homes) == {logical[post]}


def test_a_legal_polling_server_passes_gate_1(tmp_path: Path) -> None:
    polling_chain(tmp_path / "run", LINKS)
    _, report = judge_dir(tmp_path / "run")
    gate = next(g for g in report.gates if g.gate == "cross_stream")
    assert gate.verdict is not Verdict.FAIL, gate


def test_a_resumption_is_resolved_by_the_clients_own_evidence_not_by_the_first_stream_with_its_id(
    tmp_path: Path,
) -> None:
    # A server that counts IDs per stream: two calls of one session both send "0", "1", ...
    # The second call's stream is cut and resumed from its own last ID, which the first
    # call sent first. The client's ledger says which stream it resumed, and its inbox
    # that it accepted that ID on that stream: the resumption carries the second call's
    # stream, and the events the server sends on it are at home there.
    from tests.checker.builders import Sim

    sim = Sim(opaque_ids=True, per_stream_ids=True)
    sim.budgets["min_events"] = 5
    sim.initialize("a")
    first, second = sim.call("a", 1), sim.call("a", 2)
    for st in (first, second):
        for n in range(3):
            sim.send(
                st,
                f'{{"jsonrpc":"2.0","method":"notifications/message","params":{{"s":"{st.key}","n":{n}}}}}',
            )
    opened = second.flow
    sim.cut_and_resume(second)
    resumed = second.flow
    for n in range(3, 5):
        sim.send(
            second,
            f'{{"jsonrpc":"2.0","method":"notifications/message","params":{{"s":"{second.key}","n":{n}}}}}',
        )
    run_dir = sim.write(tmp_path / "run")
    data = load_run(run_dir)
    truth = stream_truth(Context(data, parse_budgets(data.run)))
    logical = truth.flows.set_index("flow")["logical"]
    assert logical[resumed] == logical[opened] != logical[first.flow]
    _, report = judge_dir(run_dir)
    g = next(x for x in report.gates if x.gate == "cross_stream")
    # The server's reused IDs are its own violation; the client filed every event right.
    assert {w.check for w in g.witnesses} == {"event_id_reused"}, [w.explanation for w in g.witnesses]
    assert g.measured["not_sent_on_stream"] == 0
