"""junit.xml — one test case per gate, for CI systems.

pass -> a plain test case; fail -> `<failure>` whose text lists the witnesses;
not applicable (a rule of another protocol era) -> `<skipped>`;
inconclusive -> `<error type="inconclusive">` (not `<skipped>`: a gate that could not be
decided must not look green in CI, as in the MCP conformance suite's "could not test").
An incomplete run adds a test case `run complete` with `<error type="incomplete">`, so
green gates of an interrupted run never read as a pass.
Rendered from the report.json document.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from lab.report.document import rules_of


def render(doc: Mapping[str, Any]) -> str:
    gates = rules_of(doc)
    incomplete = bool(doc.get("incomplete"))
    failures = sum(
        1
        for g in gates
        if (g["verdict"] == "fail" and g.get("expected") != "known") or g.get("expected") == "fixed"
    )
    errors = sum(1 for g in gates if g["verdict"] == "inconclusive") + int(incomplete)
    skipped = sum(1 for g in gates if g["verdict"] == "not_applicable" or g.get("expected") == "known")
    tests = len(gates) + int(incomplete)
    seconds = f"{doc['checker']['check_seconds']:.3f}"
    suites = ET.Element(
        "testsuites", name="lab report", tests=str(tests), failures=str(failures), errors=str(errors)
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"lab.gates.{doc['run']['run_id']}",
        tests=str(tests),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=seconds,
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("run_id", doc["run"]["run_id"]),
        ("complete", doc["run"]["complete"]),
        ("verdict", doc["verdict"]),
        ("event_count", doc["event_count"]),
    ):
        ET.SubElement(props, "property", name=name, value=str(value))
    for g in gates:
        case = ET.SubElement(
            suite, "testcase", classname="lab.gates", name=f"{g['number']} {g['gate']}", time="0"
        )
        details = [g["summary"]]
        details += [f"[{w['attribution']}] {w['explanation']}" for w in g["witnesses"]]
        details += [
            f"evidence not met: {e['name']}: need {e['required']}, have {e['observed']}"
            for e in g["evidence"]
            if not e["ok"]
        ]
        if g["error"]:
            details.append(f"checker error: {g['error']}")
        if doc.get("incomplete"):
            details.append("the run is incomplete")
        if g.get("expected") == "known":  # in the baseline: a known failure, not a red test
            node = ET.SubElement(case, "skipped", message=f"known failure (baseline): {g['summary']}")
            node.text = "\n".join(details)
        elif g.get("expected") == "fixed":
            message = f"fixed: remove {g['gate']} from the baseline"
            node = ET.SubElement(case, "failure", message=message, type="baseline_out_of_date")
            node.text = "\n".join(details)
        elif g["verdict"] == "fail":
            node = ET.SubElement(case, "failure", message=g["summary"], type="gate_failed")
            node.text = "\n".join(details)
        elif g["verdict"] == "inconclusive":
            node = ET.SubElement(case, "error", message=g["summary"], type="inconclusive")
            node.text = "\n".join(details)
        elif g["verdict"] == "not_applicable":  # the rule does not exist in the era tested
            ET.SubElement(case, "skipped", message=g["summary"])
        else:
            ET.SubElement(case, "system-out").text = "\n".join(details)
    if incomplete:
        case = ET.SubElement(suite, "testcase", classname="lab.run", name="run complete", time="0")
        reason = doc["run"].get("end_reason") or "unknown"
        node = ET.SubElement(case, "error", message=f"the run is incomplete ({reason})", type="incomplete")
        node.text = "The run did not finish: its ledgers stop early and it cannot pass."
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
