"""report.md — the gate table as people read it in a terminal or a pull request.

Rendered from the report.json document, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.report import sections
from lab.report.document import (
    EXPECTED_TEXT,
    basis_text,
    client_text,
    events_text,
    overrides_text,
    reason,
    rules_of,
    trigger_examples,
    triggers_text,
)
from lab.report.html import banner, liveness_lines
from lab.report.table import markdown as blocks_markdown
from lab.report.table import md_cell

VERDICT_MARK = {
    "pass": "PASS",
    "fail": "FAIL",
    "inconclusive": "INCONCLUSIVE",
    "incomplete": "INCOMPLETE",
    "not_applicable": "N/A",
}


def gate_table(doc: Mapping[str, Any]) -> str:
    lines = ["| # | gate | verdict | measured |", "| --- | --- | --- | --- |"]
    for g in rules_of(doc):
        mark = f"**{VERDICT_MARK[g['verdict']]}**"
        if g.get("expected") in ("known", "fixed"):
            mark += " (known)" if g["expected"] == "known" else " (fixed: remove it from the baseline)"
        lines.append(f"| {g['number']} | {md_cell(g['title'])} | {mark} | {md_cell(g['summary'])} |")
    return "\n".join(lines)


def incomplete_banner(doc: Mapping[str, Any]) -> str | None:
    return banner(doc)


def render(doc: Mapping[str, Any]) -> str:
    run = doc["run"]
    out = [f"# lab report — {run['run_id']}", ""]
    text = banner(doc)
    if text:
        out += [f"> **{text}**", ""]
    out.append(
        f"**Verdict: {VERDICT_MARK[doc['verdict']]}** (exit {doc['exit_code']}) · scenario {run.get('scenario') or '?'}"
        f" · seed {run.get('seed')} · "
        + events_text(doc)
        + (f" · {who}" if (who := client_text(doc)) else "")
        + (f" · **{changed}**" if (changed := overrides_text(doc)) else "")
        + (f" · **{basis}**" if (basis := basis_text(doc)) else "")
    )
    why = reason(doc)
    if why["lines"]:
        out += ["", f"**Why {doc['verdict'].upper()}:**", ""] + [f"- {line}" for line in why["lines"]]
        if why["first"]:
            w = why["first"]
            out += ["", f"First witness (gate {w['gate']}, {w['attribution']}): {w['explanation']}"]
    out += ["", gate_table(doc), ""]
    live = liveness_lines(doc)
    if live:
        out += ["## Liveness", ""] + [f"- {line}" for line in live] + [""]
    out += blocks_markdown(sections.blocks(doc))
    for g in rules_of(doc):
        unmet = [e for e in g["evidence"] if not e["ok"]]
        if not (g["witnesses"] or unmet or g["error"] or g["notes"] or g.get("expected")):
            continue
        out.append(f"## {g['number']}. {g['title']} — {VERDICT_MARK[g['verdict']]}")
        if g.get("truth_from"):
            out.append(f"- evidence from: {g['truth_from']}")
        if g.get("expected"):
            out.append(f"- {EXPECTED_TEXT[g['expected']]}")
        if g["error"]:
            out.append(f"- checker error: `{g['error']}`")
        for e in unmet:
            detail = f" ({e['detail']})" if e["detail"] else ""
            out.append(f"- evidence not met: {e['name']}: need {e['required']}, have {e['observed']}{detail}")
        if g["witnesses"]:
            shown = len(g["witnesses"])
            out.append(f"- witnesses ({shown} of {g['violations']}):")
            for w in g["witnesses"]:
                out.append(f"  - [{w['attribution']}] {w['explanation']}")
                if w.get("refs"):
                    out.append(f"    raw: {', '.join(f'`{r}`' for r in w['refs'])}")
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
                f"| {md_cell(f['fault'])} | {f['total']} | {'yes' if f['configured'] else 'no'} | {seen} |"
            )
        out.append("")
    said = triggers_text(doc)
    if said:
        out += [said, "", *(f"- {md_cell(e)}" for e in trigger_examples(doc)), ""]
    if faults["never_fired"]:
        out += [f"Configured but never fired: {', '.join(faults['never_fired'])}", ""]
    for n in faults.get("not_applicable", []):
        out += [f"Not applicable to this target: {n['fault']}: {n['reason']}", ""]
    if doc["problems"]:
        out += ["## Problems", ""] + [f"- `{p['path']}`: {p['message']}" for p in doc["problems"]] + [""]
    if doc["notes"]:
        out += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(out).rstrip() + "\n"
