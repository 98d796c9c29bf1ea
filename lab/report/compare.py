"""`lab compare BASE NEW`: what got worse from one run to the next (pure; reads two
report.json documents, as `lab report` wrote them).

A regression is something a release manager would hold a release for:
- a rule (gate or check) that no longer passes where it passed (PASS -> FAIL), or fails
  where the base run could not tell (INCONCLUSIVE -> FAIL);
- a failing rule with more violations than before;
- the target's share of the resume latency p99 (the figure gate 5 judges a server on)
  up by more than the tolerance (and by more than 0.1 s: noise on a fast server);
- fewer events per second over the run, or a higher share of failed calls, beyond the
  tolerance (capacity planning compares these).
The figures are judged only between runs of one scenario (another load shape gives other
rates); the rules always are.

Weaker evidence is not a regression but is said: a rule PASS -> INCONCLUSIVE, or a run
that did not finish. Everything else (lab's own CPU, reconnect peak, the totals) is shown
for reading, never judged: two runs differ a little, always.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.exitcodes import ExitCode

DEFAULT_TOLERANCE = 0.25
"""A measured figure must move by more than this share of the base's to count."""
LATENCY_FLOOR_S = 0.1
"""...and a latency by more than this many seconds."""
ERROR_RATE_FLOOR = 0.01
"""...and a call error rate by more than one percentage point."""

_RANK = {"not_applicable": 0, "pass": 0, "inconclusive": 1, "fail": 2}


class CompareInputError(Exception):
    """A folder that holds no readable report.json."""


