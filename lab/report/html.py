"""report.html — one self-contained file: gate table, liveness, witnesses with links to
their raw rows, figures, faults, inputs.

Rendered from the report.json document with the Jinja2 template of the `dashboards`
package, with autoescaping on: every text that comes from a ledger is HTML-escaped by
the template engine, not by hand. Figures are embedded as base64 `data:` URLs and the
style sheet and script are inlined, so the file can be mailed or attached to a CI run as
is. Each witness links (`#ev-…`) to an appendix holding the raw ledger row behind each of
its `refs`.

A few lines of inline script count the figures the browser actually decoded and write
the count to `<body data-figures-loaded="N">`; a headless browser's `--dump-dom` shows
it, which is how the tests check that the figures render.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup

from dashboards import asset
from lab.checker import short_reason
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


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a name the template expects but is not given: an error
        keep_trailing_newline=True,
    )
    return env.from_string(asset("report.html.j2"))


def anchor(ref: str) -> str:
    """The HTML id of one raw-evidence ref (ids must not hold '/', '#', ':' for CSS)."""
    return "ev-" + re.sub(r"[^A-Za-z0-9_-]", "-", ref)


def banner(doc: Mapping[str, Any]) -> str | None:
    if not doc.get("incomplete"):
        return None
    reason = short_reason(doc["run"].get("end_reason"))
    return f"INCOMPLETE RUN (end_reason: {reason}): the run did not finish; its ledgers stop early, so it cannot pass."


def render(
    doc: Mapping[str, Any], images: Mapping[str, bytes], evidence: Mapping[str, str] | None = None
) -> str:
    """The page. `images`: PNG bytes by file name; `evidence`: raw row text by ref."""
    evidence = evidence or {}
    run = doc["run"]
    faults = doc["faults"]
    # A run that did not finish, or could not be judged, proves no gate: its gates that
    # found nothing are shown as such, in a neutral colour, never as a green PASS.
    unproven = bool(doc.get("incomplete")) or doc["verdict"] == "inconclusive"
    gates = [_gate(g, evidence, unproven=unproven) for g in rules_of(doc)]
    context = {
        "title": f"lab report — {run['run_id']}",
        "banner": banner(doc),
        "verdict": doc["verdict"],
        "exit_code": doc["exit_code"],
        "facts": _facts(doc),
        "gates": gates,
        "why": reason(doc),
        "liveness": liveness_lines(doc),
        "sections": sections.blocks(doc),
        "figures": [_figure(f, images) for f in doc.get("figures", [])],
        "faults": [
            {
                "fault": f["fault"],
                "total": f["total"],
                "configured": f["configured"],
                "seen": ", ".join(f"{k} {v}" for k, v in f["by_source"].items()),
            }
            for f in faults["counts"]
        ],
        "never_fired": faults["never_fired"],
        "triggers": triggers_text(doc),
        "trigger_examples": trigger_examples(doc),
        "not_applicable": [f"{n['fault']}: {n['reason']}" for n in faults.get("not_applicable", [])],
        "inputs": [
            {
                "path": s["path"],
                "schema": s["schema"],
                "status": s["status"],
                "detail": s["error"] or ", ".join(f"{k} {v}" for k, v in s["rows"].items()),
            }
            for s in doc["inputs"]
        ],
        "problems": doc["problems"],
        "notes": doc.get("notes", []),
        "evidence": [{"ref": r, "anchor": anchor(r), "raw": raw} for r, raw in evidence.items()],
        "schema": doc["schema"],
        "version": str(doc["checker"]["version"]),
        # Our own files, trusted: inlined as they are (escaping would break the script).
        "css": Markup(asset("report.css")),
        "script": Markup(asset("report.js")),
    }
    return _template().render(context)


def _facts(doc: Mapping[str, Any]) -> list[str]:
    """The run in a few words, under the title."""
    run = doc["run"]
    facts = [
        f"scenario {run.get('scenario') or '?'}",
        f"seed {run.get('seed')}",
        f"target {run.get('target') or '?'}",
        events_text(doc),
    ]
    if run.get("duration_s") is not None:
        facts.append(f"{run['duration_s']:.1f} s")
    who = client_text(doc)
    if who:
        facts.append(who)
    changed = overrides_text(doc)
    if changed:
        facts.append(changed)
    basis = basis_text(doc)
    if basis:
        facts.append(basis)
    return facts


def _gate(g: Mapping[str, Any], evidence: Mapping[str, str], *, unproven: bool = False) -> dict[str, Any]:
    """One gate as the template shows it; its witnesses link only the refs whose raw rows
    the appendix holds."""
    # A client under test: where the gate's truth came from, and its baseline status.
    said = [EXPECTED_TEXT[g["expected"]]] if g.get("expected") else []
    said += [f"evidence from: {g['truth_from']}"] if g.get("truth_from") else []
    witnesses = [
        {
            "attribution": w["attribution"],
            "explanation": w["explanation"],
            "refs": [{"ref": r, "anchor": anchor(r)} for r in w.get("refs", []) if r in evidence],
        }
        for w in g["witnesses"]
    ]
    return {
        "number": g["number"],
        "title": g["title"],
        "verdict": g["verdict"],
        "badge": ("no violation", "held")
        if unproven and g["verdict"] == "pass"
        else ("N/A", g["verdict"])
        if g["verdict"] == "not_applicable"
        else (g["verdict"].upper(), g["verdict"]),
        "summary": (f"{said[0]}. " if g.get("expected") else "") + g["summary"],
        "evidence": [
            {"ok": bool(e["ok"]), "text": f"{e['name']}: need {e['required']}, got {e['observed']}"}
            for e in g["evidence"]
        ],
        "witnesses": witnesses,
        "violations": g["violations"],
        "error": g["error"],
        "notes": [*said, *g["notes"]],
    }


def _figure(f: Mapping[str, Any], images: Mapping[str, bytes]) -> dict[str, Any]:
    """A figure, embedded as a `data:` URL (None: its PNG was not drawn)."""
    png = images.get(f["file"])
    src = None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"file": f["file"], "title": f["title"], "src": src}


def liveness_lines(doc: Mapping[str, Any]) -> list[str]:
    """The liveness findings next to the gates, one line each (also used by report.md)."""
    live = doc.get("liveness")
    if not isinstance(live, Mapping):
        return []
    lines = []
    stuck = live.get("calls_without_outcome") or 0
    if stuck:
        clients = live.get("clients_stuck") or []
        lines.append(
            f"{stuck} call(s) never got an outcome (counted as never recovered in gate 5); "
            f"{len(clients)} client(s) stuck at the end: {', '.join(str(c) for c in clients[:10])}"
            + (" …" if len(clients) > 10 else "")
        )
    for c in live.get("collapses") or []:
        lines.append(
            f"throughput collapsed from T+{c['start_s']:.0f} s to T+{c['end_s']:.0f} s: "
            f"{c['throughput']} answered requests and events in {c['seconds']:.0f} s while "
            f"{c['active_clients']} clients were active (typical {c['typical_per_bin']:g} per {c['bin_s']:.0f} s)"
        )
    lines += [str(n) for n in live.get("notes") or []]
    return lines
