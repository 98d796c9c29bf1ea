"""Gate 2 — duplicate business dispatches (budget: 0).

Checks, each a count of offending groups:
- `server_performed_twice`: server ledger `dispatches` with effect = performed more than
  once for one (auth_subject, idempotency_key). Attribution: server (it had the key and
  performed again).
- `wire_different_results`: from the wire, on any target: the tap's `result` records
  (the answer the server sent to each tool call, with the digest of its result) hold two
  or more different non-error `result_digest`s for one (auth, idempotency_key). The
  target contract says a retry returns the original receipt, so a second, different
  result is a second dispatch. Attribution: server. Where the server ledger exists too,
  both are used (a key caught by both counts once), and keys on which they disagree are
  listed in the notes and counted in `ledger_wire_disagreements`. Answers that cannot be
  this session's own are not compared (`results_not_compared`): one the server sent on a
  stream it does not belong to (gate 1's), one recorded for two different writes.
- `client_dispatched_more_than_sent`: a client's outbox holds a message (digest) more
  times than the server sent that message to that client (distinct event IDs of that
  digest on the client's connections, from the tap or else the server ledger; replays of
  one event ID count once). Attribution: client.
- `inbox_duplicate`: two inbox receipts with the same dedup key (client, session
  generation, stream key, event ID, digest). The inbox's UNIQUE constraint should make
  this impossible; a ledger written without it is caught here. Attribution: client.
- `same_write_under_new_key`: the server performed one tool with the same arguments
  (`dispatches.arguments_digest`) for one subject under two or more idempotency keys: a
  write re-run as a new operation after a lost answer, which no key can catch (the lab's
  clients never send two writes with equal arguments). Attribution: client. Checked when
  the server ledger has the column.

Evidence: event count >= min_events; at least one write was retried (the situation in
which duplicates happen): a server dispatch with effect = replayed, an idempotency key on
two or more tap flows, a key answered more than once on the wire (tap `result`), or a
client write operation with attempts >= 2; and the side effects are visible, from the
server ledger or from the wire (tap `result` records of calls with a key).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context, in_keys, text_ids, text_key
from lab.checker.explain import at, client_ref, plural, row_of, server_ref, short, tap_ref, token, who
from lab.checker.inputs.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.duplicates_sut import CLIENT_RECORDS, OUTBOX_COMPARED, done_twice
from lab.checker.rules.duplicates_sut import check as read_under_test
from lab.checker.truth.streams import stream_truth
from lab.checker.truth.wire import server_sends

_NOT_COUNTED = ("wire_different_results", "ledger_wire_disagreements", "results_not_compared")
"""Measures that are not violations of their own: the wire's groups are counted once they
are not the server ledger's too; the other two are notes."""


def check(ctx: Context) -> GateResult:
    witnesses: list[Witness] = []
    measured: dict[str, Any] = dict.fromkeys(
        (
            "server_performed_twice",
            "client_dispatched_more_than_sent",
            "inbox_duplicate",
            "same_write_under_new_key",
            "wire_different_results",
        )
    )  # None: not checked
    notes: list[str] = []
    server_witnesses, rekeyed, checked = _server_checks(ctx, measured, notes)
    witnesses += server_witnesses
    wire, wire_groups, wire_checked = _wire_checks(ctx, measured, notes)
    witnesses += [_wire_witness(g, ctx) for g in wire_groups[: ctx.witness_limit]]
    outbox_groups, inbox_groups, client_checked = _client_checks(ctx, measured, notes)
    witnesses += [_outbox_witness(g, ctx) for g in outbox_groups[: ctx.witness_limit]]
    witnesses += [_inbox_witness(g, ctx) for g in inbox_groups[: ctx.witness_limit]]
    if checked + wire_checked + client_checked == 0:
        raise MissingInput("neither a server nor a client ledger could be read")

    count = sum(v for k, v in measured.items() if isinstance(v, int) and k not in _NOT_COUNTED) + len(
        wire_groups
    )
    retried = _writes_retried(ctx)
    measured["writes_retried"] = retried
    evidence = _evidence(ctx, measured, notes, wire, retried)
    budget = ctx.budgets.duplicate_dispatch_max
    by_routing = sum(1 for g in wire_groups if len(g["replicas"]) > 1)
    attribution = {
        "server": int(measured["server_performed_twice"] or 0) + len(wire_groups) - by_routing,
        "client": len(outbox_groups) + len(inbox_groups) + len(rekeyed),
    }
    if by_routing:
        attribution[str(Attribution.TOPOLOGY)] = by_routing
    return GateResult(
        verdict=decide(count > budget, evidence),
        summary=f"{done_twice(count, budget)}; {retried} write retries seen",
        budget={"duplicate_dispatch_max": budget},
        measured=measured,
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(witnesses[: ctx.witness_limit * 3]),
        attribution_counts=attribution,
        notes=tuple(notes),
    )


