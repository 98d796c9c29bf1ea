"""Client check 10 — no request re-sent without the application asking, unless the tool
says it is safe to.

The lab's load sends each call once, under its own idempotency key (its call ID). From
the wire: a `tools/call` POST carrying a key an earlier POST of the same client carried
is a request the implementation re-sent on its own (`resent_request`) — in a new session
(the request moved into another session as if nothing happened) or in the same one (a
disconnect answered by a new POST instead of a resumption). The server's deduplication
may hide the damage; the wire shows the attempt.

The retry rule clients converge on for an outcome they cannot know (the call may have
run, its answer was lost): re-send only a tool its server annotated `readOnlyHint` or
`idempotentHint` in `tools/list`, or a call carrying an idempotency key the server says
it honours for that tool (`_meta["mcp-lab/idempotency-key"]: true` in its entry; every
re-send found here carries its key, since the key is how it is found) — as the tap's
`tools` records show the client was told before the re-send — else report the outcome as
unknown to the application. A re-send of such a tool is allowed (`resent_allowed`); one
of any other tool, or of a tool the client was never told about (the spec's default for
both hints is false), is the finding (`resent_request`).

In the modern era (2026-07-28) a broken response stream is the cancellation of its
request, and a client that still wants the result re-issues the call: the re-send is
how that era recovers, judged by the same rule of the tool. It must carry a new request
ID every time: a re-issue under the JSON-RPC ID of the request it replaces
(`reissued_same_id`, judged on requests whose `MCP-Protocol-Version` names a modern
revision) answers a request the server was told is gone; a server may take it for a
duplicate, or relabel the old stream's late answer as the new one's.

Attribution: client. Evidence: at least one stream of a call lost on the wire.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.truth import client_wire
from lab.checker.truth.client_delivery import recoveries
from lab.wire.extensions import IDEMPOTENCY_META as KEY_HONOURED
from lab.wire.revisions import MODERN_REVISIONS

TRUTH_FROM = "the wire (the proxy's record): idempotency keys of each client's tools/call requests"


SAFE_TO_RESEND = ("readOnlyHint", "idempotentHint", KEY_HONOURED)
"""What makes a re-send safe: either annotation, or the server's word that it honours the
call's idempotency key for the tool."""


def findings(ctx: Context) -> pd.DataFrame:
    """Every re-send, with `allowed`: its tool was annotated safe to re-send; and
    `same_id`: a modern-era re-issue under the request ID of the request it replaces."""
    flows = client_wire.flows(ctx)
    att = client_wire.attempts(ctx)
    resent = att[att["kind"] == "resend"]
    by_flow = flows.set_index("flow")
    out = resent.assign(
        call=resent["flow"].map(by_flow["key"]),
        tool=resent["flow"].map(by_flow["tool"]),
        session=resent["flow"].map(by_flow["session"]),
        first_session=resent["previous"].map(by_flow["session"]),
        rpc_id=resent["flow"].map(by_flow["rpc_id"]),
        first_rpc_id=resent["previous"].map(by_flow["rpc_id"]),
        version=resent["flow"].map(by_flow["version"]),
    )
    out["same_id"] = (
        out["version"].astype("object").isin(MODERN_REVISIONS)
        & out["rpc_id"].notna()
        & (out["rpc_id"].astype("object") == out["first_rpc_id"].astype("object"))
    )
    out["new_session"] = out["session"].astype(object) != out["first_session"].astype(object)
    told = _told(ctx, by_flow["client_id"])
    annotations = [
        _known(told.get(str(c), []), float(t)).get(str(tool))
        for c, t, tool in zip(out["client_id"], out["t_req"], out["tool"], strict=True)
    ]
    out["annotations"] = pd.Series(annotations, index=out.index, dtype="object")
    out["allowed"] = [a is not None and any(a.get(k) is True for k in SAFE_TO_RESEND) for a in annotations]
    return out


def _told(ctx: Context, client_of_flow: pd.Series) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """client -> (when, {tool: annotations}) of each tools/list answer it was given."""
    out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    tools = ctx.data.tap_records("tools")
    for flow, t, listed in zip(tools["flow"], tools["t"], tools["tools"], strict=True):
        client = client_of_flow.get(flow)
        if isinstance(client, str) and isinstance(listed, dict):
            out.setdefault(client, []).append((float(t), listed))
    return out


