"""report.md — the gate table as people read it in a terminal or a pull request.

Rendered from the report.json document, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VERDICT_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def gate_table(doc: Mapping[str, Any]) -> str:
    lines = ["| # | gate | verdict | measured |", "| --- | --- | --- | --- |"]
    for g in doc["gates"]:
        lines.append(
            f"| {g['number']} | {_cell(g['title'])} | **{VERDICT_MARK[g['verdict']]}** | {_cell(g['summary'])} |"
        )
    return "\n".join(lines)


def short_reason(reason: object, limit: int = 160) -> str:
    """The first line of run.json's end_reason, cut to `limit` characters (an `error: …`
    reason can hold a whole usage message; report.json keeps it whole)."""
    first = str(reason or "unknown").strip().splitlines()[0] if reason else "unknown"
    return first if len(first) <= limit else first[: limit - 1] + "…"


def incomplete_banner(doc: Mapping[str, Any]) -> str | None:
    if not doc.get("incomplete"):
        return None
    reason = short_reason(doc["run"].get("end_reason"))
    return f"INCOMPLETE RUN (end_reason: {reason}): the run was interrupted; its ledgers stop early."


def render(doc: Mapping[str, Any]) -> str:
    run = doc["run"]
    out = [f"# lab report — {run['run_id']}", ""]
    banner = incomplete_banner(doc)
    if banner:
        out += [f"> **{banner}**", ""]
    events = doc["event_count"]
    out.append(
        f"**Verdict: {VERDICT_MARK[doc['verdict']]}** (exit {doc['exit_code']}) · scenario {run.get('scenario') or '?'}"
        f" · seed {run.get('seed')} · "
        + (
            f"{events:,} events ({doc['event_count_source']})"
            if events is not None
            else "event count unknown"
        )
    )
    out += ["", gate_table(doc), ""]
    for g in doc["gates"]:
        unmet = [e for e in g["evidence"] if not e["ok"]]
        if not (g["witnesses"] or unmet or g["error"] or g["notes"]):
            continue
        out.append(f"## {g['number']}. {g['title']} — {VERDICT_MARK[g['verdict']]}")
        if g["error"]:
            out.append(f"- checker error: `{g['error']}`")
        for e in unmet:
            detail = f" ({e['detail']})" if e["detail"] else ""
            out.append(f"- evidence not met: {e['name']}: need {e['required']}, have {e['observed']}{detail}")
        if g["witnesses"]:
            shown = len(g["witnesses"])
            out.append(f"- witnesses ({shown} of {g['violations']}):")
            out += [f"  - [{w['attribution']}] {w['explanation']}" for w in g["witnesses"]]
        out += [f"- note: {n}" for n in g["notes"]]
        out.append("")
    faults = doc["faults"]
    if faults["counts"]:
        out += [
            "## Faults fired",
            "",
            "| fault | fired | configured | seen in |",
            "| --- | --- | --- | --- |",
        ]
        for f in faults["counts"]:
            seen = ", ".join(f"{k} {v}" for k, v in f["by_source"].items()) or "—"
            out.append(
                f"| {_cell(f['fault'])} | {f['total']} | {'yes' if f['configured'] else 'no'} | {seen} |"
            )
        out.append("")
    if faults["never_fired"]:
        out += [f"Configured but never fired: {', '.join(faults['never_fired'])}", ""]
    if doc["problems"]:
        out += ["## Problems", ""] + [f"- `{p['path']}`: {p['message']}" for p in doc["problems"]] + [""]
    if doc["notes"]:
        out += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(out).rstrip() + "\n"