def _server_checks(
    ctx: Context, measured: dict[str, Any], notes: list[str]
) -> tuple[list[Witness], list[dict[str, Any]], int]:
    """The server ledger's dispatches: keys performed twice, and writes re-run under a new
    key (`measured` and `notes` filled in). (witnesses, the re-keyed groups, 1 when the
    server ledger was checked else 0)."""
    data = ctx.data
    if data.server is None:
        notes.append(f"server side effects not checked: {data.why_absent('server')}")
        return [], [], 0
    witnesses: list[Witness] = []
    rekeyed: list[dict[str, Any]] = []
    groups = _server_twice(data.server["dispatches"])
    measured["server_performed_twice"] = len(groups)
    witnesses += [_server_witness(g, ctx) for g in groups[: ctx.witness_limit]]
    if "arguments_digest" in data.server["dispatches"].columns:
        rekeyed = _same_write_new_key(data.server["dispatches"])
        measured["same_write_under_new_key"] = len(rekeyed)
        witnesses += [_rekeyed_witness(g, ctx) for g in rekeyed[: ctx.witness_limit]]
    else:
        notes.append("writes re-run under a new key not checked: the server ledger has no arguments_digest")
    return witnesses, rekeyed, 1


def _wire_checks(
    ctx: Context, measured: dict[str, Any], notes: list[str]
) -> tuple[pd.DataFrame | None, list[dict[str, Any]], int]:
    """The tap's `result` records: one idempotency key answered with different results
    (`measured` and `notes` filled in; with the server ledger, where the two disagree).
    (the wire's results, the groups not already the server ledger's, 1 when checked else 0)."""
    data = ctx.data
    wire = _wire_results(ctx)
    if wire is None:
        notes.append(
            "answers on the wire not compared: the proxy recorded no answers to tool calls (`result` records)"
        )
        return None, [], 0
    wire, foreign = _without_foreign_answers(ctx, wire)
    if foreign:
        measured["results_not_compared"] = foreign
        notes.append(
            f"{plural(foreign, 'answer')} on the wire not compared: sent on a stream it does not belong to "
            "(gate 1's finding), or the same result recorded for two different writes (an answer belongs to "
            "one write): a replay of another session's answer is not a second result of the write whose request "
            "ID it shares"
        )
    wire_groups = _wire_different(wire)
    _replicas_of(ctx, wire_groups)
    server_keys = set()
    if data.server is not None:
        server_keys = {str(g["idempotency_key"]) for g in _server_twice(data.server["dispatches"])}
        disagree = _disagreements(data.server["dispatches"], wire, wire_groups, server_keys)
        measured["ledger_wire_disagreements"] = len(disagree)
        notes += disagree[:3]
    measured["wire_different_results"] = len(wire_groups)
    wire_groups = [g for g in wire_groups if str(g["idempotency_key"]) not in server_keys]
    return wire, wire_groups, 1


