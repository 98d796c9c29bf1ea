"""report.json — the machine-readable report, schema `mcpLabReport.v2` (docs/report.md).

The document is built from the `RunReport` alone; every float that is not finite is
written as null (JSON has no infinity), and the meaning of such a null is stated next to
it where it matters (e.g. resume p99: `p99_s` null with `p99_unbounded` true).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lab import __version__
from lab.checker import GateResult, JsonValue, Liveness, RunReport, short_reason

REPORT_SCHEMA = "mcpLabReport.v2"


def clean(value: Any) -> JsonValue:
    """A JSON-ready copy: non-finite floats become None, tuples lists, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [clean(v) for v in value]
    return str(value)


EXPECTED_TEXT = {
    "known": "known failure (in the baseline): does not fail the run",
    "fixed": "fixed: remove it from the baseline (the run fails until it is removed)",
    "unseen": "in the baseline, but inconclusive here: nothing learned",
}
"""How the report words each baseline status (lab.checker.judge.baseline)."""


def gate_document(g: GateResult, expected: str | None = None) -> dict[str, JsonValue]:
    """One gate; `expected`: its baseline status (known, fixed, unseen) or None."""
    return {
        "number": g.number,
        "gate": g.gate,
        "title": g.title,
        "verdict": str(g.verdict),
        "summary": g.summary,
        "budget": clean(g.budget),
        "measured": clean(g.measured),
        "evidence": [
            {
                "name": e.name,
                "required": e.required,
                "observed": e.observed,
                "ok": e.ok,
                "detail": e.detail,
                "from_faults": e.from_faults,
            }
            for e in g.evidence
        ],
        "violations": g.violations,
        "witnesses": [
            {
                "check": w.check,
                "explanation": w.explanation,
                "attribution": str(w.attribution),
                "row": clean(w.row),
                "refs": list(w.refs),
            }
            for w in g.witnesses
        ],
        "attribution_counts": clean(g.attribution_counts),
        "notes": list(g.notes),
        "error": g.error,
        "truth_from": g.truth_from or None,
        "expected": expected,
    }


def document(report: RunReport, figures: Sequence[Mapping[str, str]] = ()) -> dict[str, JsonValue]:
    run = report.run
    expected = {e.gate: e.status for e in report.expectations}
    duration = (
        run.stopped_at - run.started_at if run.started_at is not None and run.stopped_at is not None else None
    )
    doc: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "run": {
            "run_id": run.run_id,
            "complete": run.complete,
            "end_reason": run.end_reason,
            "started_at": run.started_at,
            "stopped_at": run.stopped_at,
            "duration_s": duration,
            "scenario": run.scenario,
            "seed": run.seed,
            "target": run.target,
            "fault_windows": [{"fault": f, "start": s, "end": e} for f, s, e in run.fault_windows],
            "overrides": dict(run.overrides),
        },
        "incomplete": report.incomplete,
        "verdict": str(report.verdict),
        "exit_code": int(report.verdict.exit_code),
        "event_count": report.event_count,
        "event_count_source": report.event_count_source,
        "budgets": dict(report.budgets),
        "budgets_defaulted": list(report.budgets_defaulted),
        "client": client_document(report),
        # Keyed by the rule's stable ID, in display order (v1 had a list `gates`).
        "rules": {g.gate: gate_document(g, expected.get(g.gate)) for g in report.gates},
        "faults": {
            "counts": [
                {
                    "fault": f.fault,
                    "total": f.total,
                    "by_source": dict(f.by_source),
                    "configured": f.configured,
                }
                for f in report.faults
            ],
            "never_fired": list(report.faults_never_fired),
            "not_applicable": [
                {"fault": n.fault, "reason": n.reason, "count": n.count} for n in report.faults_not_applicable
            ],
        },
        "liveness": liveness_document(report.liveness, run.started_at),
        "inputs": [
            {
                "path": s.path,
                "kind": s.kind,
                "schema": s.schema,
                "status": s.status,
                "error": s.error,
                "rows": dict(s.rows),
            }
            for s in report.sources
        ],
        "problems": [{"path": p.path, "message": p.message} for p in report.problems],
        "notes": list(report.notes),
        # Beside the gates (lab.checker.judge.sections): phases, capacity, rollout, processes.
        **dict(report.sections),
        "figures": [dict(f) for f in figures],
        "checker": {
            "version": __version__,
            "checked_at": report.checked_at,
            "check_seconds": report.check_seconds,
        },
    }
    cleaned = clean(doc)
    assert isinstance(cleaned, dict)
    return cleaned


def client_document(report: RunReport) -> dict[str, JsonValue] | None:
    """Who the load was: `kind` (lab, python-sdk, ...), `implementation` (`name version`),
    the known failures and where they come from."""
    c = report.client
    if c is None:
        return None
    return {
        "kind": c.kind,
        "implementation": c.implementation,
        "expected_failures": list(c.expected_failures),
        "baseline": c.baseline,
    }


def client_text(doc: Mapping[str, Any]) -> str | None:
    """`client python-sdk (mcp 2.3.0)`, for the report's headline; None for the lab's own."""
    c = doc.get("client")
    if not isinstance(c, Mapping) or c.get("kind") in (None, "lab"):
        return None
    impl = f" ({c['implementation']})" if c.get("implementation") else ""
    return f"client under test {c['kind']}{impl}"


