"""Every field the timeline adds to report.json is documented in docs/report.md, and
report.md shows the phase and capacity tables from the same document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.report import markdown
from lab.report.document import document, rules_of
from tests.phases.test_capacity import RAMP, ramp
from tests.phases.test_steady_state import AFTERMATH, PHASES, STEADY, STORM
from tests.phases.world import Stretch, judged, run_data, write_samples

ROOT = Path(__file__).resolve().parents[2]


def keys(value: Any) -> set[str]:
    """Every key of every mapping in `value`, at any depth (but not the values of
    mappings keyed by data: fault kinds, process names)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(k)
            if k not in ("faults", "lab_cpu_peak", "knobs", "bends", "bend_rules", "gate_violations"):
                out |= keys(v)
    elif isinstance(value, list):
        for v in value:
            out |= keys(v)
    return out


def test_timeline_fields_are_documented(tmp_path: Path) -> None:
    write_samples(tmp_path / "a", {"worker-0": [(0, 160, 0.3)], "server": [(0, 160, 0.2)]})
    steady: Any = document(
        judged(run_data([STEADY, STORM, AFTERMATH, Stretch(130, 160)], PHASES, run_dir=tmp_path / "a"))
    )
    write_samples(tmp_path / "b", {"worker-0": [(0, 120, 0.2), (120, 160, 0.99)]})
    cap: Any = document(judged(run_data(ramp(), RAMP, run_dir=tmp_path / "b")))
    names = keys(steady["phases"]) | keys(steady["processes"]) | keys(cap["capacity"])
    names |= {k for g in rules_of(steady) if g["number"] == 7 for k in keys(g["measured"])}
    documented = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in documented)
    assert not missing, f"docs/report.md does not document {missing}"
    text = markdown.render(cap)
    assert "## Phases" in text and "## Capacity: knee at 40 clients" in text and "## Lab processes" in text
    assert "| ramp-80 | 80 |" in text and "limited by the lab (worker-0" in text