def _client_checks(
    ctx: Context, measured: dict[str, Any], notes: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The client ledger: messages dispatched more often than the server sent them, and
    inbox duplicates (`measured` and `notes` filled in). (outbox groups, inbox groups,
    how many of the two were checked)."""
    data = ctx.data
    if data.client is None:
        notes.append(f"{CLIENT_RECORDS} not checked: {data.why_absent('client')}")
        return [], [], 0
    checked = 0
    outbox_groups: list[dict[str, Any]] = []
    try:
        truth = stream_truth(ctx)
    except MissingInput as e:
        notes.append(
            f"what the clients handed their application (outbox) not compared with what the server sent: {e}"
        )
    else:
        outbox_groups = _client_over_sent(ctx.require_client("outbox"), truth.sent)
        measured["client_dispatched_more_than_sent"] = len(outbox_groups)
        checked += 1
    inbox_groups = _inbox_duplicates(ctx.require_client("inbox"))
    measured["inbox_duplicate"] = len(inbox_groups)
    checked += 1
    return outbox_groups, inbox_groups, checked


def _evidence(
    ctx: Context, measured: dict[str, Any], notes: list[str], wire: pd.DataFrame | None, retried: int
) -> list[Evidence]:
    """The gate's evidence: events, writes retried, the client's; and, when missing, the
    server's side effects and the client outbox's comparison."""
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "writes retried",
            1,
            retried,
            retried >= 1,
            "writes the server answered again from its record (replayed), an idempotency key on several "
            "requests or answered more than once, client writes tried twice or more",
            from_faults=True,
        ),
        *ctx.client_evidence(),
    ]
    answered = 0 if wire is None else int(wire["idempotency_key"].notna().sum())
    if ctx.data.server is None and answered == 0:
        evidence.append(
            Evidence(
                "server side effects visible",
                True,
                False,
                False,
                "no server ledger, and the proxy recorded no answer to a call with an idempotency key",
            )
        )
    if measured["client_dispatched_more_than_sent"] is None:
        evidence.append(Evidence(OUTBOX_COMPARED, True, False, False, "; ".join(notes) or "no client ledger"))
    return evidence


def _server_twice(dispatches: pd.DataFrame) -> list[dict[str, Any]]:
    performed = dispatches[dispatches["effect"] == "performed"].sort_values("at", kind="stable")
    if not len(performed):
        return []
    subject = performed["auth_subject"].astype("object").fillna("-")
    size = performed.groupby([subject, performed["idempotency_key"]], sort=False)["at"].transform("size")
    twice = performed[size > 1]
    out: list[dict[str, Any]] = []
    for group_key, rows in twice.groupby([subject[size > 1], twice["idempotency_key"]], sort=False):
        subj, key = group_key
        out.append({"auth_subject": subj, "idempotency_key": key, "rows": rows})
    out.sort(key=lambda g: float(g["rows"]["at"].iloc[1]))
    return out


def _server_witness(group: dict[str, Any], ctx: Context) -> Witness:
    rows = group["rows"]
    tries = "; ".join(
        f"request {r.request_id} in session {r.session} {at(r.at, ctx.origin)}"
        for r in rows.head(4).itertuples()
    )
    text = (
        f"the server performed tool {rows['tool'].iloc[0]} {len(rows)} times for idempotency key "
        f"{group['idempotency_key']} ({who(group['auth_subject'])}): {tries}"
    )
    first = rows.iloc[0]
    fields = row_of(first, ["idempotency_key", "auth_subject", "tool", "session", "request_id", "at"])
    fields["performed"] = len(rows)
    refs = [r for _, row in rows.head(4).iterrows() for r in server_ref("dispatches", row)]
    return Witness("server_performed_twice", text, Attribution.SERVER, fields, tuple(refs))


def _same_write_new_key(dispatches: pd.DataFrame) -> list[dict[str, Any]]:
    performed = dispatches[(dispatches["effect"] == "performed") & dispatches["arguments_digest"].notna()]
    if not len(performed):
        return []
    performed = performed.sort_values("at", kind="stable")
    subject = performed["auth_subject"].astype("object").fillna("-")
    by = [subject, performed["tool"], performed["arguments_digest"]]
    keys = performed.groupby(by, sort=False)["idempotency_key"].transform("nunique")
    rekeyed = performed[keys > 1]
    out: list[dict[str, Any]] = []
    for (subj, tool, _), rows in rekeyed.groupby(
        [subject[keys > 1], rekeyed["tool"], rekeyed["arguments_digest"]], sort=False
    ):
        out.append({"auth_subject": subj, "tool": tool, "rows": rows})
    out.sort(key=lambda g: float(g["rows"]["at"].iloc[1]))
    return out


def _rekeyed_witness(group: dict[str, Any], ctx: Context) -> Witness:
    rows = group["rows"]
    keys = list(dict.fromkeys(rows["idempotency_key"]))
    tries = "; ".join(
        f"key {r.idempotency_key}, request {r.request_id} in session {r.session} {at(r.at, ctx.origin)}"
        for r in rows.head(4).itertuples()
    )
    text = (
        f"the server performed {group['tool']} with the same arguments {len(rows)} times under "
        f"{len(keys)} idempotency keys ({who(group['auth_subject'])}): a write re-run as a new "
        f"operation — {tries}"
    )
    fields = row_of(rows.iloc[0], ["auth_subject", "tool", "arguments_digest", "session", "request_id", "at"])
    fields["keys"] = ", ".join(str(k) for k in keys)
    fields["performed"] = len(rows)
    refs = [r for _, row in rows.head(4).iterrows() for r in server_ref("dispatches", row)]
    return Witness("same_write_under_new_key", text, Attribution.CLIENT, fields, tuple(refs))


def _client_over_sent(outbox: pd.DataFrame, sent: pd.DataFrame) -> list[dict[str, Any]]:
    dispatched = outbox.groupby(["client_id", "message_digest"], sort=False).size()
    repeated = dispatched[dispatched > 1]
    if not len(repeated):
        return []
    mine = sent[sent["client_id"].notna() & sent["digest"].isin(repeated.index.get_level_values(1))]
    sends = mine.drop_duplicates(["client_id", "session", "send_key"]).groupby(["client_id", "digest"]).size()
    sends.index = sends.index.set_names(["client_id", "message_digest"])
    allowed = sends.reindex(repeated.index, fill_value=0)
    over = repeated[repeated > allowed]
    out: list[dict[str, Any]] = []
    for (client, digest), n, sent_count in zip(
        over.index.tolist(), over.tolist(), allowed[over.index].tolist(), strict=True
    ):
        rows = outbox[(outbox["client_id"] == client) & (outbox["message_digest"] == digest)]
        out.append(
            {
                "client_id": client,
                "digest": digest,
                "dispatched": int(n),
                "sent": int(sent_count),
                "rows": rows,
            }
        )
    out.sort(key=lambda g: float(g["rows"]["created_at"].min()))
    return out


def _outbox_witness(group: dict[str, Any], ctx: Context) -> Witness:
    rows = group["rows"].sort_values("created_at")
    keys = ", ".join(str(k) for k in rows["dispatch_key"].head(4))
    text = (
        f"client {group['client_id']} handed message {short(group['digest'])} to its application "
        f"{group['dispatched']} times (outbox entries {keys}; first {at(rows['created_at'].iloc[0], ctx.origin)}) "
        f"but the server sent it to that client {plural(group['sent'], 'time')}"
    )
    fields = row_of(
        rows.iloc[0], ["client_id", "dispatch_key", "session_generation", "stream_key", "event_id"]
    )
    fields |= {"message_digest": group["digest"], "dispatched": group["dispatched"], "sent": group["sent"]}
    return Witness("client_dispatched_more_than_sent", text, Attribution.CLIENT, fields)


def _inbox_duplicates(inbox: pd.DataFrame) -> list[dict[str, Any]]:
    key = ["client_id", "session_generation", "stream_key", "event_id", "message_digest"]
    dup = inbox[inbox.duplicated(key, keep=False)]
    out: list[dict[str, Any]] = []
    for values, rows in dup.groupby(key, sort=False, dropna=False):
        out.append({"key": dict(zip(key, values, strict=True)), "rows": rows})
    out.sort(key=lambda g: float(g["rows"]["accepted_at"].min()))
    return out


def _inbox_witness(group: dict[str, Any], ctx: Context) -> Witness:
    files = ctx.data.client_files
    k = group["key"]
    rows = group["rows"]
    text = (
        f"client {k['client_id']} accepted event {k['event_id']} on {k['stream_key']} {len(rows)} times "
        f"(session generation {k['session_generation']}, message {short(k['message_digest'])}: "
        f"{len(rows)} inbox receipts), the first {at(rows['accepted_at'].min(), ctx.origin)}: a client must "
        "accept each event once (its dedup key lets one in)"
    )
    fields = {name: row_of(rows.iloc[0], [name])[name] for name in k} | {"receipts": len(rows)}
    refs = [r for _, row in rows.head(4).iterrows() for r in client_ref(files, "inbox", row)]
    return Witness("inbox_duplicate", text, Attribution.CLIENT, fields, tuple(refs))


def _writes_retried(ctx: Context) -> int:
    data = ctx.data
    n = 0
    if data.server is not None:
        n += int((data.server["dispatches"]["effect"] == "replayed").sum())
    if data.tap is not None:
        keys = data.tap["flow"]["idempotency_key"].dropna()
        counts = keys.value_counts()
        n += int((counts > 1).sum())
        results = data.tap["result"]
        answered = results[results["idempotency_key"].notna()]
        if len(answered):
            per_key = answered.groupby(
                [answered["auth"].astype("object").fillna("-"), answered["idempotency_key"]]
            ).size()
            n += int((per_key > 1).sum())  # keys answered more than once on the wire
    if data.client is not None and "operations" not in data.client_tables_absent:
        ops = data.client["operations"]
        write = pd.to_numeric(ops["write"], errors="coerce") == 1
        n += int((write & (pd.to_numeric(ops["attempts"], errors="coerce") >= 2)).sum())
    return n


# ---------------------------------------------------------------------------- from the wire


def _wire_results(ctx: Context) -> pd.DataFrame | None:
    """The tap's `result` records of calls with an idempotency key (None: no tap, or a tap
    without any `result` record, i.e. a writer that does not record results)."""
    tap = ctx.data.tap
    if tap is None or not len(tap["result"]):
        return None
    r = tap["result"]
    return r[r["idempotency_key"].notna()].sort_values("t", kind="stable")


def _without_foreign_answers(ctx: Context, results: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The results that can be this session's own answer, and how many were left out.

    The tap ties an answer to a write call by (session, JSON-RPC id): a replay of another
    session's answer, whose request had the same id, reads as a second, different result
    of this session's write, where nothing was performed twice (seen on servers with one
    event store for every session). Left out:
    - an answer whose SSE event the server sent on a stream it does not belong to (gate
      1's `sent_off_home`: a foreign replay);
    - an answer recorded for two or more different writes (auth, idempotency key): a
      receipt names one write, so a result that answers two is neither's (an answer
      replayed where the wire cannot place it, e.g. sent live to no one).
    A tap without result indexes, or a run whose stream truth cannot be built, is
    compared whole but for the second."""
    keys = text_key(results["auth"], results["idempotency_key"])
    writes = keys.groupby(results["result_digest"], sort=False).transform("nunique")
    drop = (writes > 1) & ~_is_error(results["is_error"])
    if "index" in results.columns and len(results):
        try:
            off = server_sends(ctx)
        except MissingInput:
            off = None
        if off is not None and len(off):
            off = off[off["check"] == "sent_off_home"]
            where = text_key(results["flow"], text_ids(results["index"]))
            drop |= in_keys(where, text_key(off["flow"], text_ids(off["index"])))
    return results[~drop], int(drop.sum())


