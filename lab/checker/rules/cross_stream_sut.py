"""Gate 1 for a client under test — messages delivered to the application that do not
belong to the stream they came on (budget: cross_stream_max, 0).

- The server's side, from the wire: every check of lab.checker.truth.wire (an event sent off
  its home stream, a replay before the cursor, ...), attributed to the server, whatever
  any client did with it.
- The client's side, from the application log joined to the tap
  (lab.checker.truth.client_delivery): a message the implementation handed its application
  - `delivered_foreign`: whose home (where the server first sent it) is another stream
    or session than the one the client meant (its intended stream: a resumption means
    the stream whose event ID it resumes from);
  - `delivered_made_up`: that the proxy made up (the server never sent it);
  - `delivered_altered`: a response for one of its calls that matches no message the
    server sent on that call's streams (e.g. another stream's response handed over
    under this call's id).
  Attributed to the client: a client must check that what arrives belongs where it
  arrived; the witness names the proxy fault that showed it the message.

Deliveries matching no forwarded SSE event (JSON answers, errors the implementation made
up) are counted (`not_from_an_event`), not judged. Evidence: the run's event count,
crossings injected (proxy-faulted events that are not the server's event of that flow,
or a Last-Event-ID the proxy rewrote), at least one delivery matched to the wire.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, fault_refs, present, row_of, short
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs, app_ref
from lab.checker.truth.client_delivery import deliveries
from lab.checker.truth.faults import faulted_forwards, rewritten_cursor
from lab.checker.truth.wire import server_sends, server_witness

TRUTH_FROM = (
    "the server's side from the wire (the proxy's record); the client's from its application log matched to "
    "what the proxy forwarded"
)
CLIENT_CHECKS = {
    "foreign": "delivered_foreign",
    "made_up": "delivered_made_up",
    "altered": "delivered_altered",
}


def crossings_injected(ctx: Context, client_flows: set[object]) -> int:
    """Proxy-faulted events forwarded to a client that came from another flow (or none),
    plus requests whose Last-Event-ID the proxy rewrote."""
    fwd = faulted_forwards(ctx)
    fwd = fwd[fwd["flow"].isin(client_flows)]
    src = fwd["src_flow"]
    moved = int((src.isna() | (src != fwd["flow"])).sum())
    moved += int(fwd["fault"].isin(("cross_ids",)).sum())  # the server's event under another stream's ID
    return moved + int(rewritten_cursor(ctx.data.tap_records("flow")).sum())


def check(ctx: Context) -> GateResult:
    dl = deliveries(ctx)
    bad = dl[dl["match"].isin(tuple(CLIENT_CHECKS))].sort_values("t", kind="stable")
    truth_ctx = client_wire.truth_context(ctx)
    server_bad = server_sends(truth_ctx)
    count = len(bad) + len(server_bad)
    budget = ctx.budgets.cross_stream_max
    matched = int((dl["match"] == "ok").sum())
    injected = crossings_injected(ctx, set(client_wire.flows(ctx)["flow"].tolist()))
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "crossings injected", 1, injected, injected >= 1, "proxy-faulted events from another stream"
        ),
        Evidence(
            "deliveries matched to the wire",
            1,
            matched,
            matched >= 1,
            "the application log matched to the proxy's record",
        ),
    ]
    witnesses = [_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()]
    witnesses += [server_witness(r, truth_ctx) for _, r in server_bad.head(ctx.witness_limit).iterrows()]
    by_check = {name: int((bad["match"] == m).sum()) for m, name in CLIENT_CHECKS.items()}
    return GateResult(
        verdict=decide(count > budget, evidence),
        summary=(
            f"{len(bad)} message(s) of another stream delivered to the application, {len(server_bad)} sent "
            f"off their stream by the server (budget {budget}); {matched} deliveries checked"
        ),
        budget={"cross_stream_max": budget},
        measured={
            "deliveries": len(dl),
            "deliveries_checked": matched,
            "not_from_an_event": int((dl["match"] == "unmatched").sum()),
            "home_unknown": int((dl["match"] == "unknown").sum()),
            **by_check,
            "server_sent_off_stream": len(server_bad),
            "crossings_injected": injected,
        },
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(witnesses),
        attribution_counts={"client": len(bad), "server": len(server_bad)},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    match = str(r["match"])
    what = (
        f"{r['kind']}"
        + (f" {r['method']}" if present(r["method"]) else "")
        + (f" (id {r['id']}, for its call {r['call']})" if present(r["call"]) else "")
    )
    fault = f" after the proxy's {r['fault']} fault" if present(r["fault"]) else ""
    if match == "foreign":
        why = f"the server first sent it on stream {r['home']}, but the client meant stream {r['intended']}"
    elif match == "made_up":
        why = "the proxy made it up: the server never sent it"
    else:
        why = (
            "it matches no message the server sent on the call's streams: the implementation handed over "
            "another message as this call's answer"
        )
    text = (
        f"client {r['client_id'] if 'client_id' in r else r['client']} delivered {what} (message "
        f"{short(r['digest'])}) to its application {at(r['t'], ctx.origin)}, from flow {r['flow']}{fault}: {why}"
    )
    fields = row_of(
        r,
        [
            "client",
            "session",
            "kind",
            "id",
            "method",
            "call",
            "digest",
            "t",
            "flow",
            "event_id",
            "fault",
            "home",
            "intended",
        ],
    )
    refs = app_ref(app_logs(ctx), r)
    if present(r.get("fwd_line")):
        refs.append(f"proxy/tap.jsonl:{int(r['fwd_line'])}")
    refs += fault_refs([r.get("decision")])
    return Witness(CLIENT_CHECKS[match], text, Attribution.CLIENT, fields, tuple(refs))
