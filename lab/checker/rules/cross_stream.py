"""Gate 1 — events accepted on a stream they do not belong to (budget: 0).

Every non-priming inbox receipt (client, session generation, stream key, event ID,
digest) is checked against what the server sent (`lab.checker.truth.streams`: the tap's
`sent` records, plus server-ledger events the tap lacks):

- `not_sent_on_stream`: the client filed the event under a stream key whose logical
  stream is S, but the server never sent that event (same session, same event ID, same
  digest; for events without an ID, the same digest) with home S. A message the client
  got as the plain JSON body of its own POST (no SSE, no ID) is legitimate when it came
  on the connection of that very POST.
- `response_on_wrong_stream`: a JSON-RPC response (or error) accepted on `post:<rid>`
  whose id is not rid, or on a standalone `get:<n>` stream (a response may only
  end the POST stream it belongs to).

A receipt whose stream key maps to no logical stream (the tap has no flow for that
POST, the client ledger no exchange for that GET) or whose event the tap never saw at
all is *unverifiable*: the gate cannot pass while any exists.

Attribution of each violation: `client` when a proxy fault forwarded that event on the
delivering connection (the tap's `forwarded` record with a fault: the client should have
rejected it) or when the server sent it correctly elsewhere; `server` when the server
itself sent it on the delivering connection although its home is another stream (the
pre-fault `sent` record), or sent a response on the wrong POST stream. Proxy faults
the client did reject (its `events_rejected` rows matching a faulted `forwarded`
record) are counted as `proxy_fault_rejected`.

Every event a lab client rejected gets an explanation (lab.checker.truth.rejections),
counted in `rejections_explained` and said in a note; an unexplained one the server sent
on that connection is a server violation (`rejected_unexplained`, with the server checks).

Evidence: the run's event count >= min_events, at least one stream crossing injected
(a faulted `forwarded` event whose source is another flow, is made up, or carries another
ID than the server gave it; or a `Last-Event-ID` the proxy rewrote), no unverifiable
receipt, every client ledger readable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context, in_keys, rows_in, text_ids, text_key
from lab.checker.explain import at, client_ref, present, row_of, short, spread_head
from lab.checker.inputs.load import ROWID, SOURCE
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.cross_stream_sut import check as read_under_test
from lab.checker.truth.faults import faulted_forwards, rewritten_cursor
from lab.checker.truth.rejections import counts, explained_rejections
from lab.checker.truth.streams import StreamTruth, client_sessions, stream_truth
from lab.checker.truth.wire import CHECKS, describe_flow, server_sends, server_witness

RECEIPT_COLUMNS = [
    "client_id",
    "session_generation",
    "stream_key",
    "event_id",
    "message_digest",
    "kind",
    "jsonrpc_id",
    "conn_id",
    "accepted_at",
]


def check(ctx: Context) -> GateResult:
    inbox = ctx.require_client("inbox")
    truth = stream_truth(ctx)
    receipts = _receipts(ctx, inbox, truth)
    status = _classify(receipts, truth, ctx)
    receipts["status"] = status
    receipts["wrong_response"] = _wrong_responses(receipts)
    violation = (status == "not_sent_on_stream") | receipts["wrong_response"]
    bad = receipts[violation].sort_values("accepted_at", kind="stable")
    server_bad = server_sends(ctx)

    crossings = _crossings_injected(ctx) if truth.from_tap else None
    rejected = _rejections(ctx, truth)
    unverifiable = int((status == "unverifiable").sum())
    count = len(bad) + len(server_bad)
    budget = ctx.budgets.cross_stream_max
    evidence = _evidence(ctx, crossings, len(receipts), unverifiable)
    attribution_counts = {
        str(Attribution.SERVER): len(server_bad),
        str(Attribution.CLIENT): len(bad),
        str(Attribution.PROXY_FAULT_REJECTED): int(sum(rejected["by_fault"].values())),
    }
    failed = count > budget
    verdict = decide(failed, evidence)
    witnesses = tuple(
        server_witness(row, ctx) for _, row in spread_head(server_bad, ctx.witness_limit).iterrows()
    )
    witnesses += tuple(_witness(row, truth, ctx) for _, row in bad.head(ctx.witness_limit).iterrows())
    notes = _notes(receipts[status == "unverifiable"], truth) + _rejection_notes(rejected)
    summary = (
        f"{len(bad)} of {len(receipts)} messages the clients accepted were on a stream they do not "
        f"belong to, and the server sent {len(server_bad)} event(s) where they do not belong "
        f"(budget {budget}); {_SEEN_BY[truth.source]}"
    )
    measured = _measured(
        receipts, status, server_bad, truth, count=count, crossings=crossings, rejected=rejected
    )
    return GateResult(
        verdict=verdict,
        summary=summary,
        budget={"cross_stream_max": budget},
        measured=measured,
        evidence=tuple(evidence),
        violations=count,
        witnesses=witnesses,
        attribution_counts=attribution_counts,
        notes=tuple(notes),
    )


def _evidence(ctx: Context, crossings: int | None, receipts: int, unverifiable: int) -> list[Evidence]:
    """The gate's evidence: events, stream crossings injected (none shown without a tap),
    receipts checked, no unverifiable receipt, and the client's."""
    evidence = [ctx.events_evidence()]
    if crossings is None:
        evidence.append(
            Evidence(
                "stream crossings injected",
                1,
                None,
                False,
                "no proxy record (tap): no stream crossing can be shown to have been injected",
                from_faults=True,
            )
        )
    else:
        evidence.append(
            Evidence(
                "stream crossings injected",
                1,
                crossings,
                crossings >= 1,
                "events a fault moved to another request's stream or gave another ID, and cursors "
                "(Last-Event-ID) the proxy rewrote",
                from_faults=True,
            )
        )
    evidence.append(
        Evidence(
            "accepted messages checked",
            1,
            receipts,
            receipts >= 1,
            "messages the clients accepted (their inbox receipts; priming events not counted): "
            "without any, no client acceptance was judged",
        )
    )
    evidence.append(
        Evidence(
            "accepted messages not checkable",
            0,
            unverifiable,
            unverifiable == 0,
            "accepted messages whose stream or event neither the proxy's record nor the server ledger shows",
        )
    )
    evidence.extend(ctx.client_evidence())
    return evidence