def _is_error(values: pd.Series) -> pd.Series:
    return values.map(lambda v: v is True or v == 1 or v == "true").astype(bool)


def _wire_different(results: pd.DataFrame) -> list[dict[str, Any]]:
    ok = results[~_is_error(results["is_error"]) & results["result_digest"].notna()]
    if not len(ok):
        return []
    auth = ok["auth"].astype("object").fillna("-")
    distinct = ok.groupby([auth, ok["idempotency_key"]], sort=False)["result_digest"].transform("nunique")
    many = ok[distinct > 1]
    out: list[dict[str, Any]] = []
    for (subject, key), rows in many.groupby([auth[distinct > 1], many["idempotency_key"]], sort=False):
        out.append({"auth": subject, "idempotency_key": key, "rows": rows})
    out.sort(key=lambda g: float(g["rows"]["t"].iloc[0]))
    return out


def _replicas_of(ctx: Context, groups: list[dict[str, Any]]) -> None:
    """Each group's `replicas`: the replicas (the proxy balancing over them, tap `flow`
    records' `replica`) whose answers carried its results; empty without replicas. Two
    replicas that each performed the write are a deployment's defect (idempotency records
    per replica, a retry routed to the other), not the rules of either server."""
    flows = ctx.data.tap_records("flow") if groups else None
    if flows is None or "replica" not in flows.columns:
        for g in groups:
            g["replicas"] = set()
        return
    known = flows[flows["replica"].notna()].drop_duplicates("flow")
    replica = dict(zip(known["flow"].astype(str), known["replica"].astype(int), strict=True))
    for g in groups:
        g["replicas"] = {replica[f] for f in g["rows"]["flow"].astype(str) if f in replica}


