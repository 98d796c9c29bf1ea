"""Gate 2 — duplicate business dispatches (budget: 0).

Three checks, each a count of offending groups:
- `server_performed_twice`: server ledger `dispatches` with effect = performed more than
  once for one (auth_subject, idempotency_key). Attribution: server (it had the key and
  performed again).
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

Evidence: event count >= min_events, and at least one write was retried (the situation
in which duplicates happen): a server dispatch with effect = replayed, an idempotency
key on two or more tap flows, or a client write operation with attempts >= 2.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, client_ref, plural, row_of, server_ref, short
from lab.checker.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.streams import stream_truth

GATE = "duplicate_dispatch"
NUMBER = 2
TITLE = "Duplicate business dispatches"


def check(ctx: Context) -> GateResult:
    data = ctx.data
    witnesses: list[Witness] = []
    measured: dict[str, Any] = dict.fromkeys(
        (
            "server_performed_twice",
            "client_dispatched_more_than_sent",
            "inbox_duplicate",
            "same_write_under_new_key",
        )
    )  # None: not checked
    notes: list[str] = []
    checked = 0

    rekeyed: list[dict[str, Any]] = []
    if data.server is not None:
        groups = _server_twice(data.server["dispatches"])
        measured["server_performed_twice"] = len(groups)
        witnesses += [_server_witness(g, ctx) for g in groups[: ctx.witness_limit]]
        checked += 1
        if "arguments_digest" in data.server["dispatches"].columns:
            rekeyed = _same_write_new_key(data.server["dispatches"])
            measured["same_write_under_new_key"] = len(rekeyed)
            witnesses += [_rekeyed_witness(g, ctx) for g in rekeyed[: ctx.witness_limit]]
        else:
            notes.append(
                "writes re-run under a new key not checked: the server ledger has no arguments_digest"
            )
    else:
        notes.append(f"server side effects not checked: {data.why_absent('server')}")

    outbox_groups: list[dict[str, Any]] = []
    inbox_groups: list[dict[str, Any]] = []
    if data.client is not None:
        try:
            truth = stream_truth(ctx)
        except MissingInput as e:
            notes.append(f"client outbox not compared with what the server sent: {e}")
        else:
            outbox_groups = _client_over_sent(ctx.require_client("outbox"), truth.sent)
            measured["client_dispatched_more_than_sent"] = len(outbox_groups)
            checked += 1
        inbox_groups = _inbox_duplicates(ctx.require_client("inbox"))
        measured["inbox_duplicate"] = len(inbox_groups)
        checked += 1
    else:
        notes.append(f"client outbox and inbox not checked: {data.why_absent('client')}")
    witnesses += [_outbox_witness(g, ctx) for g in outbox_groups[: ctx.witness_limit]]
    witnesses += [_inbox_witness(g, ctx) for g in inbox_groups[: ctx.witness_limit]]
    if checked == 0:
        raise MissingInput("neither a server nor a client ledger could be read")

    count = sum(v for k, v in measured.items() if isinstance(v, int))
    retried = _writes_retried(ctx)
    measured["writes_retried"] = retried
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "writes retried",
            1,
            retried,
            retried >= 1,
            "replayed server dispatches, idempotency keys on several flows, write operations with attempts >= 2",
        ),
        *ctx.client_evidence(),
    ]
    if data.server is None:
        evidence.append(
            Evidence("server side effects visible", True, False, False, "no server ledger: dispatches unseen")
        )
    if measured["client_dispatched_more_than_sent"] is None:
        evidence.append(
            Evidence("client outbox compared", True, False, False, "; ".join(notes) or "no client ledger")
        )
    budget = ctx.budgets.duplicate_dispatch_max
    attribution = {
        "server": int(measured["server_performed_twice"] or 0),
        "client": len(outbox_groups) + len(inbox_groups) + len(rekeyed),
    }
    return GateResult(
        number=NUMBER,
        gate=GATE,
        title=TITLE,
        verdict=decide(count > budget, evidence),
        summary=f"{count} duplicate dispatch group(s) (budget {budget}); {retried} write retries seen",
        budget={"duplicate_dispatch_max": budget},
        measured=measured,
        evidence=tuple(evidence),
        violations=count,
        witnesses=tuple(witnesses[: ctx.witness_limit * 3]),
        attribution_counts=attribution,
        notes=tuple(notes),
    )


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
        f"{group['idempotency_key']} (subject {group['auth_subject']}): {tries}"
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
        f"{len(keys)} idempotency keys (subject {group['auth_subject']}): a write re-run as a new "
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
        f"client {group['client_id']} dispatched message {short(group['digest'])} {group['dispatched']} times "
        f"(dispatch keys {keys}; first {at(rows['created_at'].iloc[0], ctx.origin)}) but the server sent it to "
        f"that client {plural(group['sent'], 'time')}"
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
        f"client {k['client_id']} has {len(rows)} inbox receipts of event {k['event_id']} on {k['stream_key']} "
        f"(generation {k['session_generation']}, message {short(k['message_digest'])}), the first "
        f"{at(rows['accepted_at'].min(), ctx.origin)}: the dedup key must admit one"
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
    if data.client is not None and "operations" not in data.client_tables_absent:
        ops = data.client["operations"]
        write = pd.to_numeric(ops["write"], errors="coerce") == 1
        n += int((write & (pd.to_numeric(ops["attempts"], errors="coerce") >= 2)).sum())
    return n