_SEEN_BY = {
    "tap": "as the proxy saw the server send them",
    "tap+server": "as the proxy saw the server send them, and its own ledger says",
    "server": "as the server's own ledger says (no proxy record to check it against)",
}
"""The summary's plain words for where the truth came from (measured `truth_source`)."""


def _notes(unverified: pd.DataFrame, truth: StreamTruth) -> list[str]:
    """The gate's notes: receipts that could not be verified (a few named), and per-session
    event IDs (replays then judged within their session)."""
    notes = []
    if len(unverified):
        sample = unverified.head(3)
        keys = ", ".join(
            f"client {r.client_id}, stream {r.stream_key}, event {r.event_id}" for r in sample.itertuples()
        )
        notes.append(
            f"{len(unverified)} accepted message(s) could not be checked against what the server sent "
            f"(e.g. {keys})"
        )
    if truth.shared_ids:
        notes.append(
            f"the server's event IDs are per session ({truth.shared_ids} ID(s) sent live in several "
            "sessions): replays are judged within their own session, not across sessions"
        )
    return notes


def _rejection_notes(rejected: dict[str, Any]) -> list[str]:
    """One sentence on why the clients rejected what they rejected."""
    got = rejected.get("explained") or {}
    if not rejected.get("total"):
        return []
    said = {
        "fault": "a fault of the lab forwarded the message",
        "cursor_rewrite": "the lab rewrote the cursor",
        "after_fault": "a fault took an earlier event of the connection",
        "consequence": "about the client's own state (a duplicate, a connection it gave up, an old session)",
        "unverifiable": "the proxy has no record of the connection",
        "unexplained": "unexplained (each one the server sent is a server finding: rejected_unexplained)",
    }
    parts = [f"{got[k]:,} {text}" for k, text in said.items() if got.get(k)]
    return [f"{rejected['total']:,} event(s) rejected by the lab's clients: " + "; ".join(parts)]