def _wire_witness(group: dict[str, Any], ctx: Context) -> Witness:
    rows = group["rows"]
    answers = "; ".join(
        f"request {r.jsonrpc_id} in session {r.session} got result {short(r.result_digest)} {at(r.t, ctx.origin)}"
        for r in rows.head(4).itertuples()
    )
    replicas = sorted(group.get("replicas") or ())
    if len(replicas) > 1:
        text = (
            f"idempotency key {group['idempotency_key']} ({token(group['auth'])}) was answered with "
            f"{rows['result_digest'].nunique()} different results by replicas {', '.join(map(str, replicas))}: "
            f"each performed {rows['tool'].iloc[0]} (a retry reached a replica that did not know the key): "
            f"{answers}. The deployment's defect (idempotency records per replica), not one server's rules"
        )
    else:
        text = (
            f"the server answered idempotency key {group['idempotency_key']} ({token(group['auth'])}) with "
            f"{rows['result_digest'].nunique()} different results, so it performed {rows['tool'].iloc[0]} again "
            f"(a retry must get the original answer back): {answers}"
        )
    fields = row_of(rows.iloc[0], ["idempotency_key", "auth", "tool", "session", "jsonrpc_id", "t"])
    fields["different_results"] = int(rows["result_digest"].nunique())
    refs = [r for _, row in rows.head(4).iterrows() for r in tap_ref(row)]
    who = Attribution.TOPOLOGY if len(replicas) > 1 else Attribution.SERVER
    return Witness("wire_different_results", text, who, fields, tuple(refs))