def reason(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Why the verdict is what it is, for the top of the report: the failing gates' one-line
    summaries and the first witness (`first`: gate, attribution, explanation); when no gate
    failed, why the run proves nothing: it did not finish, the gates that could not decide
    and the evidence they lacked, the inputs that could not be read. No lines for a pass."""
    lines: list[str] = []
    first = None
    gates = rules_of(doc)
    failing = [g for g in gates if g["verdict"] == "fail"]
    for g in failing:
        lines.append(f"{g['number']}. {g['title']}: {g['summary']}")
        if first is None and g["witnesses"]:
            w = g["witnesses"][0]
            first = {"gate": g["number"], "attribution": w["attribution"], "explanation": w["explanation"]}
    if not failing:
        if doc.get("incomplete"):
            end = short_reason(doc["run"].get("end_reason"))
            lines.append(f"the run did not finish ({end}): its ledgers stop early, so no gate can pass")
        for g in gates:
            if g["verdict"] == "inconclusive":
                unmet = [
                    f"{e['name']}: need {e['required']}, have {e['observed']}"
                    for e in g["evidence"]
                    if not e["ok"]
                ]
                lacking = "; ".join(unmet) or g["error"] or g["summary"]
                lines.append(f"{g['number']}. {g['title']} could not decide: {lacking}")
        lines += [f"{p['path']}: {p['message']}" for p in doc["problems"]]
    return {"lines": lines, "first": first}


def events_text(doc: Mapping[str, Any]) -> str:
    """The run's event count in words, with who counted it (report.json `event_count_source`)."""
    events = doc.get("event_count")
    if events is None:
        return "event count unknown"
    by = {"tap": "counted by the proxy", "server": "counted from the server ledger"}
    source = doc.get("event_count_source")
    return f"{events:,} events ({by.get(str(source), str(source))})"


def basis_text(doc: Mapping[str, Any]) -> str | None:
    """`judged from the wire alone: <why>` when the target's own ledger did not take part
    (a run of the reference server whose ledger is missing or unreadable: the verdict
    then rests on the proxy's record and the clients' ledgers only; a URL target keeps
    none the lab reads), None when it did. For the verdict line: a PASS without the
    server's testimony must say so where it is read."""
    server = next((s for s in doc.get("inputs") or () if s.get("kind") == "server"), None)
    if server is not None and server.get("status") == "ok":
        return None
    if str(doc["run"].get("target") or "").split(" ")[0] != "reference":  # "reference [URL]"
        return "judged from the wire alone: the target keeps no ledger the lab reads"
    routing = (doc.get("rules") or {}).get("session_routing") or {}
    replicas = (routing.get("measured") or {}).get("replicas")
    if isinstance(replicas, int) and replicas > 1 and (server is None or server.get("status") == "missing"):
        return (
            f"judged from the wire alone: {replicas} replicas, each with its own state, keep no shared ledger"
        )
    if server is None or server.get("status") == "missing":
        why = "the reference server's ledger is missing"
    else:
        why = (
            f"the reference server's ledger could not be read ({server.get('error') or server.get('status')})"
        )
    where = server.get("path") if server is not None else "server/ledger.sqlite"
    return f"judged from the wire alone: {why} ({where})"


def overrides_text(doc: Mapping[str, Any]) -> str | None:
    """`overridden: load.users = 50, load.duration = '20s'`, for the headline: the run is
    not the scenario's as written; None when nothing was overridden."""
    given = doc["run"].get("overrides") or {}
    if not given:
        return None
    return "overridden: " + ", ".join(f"{k} = {v!r}" for k, v in given.items())


def liveness_document(live: Liveness | None, origin: float | None) -> dict[str, Any] | None:
    if live is None:
        return None
    zero = origin or 0.0
    return {
        "calls_without_outcome": live.calls_without_outcome,
        "clients_stuck": list(live.clients_stuck),
        "collapses": [
            {
                "start": c.start,
                "end": c.end,
                "start_s": c.start - zero,
                "end_s": c.end - zero,
                "seconds": c.end - c.start,
                "throughput": c.throughput,
                "active_clients": c.active_clients,
                "typical_per_bin": c.typical_per_bin,
                "bin_s": c.bin_s,
            }
            for c in live.collapses
        ],
        "notes": list(live.notes),
    }


def dumps(doc: Mapping[str, JsonValue]) -> str:
    """report.json's text: strict JSON (no NaN or infinity), indented."""
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def rules_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rules of a report.json, in display order: v2's `rules` (keyed by rule ID), or a
    v1 document's `gates` list."""
    rules = doc.get("rules")
    if isinstance(rules, Mapping):
        return [dict(r, gate=k) for k, r in rules.items() if isinstance(r, Mapping)]
    gates = doc.get("gates")
    return [g for g in gates if isinstance(g, dict)] if isinstance(gates, list) else []


def triggers_text(doc: Mapping[str, Any]) -> str | None:
    """One line on report.json `fault_triggers` (None without firings)."""
    section = doc.get("fault_triggers")
    if not isinstance(section, Mapping) or not section.get("firings"):
        return None
    by = section.get("by")
    by = by if isinstance(by, Mapping) else {}
    return (
        f"{section['firings']} firings, each named by what a later run can meet again "
        f"(in {section.get('file')}): {by.get('event', 0)} at an event of a client's request, "
        f"{by.get('request', 0)} on a request, {by.get('time', 0)} by time only (toxics; "
        "requests of no lab client)."
    )


def trigger_examples(doc: Mapping[str, Any], n: int = 3) -> list[str]:
    """The first firings of report.json `fault_triggers`, in words."""
    section = doc.get("fault_triggers")
    examples = section.get("examples") if isinstance(section, Mapping) else None
    return [str(e) for e in examples[:n]] if isinstance(examples, list) else []