def load_report(path: Path) -> dict[str, Any]:
    """The report.json of run folder `path` (or `path` itself, a report.json)."""
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise CompareInputError(
            f"{path}: no report.json (is it a run folder? `lab report {path}` writes one)"
        )
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CompareInputError(f"{file}: not a readable report.json: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), dict):
        raise CompareInputError(f"{file}: not a report of `lab report` (no rules)")
    return doc


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the comparison table."""

    what: str
    base: str
    new: str
    change: str = ""
    judged: str = ""
    """'regressed', 'weaker', 'better' or '' (shown only, or unchanged)."""


@dataclass(slots=True)
class Comparison:
    rows: list[Row] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    weaker: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        if self.regressions:
            return ExitCode.GATE_FAILED
        if self.weaker:
            return ExitCode.INCONCLUSIVE
        return ExitCode.PASS

    @property
    def headline(self) -> str:
        if self.regressions:
            return f"REGRESSED: {len(self.regressions)} regression(s): " + "; ".join(self.regressions)
        if self.weaker:
            return "no regression found, but the evidence is weaker: " + "; ".join(self.weaker)
        return "no regression"

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": "regressed" if self.regressions else "weaker" if self.weaker else "no_regression",
            "exit_code": int(self.exit_code),
            "regressions": self.regressions,
            "weaker": self.weaker,
            "notes": self.notes,
            "rows": [
                {"what": r.what, "base": r.base, "new": r.new, "change": r.change, "judged": r.judged}
                for r in self.rows
            ],
        }


def compare(base: dict[str, Any], new: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    c = Comparison()
    _about_the_runs(c, base, new)
    _rules(c, base, new)
    _figures(c, base, new, tolerance)
    return c


def _run(doc: dict[str, Any]) -> dict[str, Any]:
    run = doc.get("run")
    return run if isinstance(run, dict) else {}


def _about_the_runs(c: Comparison, base: dict[str, Any], new: dict[str, Any]) -> None:
    b, n = _run(base), _run(new)
    for key, words in (("scenario", "scenarios"), ("target", "targets"), ("seed", "seeds")):
        if b.get(key) != n.get(key):
            c.notes.append(f"the runs have different {words} ({b.get(key)} vs {n.get(key)})")
    c.rows.append(Row("run", str(b.get("run_id", "?")), str(n.get("run_id", "?"))))
    c.rows.append(Row("verdict", str(base.get("verdict", "?")), str(new.get("verdict", "?"))))
    for name, doc in (("base", base), ("new", new)):
        if doc.get("incomplete") or _run(doc).get("complete") is False:
            c.weaker.append(f"the {name} run did not finish ({_run(doc).get('end_reason', 'incomplete')})")


def _rules(c: Comparison, base: dict[str, Any], new: dict[str, Any]) -> None:
    brules, nrules = base["rules"], new["rules"]
    names = list(brules) + [k for k in nrules if k not in brules]
    for name in names:
        b, n = brules.get(name), nrules.get(name)
        label = _rule_label(name, n or b)
        if b is None or n is None:
            c.rows.append(Row(label, _verdict(b), _verdict(n), "only in one run"))
            c.notes.append(f"{label} is judged in only one of the runs")
            continue
        bv, nv = str(b.get("verdict")), str(n.get("verdict"))
        bx, nx = _violations(b), _violations(n)
        judged, change = "", ""
        if _RANK.get(nv, 1) > _RANK.get(bv, 1) and nv == "fail":
            judged, change = "regressed", f"{bv} -> fail"
            c.regressions.append(f"{label}: {bv.upper()} -> FAIL ({_summary(n)})")
        elif bv == "pass" and nv == "inconclusive":
            judged, change = "weaker", "pass -> inconclusive"
            c.weaker.append(f"{label}: PASS -> INCONCLUSIVE ({_summary(n)})")
        elif bv == nv == "fail" and nx > bx:
            judged, change = "regressed", f"violations {bx} -> {nx}"
            c.regressions.append(f"{label}: still FAIL, violations {bx} -> {nx}")
        elif _RANK.get(nv, 1) < _RANK.get(bv, 1):
            judged, change = "better", f"{bv} -> {nv}"
        c.rows.append(Row(label, f"{bv} ({bx})", f"{nv} ({nx})", change, judged))


def _rule_label(name: str, rule: dict[str, Any]) -> str:
    number = rule.get("number")
    title = rule.get("title") or name
    return f"rule {number} {title}" if number is not None else str(title)


def _verdict(rule: dict[str, Any] | None) -> str:
    return "-" if rule is None else str(rule.get("verdict"))


def _violations(rule: dict[str, Any]) -> int:
    v = rule.get("violations")
    if isinstance(v, list):
        return len(v)
    return v if isinstance(v, int) else 0


def _summary(rule: dict[str, Any]) -> str:
    return str(rule.get("summary") or "").strip() or "no summary"


def _figures(c: Comparison, base: dict[str, Any], new: dict[str, Any], tolerance: float) -> None:
    b, n = _measures(base), _measures(new)
    if _run(base).get("scenario") != _run(new).get("scenario"):
        # Another load shape gives other rates: shown, not judged; the rules still are.
        c.notes.append("the figures are shown, not judged: the runs are of different scenarios")
        tolerance = float("inf")
    higher_is_worse = (
        ("resume p99, the target's share (s)", "target_p99_s", LATENCY_FLOOR_S),
        ("call error rate", "call_error_rate", ERROR_RATE_FLOOR),
    )
    for label, key, floor in higher_is_worse:
        bv, nv = b.get(key), n.get(key)
        row = _figure_row(label, bv, nv)
        if bv is not None and nv is not None and nv - bv > max(floor, tolerance * bv):
            c.regressions.append(f"{label} {_fmt(bv)} -> {_fmt(nv)}")
            row = Row(row.what, row.base, row.new, row.change, "regressed")
        c.rows.append(row)
    bv, nv = b.get("events_per_s"), n.get("events_per_s")
    row = _figure_row("events per second", bv, nv)
    if bv is not None and nv is not None and bv > 0 and bv - nv > tolerance * bv:
        c.regressions.append(f"events per second {_fmt(bv)} -> {_fmt(nv)}")
        row = Row(row.what, row.base, row.new, row.change, "regressed")
    c.rows.append(row)
    for label, key in (
        ("events", "events"),
        ("resume p99, all shares (s)", "total_p99_s"),
        ("recoveries", "recoveries"),
        ("reconnects, peak per second", "reconnect_peak"),
        ("the lab's own CPU (cores)", "lab_cores"),
    ):
        c.rows.append(_figure_row(label, b.get(key), n.get(key)))


def _figure_row(label: str, bv: float | None, nv: float | None) -> Row:
    change = ""
    if bv is not None and nv is not None:
        delta = nv - bv
        change = ("+" if delta >= 0 else "-") + _fmt(abs(delta)) + (f" ({delta / bv:+.0%})" if bv else "")
    return Row(label, _fmt(bv), _fmt(nv), change)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"


def _measures(doc: dict[str, Any]) -> dict[str, float]:
    """The figures compared, from a report.json; a figure the report lacks is left out."""
    out: dict[str, float] = {}
    if isinstance(doc.get("event_count"), int | float):
        out["events"] = float(doc["event_count"])
        duration = _run(doc).get("duration_s")
        if isinstance(duration, int | float) and duration > 0:
            out["events_per_s"] = doc["event_count"] / duration
    resume = doc["rules"].get("resume_p99", {}).get("measured", {})
    shares = resume.get("shares") if isinstance(resume, dict) else None
    if isinstance(shares, dict):
        for share, key in (("target", "target_p99_s"), ("total", "total_p99_s")):
            p99 = (shares.get(share) or {}).get("p99_s")
            if isinstance(p99, int | float):
                out[key] = float(p99)
    if isinstance(resume, dict) and isinstance(resume.get("recoveries"), int):
        out["recoveries"] = float(resume["recoveries"])
    phases = [p for p in doc.get("phases") or [] if isinstance(p, dict)]
    calls = sum(p.get("calls") or 0 for p in phases)
    if calls:
        out["call_error_rate"] = sum(p.get("call_errors") or 0 for p in phases) / calls
    peaks = [p["reconnect_qps_peak"] for p in phases if isinstance(p.get("reconnect_qps_peak"), int | float)]
    if peaks:
        out["reconnect_peak"] = float(max(peaks))
    parts = (doc.get("processes") or {}).get("parts") or []
    lab = [
        p["cpu_mean"] for p in parts if p.get("role") == "lab" and isinstance(p.get("cpu_mean"), int | float)
    ]
    if lab:
        out["lab_cores"] = float(sum(lab))
    return out


def render_text(c: Comparison, base_name: str, new_name: str) -> str:
    header = ("", "base", "new", "change", "")
    lines = [header] + [(r.what, r.base, r.new, r.change, r.judged.upper()) for r in c.rows]
    widths = [max(len(row[i]) for row in lines) for i in range(5)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    out += [f"base: {base_name}", f"new:  {new_name}"]
    out += [f"note: {n}" for n in c.notes]
    out.append(c.headline)
    return "\n".join(out) + "\n"