def _disagreements(
    dispatches: pd.DataFrame, wire: pd.DataFrame, wire_groups: list[dict[str, Any]], server_keys: set[str]
) -> list[str]:
    """Keys on which the server ledger and the wire disagree about a second dispatch (each
    judged only where both sources saw the key)."""
    wire_keys = {str(g["idempotency_key"]) for g in wire_groups}
    known = set(dispatches["idempotency_key"].dropna().astype(str))
    answered = set(wire["idempotency_key"].dropna().astype(str))
    out = [
        f"the wire shows key {k} answered with different results, but the server ledger records the write "
        "performed once"
        for k in sorted(wire_keys - server_keys)
        if k in known
    ]
    out += [
        f"the server ledger records key {k} performed twice, but the wire shows one result"
        for k in sorted(server_keys - wire_keys)
        if k in answered
    ]
    return out


def check_under_test(ctx: Context) -> GateResult:
    """The server's side as for the lab's clients; the client's from its application log."""
    return read_under_test(ctx, check(ctx))


RULE = Rule(
    id="duplicate_dispatch",
    number=2,
    title="Writes done more than once (duplicate dispatches)",
    blames=(Attribution.SERVER, Attribution.CLIENT, Attribution.TOPOLOGY),
    evidence="writes retried after a lost answer, with their side effects visible (server ledger or the proxy's record)",
    check=check,
    check_under_test=check_under_test,
    budget_key="duplicate_dispatch_max",
    placed_in_time=True,
)