def _known(told: list[tuple[float, dict[str, Any]]], before: float) -> dict[str, dict[str, Any]]:
    """What the client had been told of each tool by `before`: the latest listing wins."""
    known: dict[str, dict[str, Any]] = {}
    for t, listed in sorted(told, key=lambda x: x[0]):
        if t <= before:
            known.update({str(k): v for k, v in listed.items() if isinstance(v, dict)})
    return known


def check(ctx: Context) -> GateResult:
    every = findings(ctx)
    bad = every[~every["allowed"]]
    same_id = every[every["same_id"]]
    allowed = int(every["allowed"].sum()) if len(every) else 0
    losses = len(recoveries(ctx))
    evidence = [Evidence("streams of a call lost", 1, losses, losses >= 1, "disconnects on the wire")]
    moved = int(bad["new_session"].sum()) if len(bad) else 0
    violations = len(bad) + len(same_id)
    witnesses = [_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()]
    witnesses += [_same_id_witness(r, ctx) for _, r in same_id.head(ctx.witness_limit).iterrows()]
    reissued = int(every["version"].astype("object").isin(MODERN_REVISIONS).sum()) if len(every) else 0
    return GateResult(
        verdict=decide(violations > 0, evidence),
        summary=(
            f"{len(bad)} request(s) re-sent by the implementation ({moved} into a new session), "
            f"{allowed} re-send(s) of a tool annotated safe to re-send; {len(same_id)} of {reissued} "
            f"modern-era re-issue(s) under the request ID they replace; {losses} disconnects"
        ),
        budget={"violations_max": 0},
        measured={
            "resent": len(bad),
            "into_a_new_session": moved,
            "resent_allowed": allowed,
            "modern_reissues": reissued,
            "reissued_same_id": len(same_id),
            "disconnects": losses,
        },
        evidence=tuple(evidence),
        violations=violations,
        witnesses=tuple(witnesses[: ctx.witness_limit]),
        attribution_counts={"client": violations},
        truth_from=TRUTH_FROM,
    )


def _same_id_witness(r: pd.Series, ctx: Context) -> Witness:
    text = (
        f"client {r['client_id']} re-issued call {r['call']} ({r['tool']}) {at(r['t_req'], ctx.origin)} in the "
        f"modern era ({r['version']}) under request ID {r['rpc_id']}, the ID of the request whose stream it "
        "replaces: a broken stream cancelled that request, and a re-issue is a new request with a new ID"
    )
    fields = row_of(r, ["client_id", "call", "tool", "flow", "previous", "rpc_id", "version", "t_req"])
    refs = client_wire.ref(r, "previous_line") + client_wire.ref(r)
    return Witness("reissued_same_id", text, Attribution.CLIENT, fields, tuple(refs))


def _witness(r: pd.Series, ctx: Context) -> Witness:
    where = (
        f"into a new session ({r['session']}, first sent in {r['first_session']})"
        if r["new_session"]
        else "in the same session"
    )
    ann = r["annotations"]
    told = (
        "was never annotated to it (tools/list not seen: both hints default to false)"
        if ann is None
        else f"is annotated {_hints(ann)} in the tools/list it was given"
    )
    text = (
        f"client {r['client_id']} sent call {r['call']} ({r['tool']}) again {at(r['t_req'], ctx.origin)}, "
        f"{where}, {float(r['waited_s']):.3f} s after its first request ended; the application sent it "
        f"once, and the tool {told}: its outcome was unknown and had to be reported so, not re-sent"
    )
    fields = row_of(r, ["client_id", "call", "tool", "flow", "previous", "session", "first_session", "t_req"])
    refs = client_wire.ref(r, "previous_line") + client_wire.ref(r)
    return Witness("resent_request", text, Attribution.CLIENT, fields, tuple(refs))


def _hints(ann: dict[str, Any]) -> str:
    given = [f"{k}={str(ann[k]).lower()}" for k in SAFE_TO_RESEND if k in ann]
    return ", ".join(given) if given else "with neither readOnlyHint nor idempotentHint, nor a key it honours"


RULE = Rule(
    id="client_resend",
    number=12,
    title="No request re-sent without the application asking",
    blames=(Attribution.CLIENT,),
    evidence="tools/call requests on the wire",
    check=None,
    check_under_test=check,
)