def _measured(
    receipts: pd.DataFrame,
    status: pd.Series,
    server_bad: pd.DataFrame,
    truth: StreamTruth,
    *,
    count: int,
    crossings: int | None,
    rejected: dict[str, Any],
) -> dict[str, Any]:
    """report.json `measured` of gate 1: receipts by status, the server's offending sends
    by check, crossings injected and events the client rejected."""
    by_check = server_bad["check"].value_counts()
    return {
        "receipts_checked": len(receipts),
        "verified": int((status == "verified").sum()),
        "json_responses": int((status == "json_response").sum()),
        "violations": count,
        "not_sent_on_stream": int((status == "not_sent_on_stream").sum()),
        "response_on_wrong_stream": int(receipts["wrong_response"].sum()),
        "unverifiable": int((status == "unverifiable").sum()),
        "server_violations": len(server_bad),
        "server_by_check": {name: int(by_check.get(name, 0)) for name in CHECKS},
        "foreign_session_replays": int(server_bad["foreign"].astype(bool).sum()) if len(server_bad) else 0,
        "ids_shared_across_sessions": truth.shared_ids,
        "crossings_injected": crossings,
        "rejected_events": rejected["total"],
        "rejected_by_reason": rejected["by_reason"],
        "proxy_faults_rejected": rejected["by_fault"],
        "rejections_explained": rejected["explained"],
        "truth_source": truth.source,
    }


def _receipts(ctx: Context, inbox: pd.DataFrame, truth: StreamTruth) -> pd.DataFrame:
    where = [c for c in (SOURCE, ROWID) if c in inbox.columns]  # for the witnesses' refs
    r = inbox.loc[inbox["kind"] != "priming", [*RECEIPT_COLUMNS, *where]].reset_index(drop=True)
    r["receipt"] = np.arange(len(r))
    r["session_generation"] = r["session_generation"].astype("int64")
    r["conn_id"] = r["conn_id"].astype("Int64")
    r["synthetic"] = pd.Series(
        [str(e).startswith("~") for e in r["event_id"].tolist()], index=r.index, dtype=bool
    )
    r = r.merge(client_sessions(ctx), on=["client_id", "session_generation"], how="left")
    delivering = truth.flows[
        ["client_id", "conn_id", "flow", "session", "method", "jsonrpc_id", "has_events"]
    ]
    delivering = delivering[delivering["client_id"].notna()].drop_duplicates(["client_id", "conn_id"])
    delivering = delivering.rename(
        columns={
            "flow": "d_flow",
            "session": "d_session",
            "method": "d_method",
            "jsonrpc_id": "d_jsonrpc_id",
            "has_events": "d_has_events",
        }
    )
    r = r.merge(delivering, on=["client_id", "conn_id"], how="left")
    # The client's own record of its session first; the session the delivering request
    # carried (tap) when the client ledger does not say.
    r["session"] = r["session"].where(r["session"].notna(), r["d_session"]).astype("object")
    return r.sort_values("receipt").reset_index(drop=True)


def _classify(r: pd.DataFrame, truth: StreamTruth, ctx: Context) -> pd.Series:
    """verified | json_response | not_sent_on_stream | unverifiable, per receipt."""
    sent = truth.sent
    cand = r[
        ["receipt", "client_id", "session", "stream_key", "event_id", "message_digest", "synthetic"]
    ].merge(
        truth.stream_map[["client_id", "session", "stream_key", "logical"]],
        on=["client_id", "session", "stream_key"],
        how="inner",
    )
    with_id = sent["event_id"].notna()
    ids, no_ids = sent[with_id], sent[~with_id]
    synthetic = np.asarray(cand["synthetic"].to_numpy(), dtype=bool)
    c_syn, c_id = cand[synthetic], cand[~synthetic]
    ok = np.zeros(len(cand), dtype=bool)
    ok[synthetic] = rows_in(
        [c_syn["session"], c_syn["logical"], c_syn["message_digest"]],
        [no_ids["session"], no_ids["home"], no_ids["digest"]],
    )
    ok[~synthetic] = rows_in(
        [c_id["session"], c_id["logical"], c_id["event_id"], c_id["message_digest"]],
        [ids["session"], ids["home"], ids["event_id"], ids["digest"]],
    )
    verified = set(cand.loc[ok, "receipt"])
    mapped = set(cand["receipt"])

    receipt = r["receipt"]
    status = pd.Series("not_sent_on_stream", index=r.index, dtype="object")
    status[~receipt.isin(mapped) | r["session"].isna()] = "unverifiable"
    json_ok = _json_responses(r, truth, ctx)
    status[json_ok & ~receipt.isin(verified)] = "json_response"
    status[receipt.isin(verified)] = "verified"
    # An event the server-side records never show at all (no event of that ID in that
    # session; for an event without ID, no such message in that session) cannot be
    # judged either way — unless a proxy fault made it (its forwarded record says so).
    # Not the digest alone: the same message (a progress tick) goes to many sessions.
    suspects = r[status == "not_sent_on_stream"]  # usually none: only they need the test
    if len(suspects):
        unseen = np.where(
            suspects["synthetic"],
            ~rows_in([suspects["session"], suspects["message_digest"]], [sent["session"], sent["digest"]]),
            ~rows_in([suspects["session"], suspects["event_id"]], [ids["session"], ids["event_id"]]),
        )
        never_seen = pd.Series(False, index=r.index)
        never_seen[suspects.index] = unseen
        if truth.from_tap:
            never_seen = never_seen & ~_faulted_delivery(r, ctx)
        status[(status == "not_sent_on_stream") & never_seen] = "unverifiable"
    return status


