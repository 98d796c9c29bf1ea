"""The tap's flow-level records, built from plain facts (pure); docs/ledgers.md has every field.

The per-event records (`sent`, `forwarded`, `dropped`) are made by the SSE pipe
(`lab.faults.pipeline`), write receipts (`result`) by `lab.faults.results`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.faults.facts import RequestFacts, bearer_token, origin_allowed
from lab.faults.plan import Plan
from lab.wire.redact import Redactor
from lab.wire.revisions import LAST_EVENT_ID_HEADER, PROTOCOL_VERSION_HEADER

METADATA_KEY = "mcp_lab"
"""`flow.metadata[METADATA_KEY]`: what the fault addon did to a flow, for the tap and other
addons: `{"key", "stream", "faults": [{"fault", "rule", "decision", "detail"?}],
"answered_by": "server"|"proxy", "cut"?: true, "origin_rewritten"?: true, "replica"?: int}`
(`replica`: the index of the upstream the request was routed to, lab.faults.balance)."""


def flow_record(
    facts: RequestFacts,
    t: float,
    headers_out: Mapping[str, str],
    status: int | None,
    session_id_out: str | None,
    meta: Mapping[str, Any],
    allowed_origins: tuple[str, ...],
    redactor: Redactor,
) -> dict[str, Any]:
    """The `flow` record: the request as the client sent it (`*_in`), as it went to the
    server (`*_out`), the answer's status, the request/response faults applied, and the
    replica it was routed to when the proxy balances (`replica`, else absent)."""
    f = facts
    origin_out = headers_out.get("origin")
    allowed: bool | None = None
    if meta.get("origin_rewritten"):
        allowed = False
    elif origin_out is not None and allowed_origins:
        allowed = origin_allowed(origin_out, allowed_origins)
    record: dict[str, Any] = {
        "type": "flow",
        "flow": f.flow,
        "t": t,
        "conn": f.conn,
        "method": f.http_method,
        "path": f.path,
        "stream": f.stream,
        "session": f.session,
        "session_out": redactor.session(session_id_out),
        "jsonrpc_id": f.rpc.id,
        "jsonrpc_method": f.rpc.method,
        "tool": f.rpc.tool,
        "idempotency_key": f.rpc.idempotency_key,
        "origin_in": f.origin,
        "origin_out": origin_out,
        "origin_allowed_out": allowed,
        "last_event_id_in": f.last_event_id,
        "last_event_id_out": headers_out.get(LAST_EVENT_ID_HEADER),
        "protocol_version_in": f.protocol_version,
        "protocol_version_out": headers_out.get(PROTOCOL_VERSION_HEADER),
        "auth_in": redactor.token(f.token),
        "auth_out": redactor.token(bearer_token(headers_out.get("authorization"))),
        "status": status,
        "answered_by": meta.get("answered_by", "server"),
        "faults": list(meta.get("faults", ())),
    }
    replica = meta.get("replica")
    if replica is not None:  # only behind a balancer (mcpfaults_replicas): absent otherwise
        record["replica"] = replica
    return record


def plan_record(plan: Plan, t: float, source: str, version: int, run_start: float) -> dict[str, Any]:
    """A fault plan became active."""
    return {
        "type": "plan",
        "t": t,
        "source": source,
        "digest": plan.digest,
        "version": version,
        "seed": plan.seed,
        "run_start": run_start,
        "rules": [{"id": r.id, "kind": r.kind, "rate": r.rate} for r in plan.rules],
        "error": None,
    }


def plan_error_record(t: float, source: str, error: str) -> dict[str, Any]:
    """A plan that could not be used (the previous one stays active)."""
    return {"type": "plan", "t": t, "source": source, "digest": None, "error": error}
