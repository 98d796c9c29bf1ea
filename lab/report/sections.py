"""The report's sections beside the gates — unanswered requests by hop, the lab's own
latency, phases, capacity, rollout, the lab's own processes — as plain blocks of lines and tables, built from the report.json document
alone, so report.md and report.html show exactly the same thing.

    blocks(doc) -> [Block]    each: id, title, lines, tables (caption, columns, rows)
    markdown(blocks) -> str   report.md's sections
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class Table:
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass(frozen=True)
class Block:
    id: str
    title: str
    lines: Sequence[str] = ()
    tables: Sequence[Table] = field(default_factory=tuple)


def _num(value: Any, fmt: str = "{:g}", none: str = "—") -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return fmt.format(value)
    return str(value)


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value:.2%}"


def _p99(row: Mapping[str, Any]) -> str:
    if row.get("resume_p99_unbounded"):
        return "never"
    return _num(row.get("resume_p99_s"), "{:.3f} s")


def _top_cpu(peaks: Mapping[str, Any] | None, n: int = 3) -> str:
    if not peaks:
        return "—"
    ordered = sorted(peaks.items(), key=lambda kv: -float(kv[1] or 0))
    return ", ".join(f"{k} {float(v):.2f}" for k, v in ordered[:n])


def _faults(faults: Mapping[str, Any] | None) -> str:
    if not faults:
        return "—"
    return ", ".join(f"{k} {v}" for k, v in faults.items())


def _secs(value: Any) -> str:
    return _num(value, "{:.3f} s")


def _hop_cells(h: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(h, Mapping):
        return ["—"] * 4
    return [_num(h.get("count")), _secs(h.get("p50_s")), _secs(h.get("p99_s")), _secs(h.get("max_s"))]


def lab_latency_block(doc: Mapping[str, Any]) -> Block | None:
    ll = doc.get("lab_latency")
    if not isinstance(ll, Mapping):
        return None
    lines = [f"Warning: {w['text']}." for w in ll.get("warnings") or []]
    lines.append(
        f"A warning is raised when a hop's p99 is over {ll['warn_share']:.0%} of the resume budget "
        f"({_secs(ll.get('warn_above_s'))}); CPU and memory of each lab process: *Lab processes*."
    )
    resume = ll.get("resume")
    if isinstance(resume, Mapping) and resume.get("recoveries"):
        measured = "never" if resume.get("p99_unbounded") else _secs(resume.get("p99_s"))
        net = "never" if resume.get("net_p99_unbounded") else _secs(resume.get("net_p99_s"))
        lines.append(
            f"Resume latency p99 as measured {measured}; net of the lab's delivery delay {net} "
            f"({resume['joined']} of {resume['recoveries']} recoveries joined to the event that ended them)."
        )
    rows = []
    workers = []
    for h in ll.get("hops") or []:
        if h["hop"] == "nemesis":
            windows = h.get("windows") or []
            detail = "; ".join(
                f"{_num(w.get('latency_ms'))} ± {_num(w.get('jitter_ms'))} ms on {w.get('proxy')} "
                f"({w.get('stream')}) T+{_num(w.get('start_s'), '{:.0f}')}–{_num(w.get('end_s'), '{:.0f}')} s"
                for w in windows
            )
            rows.append(
                [
                    h["title"],
                    str(len(windows)),
                    "—",
                    "—",
                    _secs(h.get("configured_max_s")),
                    "—",
                    f"{h.get('why_not')}{': ' + detail if detail else ''}",
                ]
            )
            continue
        if not h.get("measured"):
            rows.append([h["title"], "—", "—", "—", "—", "—", f"not measured: {h.get('why_not')}"])
            continue
        outside = h.get("outside_toxics")
        notes = [f"{h['unmatched']} not joined"] if h.get("unmatched") else []
        if h.get("negative"):
            notes.append(f"{h['negative']} negative (two processes' clocks read at one moment)")
        rows.append(
            [
                h["title"],
                *_hop_cells(h),
                _secs(outside.get("p99_s")) if isinstance(outside, Mapping) else "—",
                "; ".join(notes) or "—",
            ]
        )
        workers += [[h["hop"], w["part"], *_hop_cells(w)] for w in h.get("by_worker") or []]
    tables = [
        Table(
            ["hop", "count", "p50", "p99", "max", "p99 outside latency toxics", "notes"],
            rows,
            "Per hop, over the run.",
        ),
    ]
    if len({w[1] for w in workers}) > 1:
        tables.append(Table(["hop", "worker", "count", "p50", "p99", "max"], workers, "Per Locust worker."))
    per_phase = [
        [
            p["name"],
            p["kind"],
            *_hop_cells(p.get("request"))[2:],
            *_hop_cells(p.get("upstream"))[2:],
            *_hop_cells(p.get("delivery"))[2:],
            _secs(p.get("nemesis_latency_max_s")),
        ]
        for p in ll.get("phases") or []
        if p.get("reached")
    ]
    if per_phase:
        tables.append(
            Table(
                [
                    "phase",
                    "kind",
                    "request p99",
                    "request max",
                    "upstream p99",
                    "upstream max",
                    "delivery p99",
                    "delivery max",
                    "nemesis latency (configured max)",
                ],
                per_phase,
                "Per phase.",
            )
        )
    return Block("lab_latency", "Lab latency", lines, tables)


def phases_block(doc: Mapping[str, Any]) -> Block | None:
    rows = doc.get("phases")
    if not isinstance(rows, list) or not rows:
        return None
    columns = [
        "phase",
        "kind",
        "T+ (s)",
        "users",
        "events/s",
        "calls/s",
        "call errors",
        "resume p50",
        "resume p99",
        "reconnects/s peak",
        "4xx",
        "5xx",
        "faults fired",
        "lab CPU peak (cores)",
        "lab saturated",
    ]
    out = []
    for p in rows:
        span = f"{p['start_s']:.0f}–{p['end_s']:.0f}"
        if not p.get("reached"):
            row = [p["name"], p["kind"], f"{p['start_s']:.0f}–", _num(p.get("users")), "not reached"]
            out.append(row + ["—"] * (len(columns) - len(row)))
            continue
        if not p.get("complete", True):
            span += " (cut short)"
        out.append(
            [
                p["name"],
                p["kind"],
                span,
                _num(p.get("users")),
                _num(p.get("events_per_s"), "{:.1f}"),
                _num(p.get("calls_per_s"), "{:.1f}"),
                _pct(p.get("call_error_rate")),
                _num(p.get("resume_p50_s"), "{:.3f} s"),
                _p99(p),
                _num(p.get("reconnect_qps_peak")),
                _num(p.get("status_4xx")),
                _num(p.get("status_5xx")),
                _faults(p.get("faults")),
                _top_cpu(p.get("lab_cpu_peak")),
                ", ".join(p.get("lab_saturated") or []) or "—",
            ]
        )
    lines = []
    if len(rows) == 1 and rows[0].get("kind") == "run":
        lines.append("The run has no [[phases]]: it is one implicit phase.")
    ll = doc.get("lab_latency")
    if isinstance(ll, Mapping) and ll.get("warnings"):
        lines.append("Warning: the resume latencies include the lab's own delay (see *Lab latency*).")
    return Block("phases", "Phases", lines, [Table(columns, out)])


def capacity_block(doc: Mapping[str, Any]) -> Block | None:
    cap = doc.get("capacity")
    if not isinstance(cap, Mapping):
        return None
    lines = [str(cap.get("text", ""))]
    if cap.get("bent_first"):
        lines.append(
            f"Bent first: {', '.join(cap['bent_first'])} at step {cap.get('bent_first_step')} "
            f"({'; '.join(f'{k}: {v}' for k, v in (cap.get('bend_rules') or {}).items())})."
        )
    lab = cap.get("limited_by_lab")
    if isinstance(lab, Mapping) and lab.get("workers_needed") is not None:
        lines.append(f"Workers needed: {lab['workers_needed']} ({lab.get('basis', '')}).")
    columns = [
        "step",
        "users",
        "events/s",
        "events/client/s",
        "resume p99",
        "call errors",
        "reconnects/s peak",
        "lab saturated",
        "holds",
        "broke",
    ]
    rows = [
        [
            s["name"],
            _num(s.get("users")),
            _num(s.get("events_per_s"), "{:.1f}"),
            _num(s.get("events_per_client_s"), "{:.3f}"),
            _p99(s),
            _pct(s.get("call_error_rate")),
            _num(s.get("reconnect_qps_peak")),
            ", ".join(s.get("lab_saturated") or []) or "—",
            "yes" if s.get("holds") else "no",
            ", ".join(s.get("missed") or []) or "—",
        ]
        for s in cap.get("steps") or []
    ]
    return Block(
        "capacity", f"Capacity: knee at {_num(cap.get('knee_users'))} clients", lines, [Table(columns, rows)]
    )


def rollout_block(doc: Mapping[str, Any]) -> Block | None:
    ro = doc.get("rollout")
    if not isinstance(ro, Mapping):
        return None
    lines = [f"Could not be judged: {ro['error']}"] if ro.get("error") else []
    columns = [
        "phase",
        "resumable fraction",
        "rollback",
        "knob at T+",
        "sessions created",
        "resumable",
        "share (expected ± band)",
        "events compared (shadow)",
        "crossed (shadow)",
        "gate-1 violations",
    ]
    rows = []
    for p in ro.get("phases") or []:
        share = p.get("share")
        band = (
            f"{share:.1%} ({p['expected']:.1%} ± {p['band']:.1%})"
            if share is not None and p.get("expected") is not None
            else "—"
        )
        rows.append(
            [
                p["phase"],
                _num(p.get("resumable_fraction")),
                "yes" if p.get("rollback") else "no",
                _num(p.get("knob_applied_s"), "{:.1f} s"),
                _num(p.get("sessions_created")),
                _num(p.get("resumable_sessions")),
                band,
                _num(p.get("shadow_events")),
                _num(p.get("shadow_crossed")),
                _num(p.get("gate1_violations")),
            ]
        )
    checks = []
    for c in ro.get("checks") or []:
        evidence = "; ".join(
            f"{e['name']}: {e['observed']} (need {e['required']}){'' if e['ok'] else ' — NOT MET'}"
            for e in c["evidence"]
        )
        measured = ", ".join(f"{k} {v}" for k, v in (c.get("measured") or {}).items())
        checks.append(
            [
                c["check"],
                str(c["violations"]),
                evidence or "—",
                measured or "—",
                " | ".join(c["witnesses"]) or "—",
            ]
        )
    tables = [
        Table(columns, rows, "Per phase: the knobs in force and what the ledgers show."),
        Table(
            ["check", "violations", "evidence", "measured", "first witnesses"],
            checks,
            "The named checks (gate 8).",
        ),
    ]
    return Block("rollout", "Rollout", lines, tables)


def processes_block(doc: Mapping[str, Any]) -> Block | None:
    pr = doc.get("processes")
    if not isinstance(pr, Mapping):
        return None
    if pr.get("status") != "ok":
        why = pr.get("error") or f"{pr.get('source')} is {pr.get('status')}"
        return Block("processes", "Lab processes", [f"No process samples: {why}."])
    lines = [
        f"Sampled every {pr.get('interval_s')} s on a box of {pr.get('cpus')} cores; "
        "CPU in cores used (1.0 = one core), memory as resident set size."
    ]
    box = pr.get("box")
    if isinstance(box, Mapping):
        load = f", load average up to {box['load1_max']:g}" if box.get("load1_max") is not None else ""
        who = "every program on it" if box.get("source") == "host" else "the run's processes"
        lines.append(
            f"The box ({who}): {box['cpu_mean']:.2f} cores busy on average, p95 {box['cpu_p95']:.2f}, "
            f"max {box['cpu_max']:.2f} of {pr.get('cpus')}{load}."
        )
    for s in pr.get("saturated") or []:
        if s.get("reason") == "fds":
            lines.append(
                f"Out of file descriptors: {s['part']} ({s['fds']:,} open of its limit of {s['fd_limit']:,})."
            )
            continue
        what = "of every core" if s["part"] == "box" else "of a core"
        lines.append(
            f"Saturated over the run: {s['part']} (>= 90 % {what} in {s['share']:.0%} of its samples)."
        )
    for w in pr.get("locust_cpu_warnings") or []:
        lines.append(f"Locust warned about CPU in {w['part']} ({w['count']}×): {w['first']}")
    columns = [
        "process",
        "role",
        "samples",
        "CPU mean",
        "CPU p95",
        "CPU max",
        "saturated",
        "RSS max",
        "fds max (of limit)",
        "threads max",
    ]
    rows = [
        [
            p["part"],
            p["role"],
            _num(p.get("samples")),
            _num(p.get("cpu_mean"), "{:.2f}"),
            _num(p.get("cpu_p95"), "{:.2f}"),
            _num(p.get("cpu_max"), "{:.2f}"),
            _pct(p.get("saturated_share")),
            "—" if p.get("rss_max") is None else f"{p['rss_max'] / MIB:.0f} MiB",
            _num(p.get("fds_max")) + (f" of {p['fd_limit']}" if p.get("fd_limit") else ""),
            _num(p.get("threads_max")),
        ]
        for p in pr.get("parts") or []
    ]
    return Block("processes", "Lab processes", lines, [Table(columns, rows)])


def blocks(doc: Mapping[str, Any]) -> list[Block]:
    # Imported here: that module builds on this one's Block, Table and cell helpers.
    from lab.report.unanswered_block import unanswered_block

    made = (
        unanswered_block(doc),
        lab_latency_block(doc),
        phases_block(doc),
        capacity_block(doc),
        rollout_block(doc),
        processes_block(doc),
    )
    return [b for b in made if b is not None]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(bs: Sequence[Block]) -> list[str]:
    out: list[str] = []
    for b in bs:
        out += [f"## {b.title}", ""]
        out += [f"{line}  " for line in b.lines if line]
        if b.lines:
            out.append("")
        for t in b.tables:
            if t.caption:
                out += [t.caption, ""]
            out.append("| " + " | ".join(_cell(c) for c in t.columns) + " |")
            out.append("|" + " --- |" * len(t.columns))
            out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in t.rows]
            out.append("")
    return out