def _json_responses(r: pd.DataFrame, truth: StreamTruth, ctx: Context) -> pd.Series:
    """Synthetic-ID receipts that were the plain JSON body of the stream's own POST."""
    plain = pd.Series(False, index=r.index)
    s = r[r["synthetic"]]  # only messages without an event ID can be a JSON body
    if not len(s):
        return plain
    if truth.from_tap:
        own_post = (s["d_method"] == "POST") & ("post:" + s["d_jsonrpc_id"].astype(str) == s["stream_key"])
        # d_has_events is null for a connection the tap has no flow of: not a JSON body then.
        plain[s.index] = s["d_has_events"].eq(False) & own_post
        return plain
    x = ctx.data.client_table("http_exchanges")
    calls = x.loc[x["purpose"] == "call", ["client_id", "conn_id", "stream_key"]].astype({"conn_id": "Int64"})
    calls = calls.drop_duplicates(["client_id", "conn_id"]).rename(columns={"stream_key": "x_stream_key"})
    j = s[["client_id", "conn_id"]].merge(calls, on=["client_id", "conn_id"], how="left")
    conns_with_events = set(truth.sent["conn"].dropna())
    conn = s["client_id"].astype(str) + ":" + s["conn_id"].astype(str)
    same_call = j["x_stream_key"].to_numpy() == s["stream_key"].to_numpy()
    plain[s.index] = same_call & ~conn.isin(conns_with_events).to_numpy()
    return plain


def _wrong_responses(r: pd.DataFrame) -> pd.Series:
    wrong = pd.Series(False, index=r.index)
    responses = r[r["kind"].isin(["response", "error"])]  # few rows: the string work is cheap
    if len(responses):
        key = responses["stream_key"].astype(str)
        rid = key.str.slice(5)
        answered = text_ids(responses["jsonrpc_id"]).fillna("\0null").astype(str)  # 7.0 -> "7"
        wrong[responses.index] = (key.str.startswith("post:") & (answered != rid)) | key.str.startswith(
            "get:"
        )
    return wrong


def _faulted_delivery(r: pd.DataFrame, ctx: Context) -> pd.Series:
    f = faulted_forwards(ctx)
    if not len(f):
        return pd.Series(False, index=r.index)
    keys = set(text_key(f["flow"], f["digest"]).tolist())
    return in_keys(text_key(r["d_flow"], r["message_digest"]), keys)


