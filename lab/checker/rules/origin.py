"""Gate 4 — requests with an illegal Origin must be rejected with 403 (budget: 100 %).

Illegal means: illegal as the *server* received it. With a proxy tap that is the flow's
`origin_allowed_out` = false (the proxy judges the Origin it forwards against the
scenario's allow-list, so a server that wrongly thinks an Origin allowed is still
caught); only flows the server answered count (`answered_by` = server, a status
present): a 429 the proxy made up never reached the server. Without a tap, the server
ledger's `requests` with origin_allowed = 0.

rate = (such requests answered 403) / (all such requests); the gate fails when
rate < origin_reject_rate. Every illegal-Origin request answered otherwise is a
violation, attributed to the server. Evidence: illegal-Origin requests >=
max(1, min_illegal_origin): with no illegal-Origin request at all the gate is
inconclusive, never "0 of 0" passed. With both tap and server ledger, disagreements on
which requests had an illegal Origin are listed in the notes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, fault_refs, present, row_of, server_ref, tap_ref
from lab.checker.inputs.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule


def _is_false(values: pd.Series) -> pd.Series:
    return values.map(lambda v: v is False or v == 0 or v == "false").astype(bool)


def check(ctx: Context) -> GateResult:
    data = ctx.data
    notes: list[str] = []
    if data.tap is not None:
        flows = data.tap["flow"]
        status = pd.to_numeric(flows["status"], errors="coerce")
        illegal = _is_false(flows["origin_allowed_out"].astype("object"))
        by_server = (flows["answered_by"] == "server") & status.notna()
        unanswered = int((illegal & ~by_server).sum())
        if unanswered:
            notes.append(
                f"{unanswered} illegal-Origin request(s) never reached the server or got no answer: not counted"
            )
        rows = flows[illegal & by_server].assign(status=status[illegal & by_server])
        source = "tap"
        notes += _disagreements(ctx, rows)
    elif data.server is not None:
        req = data.server["requests"]
        status = pd.to_numeric(req["status"], errors="coerce")
        rows = req[_is_false(req["origin_allowed"].astype("object")) & status.notna()]
        rows = rows.assign(status=status[rows.index])
        source = "server"
    else:
        raise MissingInput(
            f"no record of the Origin requests arrived with: {data.why_absent('tap')}; "
            f"{data.why_absent('server')}"
        )
    total = len(rows)
    rejected = int((rows["status"] == 403).sum())
    rate = rejected / total if total else None
    budget = ctx.budgets.origin_reject_rate
    failed = rate is not None and rate < budget
    bad = rows[rows["status"] != 403].sort_values("t" if source == "tap" else "at", kind="stable")
    need = max(1, ctx.budgets.min_illegal_origin)  # "0 of 0 rejected" is no evidence
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "illegal-Origin requests",
            need,
            total,
            total >= need,
            "as the proxy recorded them" if source == "tap" else "as the server ledger records them",
            from_faults=True,
        ),
    ]
    shown = "n/a" if rate is None else f"{rate:.2%}"
    return GateResult(
        verdict=decide(failed, evidence),
        summary=f"{rejected} of {total} illegal-Origin requests answered 403 ({shown}; budget {budget:.0%})",
        budget={"origin_reject_rate": budget, "min_illegal_origin": need},
        measured={"illegal_origin_requests": total, "rejected_403": rejected, "rate": rate, "source": source},
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, source, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"server": len(bad)},
        notes=tuple(notes),
    )


def _witness(r: pd.Series, source: str, ctx: Context) -> Witness:
    status = int(r["status"])
    if source == "tap":
        origin = r["origin_out"]
        rewritten = present(r["origin_in"]) and r["origin_in"] != origin
        faults = r["faults"] if isinstance(r["faults"], list) else []
        names = ", ".join(str(f.get("fault")) for f in faults if isinstance(f, dict))
        how = (
            f" (sent as {r['origin_in']!r}, rewritten by the proxy{': ' + names if names else ''})"
            if rewritten
            else ""
        )
        text = (
            f"a {r['method']} by {r['conn']} reached the server {at(r['t'], ctx.origin)} with the illegal Origin "
            f"{origin!r}{how} and was answered {status}, not 403"
        )
        fields = row_of(r, ["flow", "t", "conn", "method", "origin_in", "origin_out", "status", "session"])
        refs = tap_ref(r) + fault_refs(f.get("decision") for f in faults if isinstance(f, dict))
    else:
        text = (
            f"a {r['method']} by {r['conn']} arrived {at(r['at'], ctx.origin)} with the illegal Origin "
            f"{r['origin']!r} and the server answered {status}, not 403"
        )
        fields = row_of(r, ["at", "conn", "method", "origin", "status", "reason", "session"])
        refs = server_ref("requests", r)
    return Witness("not_rejected", text, Attribution.SERVER, fields, tuple(refs))


def _disagreements(ctx: Context, tap_illegal: pd.DataFrame) -> list[str]:
    if ctx.data.server is None:
        return []
    req = ctx.data.server["requests"]
    allowed = (
        req.dropna(subset=["conn"]).drop_duplicates("conn", keep="last").set_index("conn")["origin_allowed"]
    )
    server_says: Any = tap_illegal["conn"].map(allowed)
    thought_allowed = int((pd.to_numeric(server_says, errors="coerce") == 1).sum())
    if not thought_allowed:
        return []
    return [f"the server judged {thought_allowed} Origin(s) allowed that the proxy judged illegal"]


RULE = Rule(
    id="illegal_origin",
    number=4,
    title="Illegal-Origin requests rejected with 403",
    blames=(Attribution.SERVER,),
    evidence="requests with an illegal Origin (sent so or rewritten by the proxy)",
    check=check,
    check_under_test=check,
    placed_in_time=True,
)
