"""report.html — one self-contained file: gate table, witnesses, figures, faults, inputs.

Built from the report.json document and the PNG files it lists, all in the run folder:
figures are embedded as base64 `data:` URLs, the style sheet is inline, nothing is
fetched from anywhere, so the file can be mailed or attached to a CI run as is. Every
text from a ledger is HTML-escaped.

A few lines of inline script count the figures the browser actually decoded and write
the count to `<body data-figures-loaded="N">`; a headless browser's `--dump-dom` shows
it, which is how the tests check that the figures render.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from lab.checker.report_md import short_reason

VERDICT_COLORS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#ef6c00"}

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
.banner { background: #ffe0b2; border: 2px solid #ef6c00; padding: .8em 1em; font-weight: bold; margin: 1em 0; }
.verdict { display: inline-block; padding: .1em .6em; border-radius: 4px; color: #fff; font-weight: bold; }
table { border-collapse: collapse; width: 100%; margin: .8em 0 1.4em; }
th, td { border: 1px solid #ccc; padding: .35em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.meta { color: #555; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: .9em; }
code { background: #f3f3f3; padding: 0 .2em; }
.attr { font-family: monospace; white-space: nowrap; }
"""

SCRIPT = """
window.addEventListener('load', function () {
  var n = 0;
  document.querySelectorAll('img.figure').forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { n += 1; }
  });
  document.body.setAttribute('data-figures-loaded', String(n));
});
"""


def _badge(verdict: str) -> str:
    color = VERDICT_COLORS.get(verdict, "#555")
    return f'<span class="verdict" style="background:{color}">{escape(verdict.upper())}</span>'


def _banner(doc: Mapping[str, Any]) -> str:
    if not doc.get("incomplete"):
        return ""
    reason = short_reason(doc["run"].get("end_reason"))
    return (
        f'<div class="banner" id="incomplete">INCOMPLETE RUN (end_reason: {escape(reason)}): the run was '
        "interrupted; its ledgers stop early.</div>"
    )


def _gate_table(doc: Mapping[str, Any]) -> str:
    rows = []
    for g in doc["gates"]:
        unmet = "; ".join(
            f"{e['name']}: need {e['required']}, have {e['observed']}" for e in g["evidence"] if not e["ok"]
        )
        rows.append(
            f"<tr><td>{g['number']}</td><td>{escape(g['title'])}</td><td>{_badge(g['verdict'])}</td>"
            f"<td>{escape(g['summary'])}</td><td>{escape(unmet)}</td></tr>"
        )
    head = "<tr><th>#</th><th>gate</th><th>verdict</th><th>measured</th><th>evidence not met</th></tr>"
    return f'<table id="gates">{head}{"".join(rows)}</table>'


def _gate_details(doc: Mapping[str, Any]) -> str:
    parts = []
    for g in doc["gates"]:
        if not (g["witnesses"] or g["error"] or g["notes"]):
            continue
        parts.append(f"<h3>{g['number']}. {escape(g['title'])} {_badge(g['verdict'])}</h3>")
        if g["error"]:
            parts.append(f"<p>Checker error: <code>{escape(g['error'])}</code></p>")
        if g["witnesses"]:
            parts.append(f"<p>{len(g['witnesses'])} of {g['violations']} offending rows:</p><table>")
            parts.append("<tr><th>attribution</th><th>what happened</th></tr>")
            for w in g["witnesses"]:
                parts.append(
                    f'<tr><td class="attr">{escape(w["attribution"])}</td><td>{escape(w["explanation"])}</td></tr>'
                )
            parts.append("</table>")
        parts += [f"<p class='meta'>Note: {escape(n)}</p>" for n in g["notes"]]
    return "\n".join(parts) or "<p>No witnesses: no gate found a violation.</p>"


def _figures(doc: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    parts = []
    for f in doc.get("figures", []):
        png = images.get(f["file"])
        if png is None:
            parts.append(f"<p class='meta'>Figure {escape(f['file'])} is missing.</p>")
            continue
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(
            f'<figure><img class="figure" alt="{escape(f["title"])}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{escape(f['title'])}</figcaption></figure>"
        )
    return "\n".join(parts) or "<p class='meta'>No figures were drawn.</p>"


def _faults(doc: Mapping[str, Any]) -> str:
    counts = doc["faults"]["counts"]
    if not counts:
        return "<p class='meta'>No fault fired and none was configured.</p>"
    rows = "".join(
        f"<tr><td>{escape(f['fault'])}</td><td>{f['total']}</td><td>{'yes' if f['configured'] else 'no'}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in f['by_source'].items()))}</td></tr>"
        for f in counts
    )
    never = doc["faults"]["never_fired"]
    warn = f"<p><b>Configured but never fired:</b> {escape(', '.join(never))}</p>" if never else ""
    return (
        f"<table><tr><th>fault</th><th>fired</th><th>configured</th><th>seen in</th></tr>{rows}</table>{warn}"
    )


def _inputs(doc: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>{escape(s['path'])}</code></td><td>{escape(s['schema'])}</td><td>{escape(s['status'])}</td>"
        f"<td>{escape(s['error'] or ', '.join(f'{k} {v}' for k, v in s['rows'].items()))}</td></tr>"
        for s in doc["inputs"]
    )
    problems = "".join(
        f"<li><code>{escape(p['path'])}</code>: {escape(p['message'])}</li>" for p in doc["problems"]
    )
    listed = f"<ul id='problems'>{problems}</ul>" if problems else ""
    notes = "".join(f"<li>{escape(n)}</li>" for n in doc.get("notes", []))
    listed += f"<p>Notes:</p><ul id='notes'>{notes}</ul>" if notes else ""
    return f"<table><tr><th>file</th><th>schema</th><th>status</th><th>rows / error</th></tr>{rows}</table>{listed}"


def render(doc: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    run = doc["run"]
    events = doc["event_count"]
    facts = [
        f"scenario {run.get('scenario') or '?'}",
        f"seed {run.get('seed')}",
        f"target {run.get('target') or '?'}",
        f"{events:,} events ({doc['event_count_source']})" if events is not None else "event count unknown",
    ]
    if run.get("duration_s") is not None:
        facts.append(f"{run['duration_s']:.1f} s")
    title = f"lab report — {run['run_id']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>{STYLE}</style></head>
<body data-verdict="{escape(doc["verdict"])}">
<h1>{escape(title)}</h1>
{_banner(doc)}
<p>{_badge(doc["verdict"])} exit code {doc["exit_code"]} · <span class="meta">{escape(" · ".join(facts))}</span></p>
<h2>Gates</h2>
{_gate_table(doc)}
<h2>Witnesses</h2>
{_gate_details(doc)}
<h2>Figures</h2>
{_figures(doc, images)}
<h2>Faults fired</h2>
{_faults(doc)}
<h2>Inputs</h2>
{_inputs(doc)}
<p class="meta">schema {escape(doc["schema"])} · lab {escape(str(doc["checker"]["version"]))}</p>
<script>{SCRIPT}</script>
</body></html>
"""


def write_html(run_dir: Path, out: Path | None = None) -> Path:
    """Build report.html from the run folder's report.json and figure files."""
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    images = {}
    for f in doc.get("figures", []):
        path = run_dir / f["file"]
        if path.is_file():
            images[f["file"]] = path.read_bytes()
    target = out or run_dir / "report.html"
    target.write_text(render(doc, images), encoding="utf-8")
    return target