def _witness(row: pd.Series, truth: StreamTruth, ctx: Context) -> Witness:
    client = row["client_id"]
    eid = row["event_id"]
    digest = row["message_digest"]
    sent = truth.sent
    same = sent[(sent["digest"] == digest) & (sent["session"] == row["session"])]
    if not bool(row["synthetic"]):
        exact = same[same["event_id"] == eid]
        same = exact if len(exact) else same
    mapped = truth.stream_map[
        (truth.stream_map["client_id"] == client)
        & (truth.stream_map["session"] == row["session"])
        & (truth.stream_map["stream_key"] == row["stream_key"])
    ]
    expected = ", ".join(sorted(set(mapped["logical"].astype(str)))) or "unknown"
    lead = (
        f"client {client} accepted event {eid} (message {short(digest)}) on {row['stream_key']} "
        f"(session generation {row['session_generation']}, connection {client}:{row['conn_id']}) "
        f"{at(row['accepted_at'], ctx.origin)}"
    )
    if len(same):
        first = same.sort_values("t").iloc[0]
        source = (
            "the proxy saw the server send"
            if present(first["flow"])
            else "the server ledger says the server sent"
        )
        where = f"{source} it on {describe_flow(truth, first['flow'])} as an event of stream {first['home']}"
    else:
        where = f"{_RECORDS[truth.source]} of the server sending it"
    if row["wrong_response"]:
        why = f"a response to request {row['jsonrpc_id']} may not end {row['stream_key']}"
    else:
        why = f"not of {row['stream_key']}'s stream ({expected})"
    blame = ""
    if truth.from_tap:
        f = faulted_forwards(ctx)
        hit = f[(f["flow"] == row["d_flow"]) & (f["digest"] == digest)]
        if len(hit):
            h = hit.iloc[0]
            blame = (
                f"; proxy fault {h['fault']} (rule {h['rule']}, decision {h['decision']}) forwarded it "
                "there and the client did not reject it"
            )
    if not blame and _server_sent_it_here(row, truth):
        blame = (
            "; the server itself sent it on that connection (before any fault), and the client accepted it"
        )
    fields = row_of(row, RECEIPT_COLUMNS) | {
        "session": row["session"] if present(row["session"]) else None,
        "delivering_flow": row["d_flow"] if present(row["d_flow"]) else None,
        "expected_stream": expected,
    }
    check = "response_on_wrong_stream" if row["wrong_response"] else "not_sent_on_stream"
    refs = client_ref(ctx.data.client_files, "inbox", row)
    return Witness(check, f"{lead}; {where}, {why}{blame}", Attribution.CLIENT, fields, tuple(refs))


def _server_sent_it_here(row: pd.Series, truth: StreamTruth) -> bool:
    """The server itself sent this message on the delivering connection."""
    conn = f"{row['client_id']}:{row['conn_id']}"
    sent = truth.sent
    return bool(((sent["conn"] == conn) & (sent["digest"] == row["message_digest"])).any())


_RECORDS = {
    "tap": "the proxy has no record",
    "tap+server": "neither the proxy nor the server ledger has a record",
    "server": "the server ledger has no record",
}


def _crossings_injected(ctx: Context) -> int:
    """Faulted forwarded events that are not the server's event of that flow and index,
    plus resumptions whose Last-Event-ID the proxy rewrote."""
    f = faulted_forwards(ctx)
    sent = ctx.data.tap_records("sent")
    sources = sent[sent["flow"].isin(f["src_flow"].dropna())]
    original: dict[tuple[str, int], Any] = {
        (str(flow), int(index)): event_id
        for flow, index, event_id in zip(
            sources["flow"].tolist(), sources["index"].tolist(), sources["event_id"].tolist(), strict=True
        )
    }
    moved = 0
    for flow, event_id, src_flow, src_index in zip(
        f["flow"].tolist(),
        f["event_id"].tolist(),
        f["src_flow"].tolist(),
        f["src_index"].tolist(),
        strict=True,
    ):
        if not present(src_flow) or src_flow != flow:
            moved += 1  # moved from another flow, or made up by the proxy
        elif present(src_index) and original.get((str(src_flow), int(src_index))) != event_id:
            moved += 1  # the server's event under another ID
    return moved + int(rewritten_cursor(ctx.data.tap_records("flow")).sum())


def _rejections(ctx: Context, truth: StreamTruth) -> dict[str, Any]:
    """The clients' rejections: by reason, by the fault that explains them, and by
    explanation (lab.checker.truth.rejections; the unexplained ones the server sent are
    findings of this gate, `rejected_unexplained`)."""
    data = ctx.data
    if data.client is None or "events_rejected" in data.client_tables_absent:
        return {"total": None, "by_reason": {}, "by_fault": {}, "explained": {}}
    rej = explained_rejections(ctx, truth)
    by_reason = {str(k): int(v) for k, v in rej["reason"].value_counts().items()}
    faulted = rej.loc[rej["explanation"] == "fault", "fault"]
    by_fault = {str(k): int(v) for k, v in faulted.value_counts().items()}
    return {"total": len(rej), "by_reason": by_reason, "by_fault": by_fault, "explained": counts(rej)}


RULE = Rule(
    id="cross_stream",
    number=1,
    title="Events accepted on a stream they do not belong to",
    blames=(Attribution.SERVER, Attribution.CLIENT),
    evidence="events sent by the server (as the proxy recorded them), and crossings attempted (a fault or a resumption) for the client side",
    check=check,
    check_under_test=read_under_test,
    placed_in_time=True,
    server_times=lambda ctx: server_sends(ctx)["t"].tolist(),
    judged_without_faults=True,
)
