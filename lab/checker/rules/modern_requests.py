"""Check 15 — the modern era's requests (2026-07-28): headers checked against the body, no
session minted. From the wire alone (the proxy tap), for runs that tested the modern era.

A request belongs to the modern era when its `MCP-Protocol-Version`, as the client sent it,
names a modern revision (`protocol_version_in`). Two server violations:

- `mismatch_accepted`: a modern request whose mirrored header the proxy made disagree with
  its body (the `mismatch_header` fault: `Mcp-Method` naming another method, `Mcp-Name`
  another tool, or `MCP-Protocol-Version` a revision nobody serves) that the server served (2xx) instead of refusing with 400 (a request it
  refused for another reason first, such as an illegal Origin's 403, is noted, not
  judged). "If the values do not match,
  the server MUST reject the request with 400 Bad Request and a HeaderMismatch JSON-RPC
  error" (2026-07-28, Streamable HTTP § Standard Headers): a server that serves it lets a
  gateway route by a header the body contradicts.
- `session_minted`: a modern request answered with an `Mcp-Session-Id` header (the tap's
  `session_out`). The revision removed sessions: a server "do[es] not mint or echo session
  IDs" (§ Backwards Compatibility).

Only requests the server answered count (`answered_by` = server, a status present).
Evidence: modern requests the server answered >= 1, and mismatched headers injected >= 1
(without the fault, whether the server checks its headers is unknown: inconclusive, never
"0 of 0" passed).
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, fault_refs, row_of, tap_ref
from lab.checker.inputs.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.wire.revisions import MODERN_REVISIONS

MISMATCH = "mismatch_header"
MISMATCH_ACCEPTED = "mismatch_accepted"
SESSION_MINTED = "session_minted"


def _faults_of(value: object) -> list[dict[str, object]]:
    return [f for f in value if isinstance(f, dict)] if isinstance(value, list) else []


def check(ctx: Context) -> GateResult:
    tap = ctx.data.tap
    if tap is None:
        raise MissingInput(f"no proxy record of the modern era's requests: {ctx.data.why_absent('tap')}")
    flows = tap["flow"].drop_duplicates("flow", keep="last")
    status = pd.to_numeric(flows["status"], errors="coerce")
    modern = flows["protocol_version_in"].astype("object").isin(MODERN_REVISIONS)
    answered = modern & (flows["answered_by"] == "server") & status.notna()
    rows = flows[answered].assign(status=status[answered])
    mismatched = rows[rows["faults"].map(lambda fs: any(f.get("fault") == MISMATCH for f in _faults_of(fs)))]
    # Served (2xx) is the violation; refused for another reason first (an illegal Origin's
    # 403, a bad token's 401, load shedding) is no answer about the headers: noted.
    accepted = mismatched[(mismatched["status"] >= 200) & (mismatched["status"] < 300)]
    otherwise = int(((mismatched["status"] != 400) & ~mismatched.index.isin(accepted.index)).sum())
    minted = rows[rows["session_out"].notna()]
    bad = pd.concat(
        [accepted.assign(check=MISMATCH_ACCEPTED), minted.assign(check=SESSION_MINTED)], ignore_index=True
    ).sort_values("t", kind="stable")
    evidence = [
        Evidence("modern-era requests answered by the server", 1, len(rows), len(rows) >= 1),
        Evidence(
            "mismatched headers injected",
            1,
            len(mismatched) - otherwise,
            len(mismatched) - otherwise >= 1,
            "modern requests whose Mcp-Method, Mcp-Name or MCP-Protocol-Version the proxy made disagree "
            "with the body "
            "(the mismatch_header fault), less those refused for another reason first",
        ),
    ]
    refused = int((mismatched["status"] == 400).sum())
    notes = (
        (
            f"{otherwise} modern-era request(s) with a contradicting header were refused for another reason "
            "first (e.g. an illegal Origin's 403): not judged as to their headers",
        )
        if otherwise
        else ()
    )
    summary = (
        f"{len(accepted)} of {len(mismatched)} modern-era requests with a header the body contradicts were "
        f"served instead of refused with 400, and {len(minted)} of {len(rows)} modern-era answers minted a "
        "session ID (budget 0)"
    )
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=summary,
        budget={"violations": 0},
        measured={
            "modern_requests": len(rows),
            "mismatched": len(mismatched),
            "mismatch_refused_400": refused,
            "mismatch_accepted": len(accepted),
            "mismatch_refused_otherwise": otherwise,
            "session_minted": len(minted),
        },
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={str(Attribution.SERVER): len(bad)},
        notes=notes,
        truth_from="the wire (proxy tap)",
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    what = f"{r['jsonrpc_method'] or r['method']} by {r['conn']} {at(r['t'], ctx.origin)}"
    faults = _faults_of(r["faults"])
    if r["check"] == MISMATCH_ACCEPTED:
        detail = next((f.get("detail") for f in faults if f.get("fault") == MISMATCH), None)
        told = detail if isinstance(detail, dict) else {}
        header = {"version": "MCP-Protocol-Version", "method": "Mcp-Method", "name": "Mcp-Name"}
        text = (
            f"a modern-era {what} carried {header.get(str(told.get('header')), 'a header')} "
            f"{told.get('sent')!r}, which its body contradicts (the proxy's mismatch_header), and the "
            f"server served it ({int(r['status'])}), where it must refuse it with 400 HeaderMismatch"
        )
    else:
        text = (
            f"a modern-era {what} was answered {int(r['status'])} with an Mcp-Session-Id ({r['session_out']})"
        )
    fields = row_of(
        r, ["flow", "t", "conn", "jsonrpc_method", "tool", "protocol_version_in", "status", "session_out"]
    )
    refs = tap_ref(r) + fault_refs(f.get("decision") for f in faults)
    return Witness(str(r["check"]), text, Attribution.SERVER, fields, tuple(refs))


RULE = Rule(
    id="modern_requests",
    number=15,
    title="Modern-era requests: headers checked, no session minted",
    blames=(Attribution.SERVER,),
    evidence="modern-era requests answered by the server, and mismatched headers injected (mismatch_header)",
    check=check,
    check_under_test=check,
    applies=lambda ctx: "modern" in ctx.eras(),
    eras=frozenset({"modern"}),
    era_note="it has sessions, and no headers that mirror the body",
)
