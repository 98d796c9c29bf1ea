"""The report's sections beside the gates — unanswered requests by hop, what each fault
did, the lab's own latency, phases, capacity, rollout, the lab's own processes — as plain
blocks of lines and tables, built from the report.json document alone, so report.md and
report.html show exactly the same thing.

    blocks(doc) -> [Block]    each: id, title, lines, tables (caption, columns, rows)

The blocks, their tables and cell formatters, and their markdown for report.md are
`lab.report.table`'s; the unanswered requests' block is `lab.report.unanswered_block`, the
faults' outcomes' `lab.report.fault_outcomes_block`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.report.fault_outcomes_block import fault_outcomes_block
from lab.report.table import NONE, Block, Column, Table, num, pct, secs, table
from lab.report.unanswered_block import unanswered_block

MIB = 1024 * 1024


def _p99(row: Mapping[str, Any]) -> str:
    if row.get("resume_p99_unbounded"):
        return "never"
    return num(row.get("resume_p99_s"), "{:.3f} s")


def _top_cpu(peaks: Mapping[str, Any] | None, n: int = 3) -> str:
    if not peaks:
        return NONE
    ordered = sorted(peaks.items(), key=lambda kv: -float(kv[1] or 0))
    return ", ".join(f"{k} {float(v):.2f}" for k, v in ordered[:n])


def _faults(faults: Mapping[str, Any] | None) -> str:
    if not faults:
        return NONE
    return ", ".join(f"{k} {v}" for k, v in faults.items())


def _hop_cells(h: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(h, Mapping):
        return [NONE] * 4
    return [num(h.get("count")), secs(h.get("p50_s")), secs(h.get("p99_s")), secs(h.get("max_s"))]


def lab_latency_block(doc: Mapping[str, Any]) -> Block | None:
    ll = doc.get("lab_latency")
    if not isinstance(ll, Mapping):
        return None
    hops = ll.get("hops") or []
    tables = [
        Table(
            ["hop", "count", "p50", "p99", "max", "p99 outside latency toxics", "notes"],
            [_lab_hop_row(h) for h in hops],
            "Per hop, over the run.",
        ),
    ]
    workers = [
        [h["hop"], w["part"], *_hop_cells(w)]
        for h in hops
        if h["hop"] != "nemesis" and h.get("measured")
        for w in h.get("by_worker") or []
    ]
    if len({w[1] for w in workers}) > 1:  # one worker's rows would repeat the hop's
        tables.append(Table(["hop", "worker", "count", "p50", "p99", "max"], workers, "Per Locust worker."))
    reached = [p for p in ll.get("phases") or [] if p.get("reached")]
    if reached:
        tables.append(table(_LAB_PHASE_COLUMNS, reached, "Per phase."))
    return Block("lab_latency", "Lab latency", _lab_latency_lines(ll), tables)


def _lab_latency_lines(ll: Mapping[str, Any]) -> list[str]:
    """The warnings, what raises one, and the resume latency net of the lab's own delay."""
    lines = [f"Warning: {w['text']}." for w in ll.get("warnings") or []]
    lines.append(
        f"A warning is raised when a hop's p99 is over {ll['warn_share']:.0%} of the resume budget "
        f"({secs(ll.get('warn_above_s'))}); CPU and memory of each lab process: *Lab processes*."
    )
    resume = ll.get("resume")
    if isinstance(resume, Mapping) and resume.get("recoveries"):
        measured = "never" if resume.get("p99_unbounded") else secs(resume.get("p99_s"))
        net = "never" if resume.get("net_p99_unbounded") else secs(resume.get("net_p99_s"))
        lines.append(
            f"Resume latency p99 as measured {measured}; net of the lab's delivery delay {net} "
            f"({resume['joined']} of {resume['recoveries']} recoveries joined to the event that ended them)."
        )
    return lines


def _lab_hop_row(h: Mapping[str, Any]) -> list[str]:
    """One hop's row: the nemesis' configured delay, a hop not measured, or a measured one."""
    if h["hop"] == "nemesis":
        return _nemesis_row(h)
    if not h.get("measured"):
        return [h["title"], NONE, NONE, NONE, NONE, NONE, f"not measured: {h.get('why_not')}"]
    outside = h.get("outside_toxics")
    notes = [f"{h['unmatched']} not joined"] if h.get("unmatched") else []
    if h.get("negative"):
        notes.append(f"{h['negative']} negative (two processes' clocks read at one moment)")
    return [
        h["title"],
        *_hop_cells(h),
        secs(outside.get("p99_s")) if isinstance(outside, Mapping) else NONE,
        "; ".join(notes) or NONE,
    ]


def _nemesis_row(h: Mapping[str, Any]) -> list[str]:
    """The nemesis is not measured: its row lists the latency toxics' windows."""
    windows = h.get("windows") or []
    detail = "; ".join(
        f"{num(w.get('latency_ms'))} ± {num(w.get('jitter_ms'))} ms on {w.get('proxy')} "
        f"({w.get('stream')}) T+{num(w.get('start_s'), '{:.0f}')}–{num(w.get('end_s'), '{:.0f}')} s"
        for w in windows
    )
    return [
        h["title"],
        str(len(windows)),
        NONE,
        NONE,
        secs(h.get("configured_max_s")),
        NONE,
        f"{h.get('why_not')}{': ' + detail if detail else ''}",
    ]


type _Phase = Mapping[str, Any]
"""A phase of report.json `lab_latency.phases`."""


def _p99_max(hop: str) -> tuple[Column[_Phase], Column[_Phase]]:
    """A phase's p99 and max of one hop."""
    return (
        Column[_Phase](f"{hop} p99", lambda p: _hop_cells(p.get(hop))[2]),
        Column[_Phase](f"{hop} max", lambda p: _hop_cells(p.get(hop))[3]),
    )


_LAB_PHASE_COLUMNS: tuple[Column[_Phase], ...] = (
    Column[_Phase]("phase", lambda p: p["name"]),
    Column[_Phase]("kind", lambda p: p["kind"]),
    *_p99_max("request"),
    *_p99_max("upstream"),
    *_p99_max("delivery"),
    Column[_Phase]("nemesis latency (configured max)", lambda p: secs(p.get("nemesis_latency_max_s"))),
)


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
            row = [p["name"], p["kind"], f"{p['start_s']:.0f}–", num(p.get("users")), "not reached"]
            out.append(row + [NONE] * (len(columns) - len(row)))
            continue
        if not p.get("complete", True):
            span += " (cut short)"
        out.append(
            [
                p["name"],
                p["kind"],
                span,
                num(p.get("users")),
                num(p.get("events_per_s"), "{:.1f}"),
                num(p.get("calls_per_s"), "{:.1f}"),
                pct(p.get("call_error_rate")),
                num(p.get("resume_p50_s"), "{:.3f} s"),
                _p99(p),
                num(p.get("reconnect_qps_peak")),
                num(p.get("status_4xx")),
                num(p.get("status_5xx")),
                _faults(p.get("faults")),
                _top_cpu(p.get("lab_cpu_peak")),
                ", ".join(p.get("lab_saturated") or []) or NONE,
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
            num(s.get("users")),
            num(s.get("events_per_s"), "{:.1f}"),
            num(s.get("events_per_client_s"), "{:.3f}"),
            _p99(s),
            pct(s.get("call_error_rate")),
            num(s.get("reconnect_qps_peak")),
            ", ".join(s.get("lab_saturated") or []) or NONE,
            "yes" if s.get("holds") else "no",
            ", ".join(s.get("missed") or []) or NONE,
        ]
        for s in cap.get("steps") or []
    ]
    return Block(
        "capacity", f"Capacity: knee at {num(cap.get('knee_users'))} clients", lines, [Table(columns, rows)]
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
            else NONE
        )
        rows.append(
            [
                p["phase"],
                num(p.get("resumable_fraction")),
                "yes" if p.get("rollback") else "no",
                num(p.get("knob_applied_s"), "{:.1f} s"),
                num(p.get("sessions_created")),
                num(p.get("resumable_sessions")),
                band,
                num(p.get("shadow_events")),
                num(p.get("shadow_crossed")),
                num(p.get("gate1_violations")),
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
                evidence or NONE,
                measured or NONE,
                " | ".join(c["witnesses"]) or NONE,
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
            num(p.get("samples")),
            num(p.get("cpu_mean"), "{:.2f}"),
            num(p.get("cpu_p95"), "{:.2f}"),
            num(p.get("cpu_max"), "{:.2f}"),
            pct(p.get("saturated_share")),
            NONE if p.get("rss_max") is None else f"{p['rss_max'] / MIB:.0f} MiB",
            num(p.get("fds_max")) + (f" of {p['fd_limit']}" if p.get("fd_limit") else ""),
            num(p.get("threads_max")),
        ]
        for p in pr.get("parts") or []
    ]
    return Block("processes", "Lab processes", lines, [Table(columns, rows)])


def _by_tool(counts: Mapping[str, Any] | None) -> str:
    if not counts:
        return ""
    return " (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")"


def _restart_row(r: Mapping[str, Any]) -> list[str]:
    if not r.get("applicable", True):
        return [
            num(r.get("n")),
            "not applicable",
            NONE,
            NONE,
            NONE,
            NONE,
            NONE,
            NONE,
            str(r.get("why") or NONE),
        ]
    ses = r.get("sessions") if isinstance(r.get("sessions"), Mapping) else {}
    assert isinstance(ses, Mapping)
    sessions = (
        f"{ses.get('kept', 0)} kept, {ses.get('lost', 0)} lost ({ses.get('rehandshaken', 0)} re-handshaken)"
        if ses
        else NONE
    )
    how = f"{r.get('how')}, {r.get('store')} store" if r.get("store") else str(r.get("how"))
    notes = [str(x) for x in (r.get("error"), r.get("note")) if x]
    return [
        num(r.get("n")),
        how,
        num(r.get("at_s"), "{:.1f} s"),
        secs(r.get("down_wire_s")),
        f"{num(r.get('calls_in_flight'))}{_by_tool(r.get('in_flight_by_tool'))}",
        f"{num(r.get('never_answered'))}{_by_tool(r.get('never_answered_by_tool'))}",
        num(r.get("run_twice")),
        sessions,
        "; ".join(notes) or secs(r.get("throughput_back_s")),
    ]


def restarts_block(doc: Mapping[str, Any]) -> Block | None:
    rs = doc.get("restarts")
    if not isinstance(rs, Mapping):
        return None
    rows = [_restart_row(r) for r in rs.get("restarts") or [] if isinstance(r, Mapping)]
    lines = [
        f"{rs.get('done')} of {rs.get('planned')} planned restart(s) of the target. Seen from the wire: "
        "down from the first request left unanswered (or stream dropped) to the next answer; calls in "
        "flight whose answer had not passed, and those never answered afterwards (not on a resumption "
        "of their stream, nor a re-send with their key); writes answered with two different results; "
        "the sessions in use by their first answer after (kept: 2xx, lost: 404)."
    ]
    lines += [str(n) for n in rs.get("notes") or []]
    columns = [
        "#",
        "how",
        "at T+",
        "down (wire)",
        "calls in flight",
        "never answered",
        "run twice",
        "sessions",
        "throughput back after",
    ]
    return Block("restarts", "Restarts of the target", lines, [Table(columns, rows, "Per restart.")])


def _outcomes(row: Mapping[str, Any]) -> str:
    got = row.get("outcomes") or {}
    return ", ".join(f"{k} {v}" for k, v in sorted(got.items(), key=lambda kv: -kv[1])) or NONE


ERA_COLUMNS: tuple[Column[Mapping[str, Any]], ...] = (
    Column("era", lambda r: "modern (2026-07-28)" if r["era"] == "modern" else "handshake"),
    Column("clients", lambda r: num(r.get("clients"))),
    Column("calls", lambda r: num(r.get("calls"))),
    Column("outcomes", _outcomes),
    Column("writes sent again", lambda r: num(r.get("writes_sent_again"))),
    Column("messages accepted", lambda r: num(r.get("accepted"))),
    Column("refused", lambda r: num(r.get("rejected"))),
    Column("requests", lambda r: num(r.get("requests"))),
    Column("4xx", lambda r: num(r.get("status_4xx"))),
    Column("5xx", lambda r: num(r.get("status_5xx"))),
    Column("reconnects", lambda r: num(r.get("reconnects"))),
    Column("recoveries (got back)", lambda r: f"{num(r.get('recoveries'))} ({num(r.get('recovered'))})"),
    Column("recovery p50", lambda r: secs(r.get("recovery_p50_s"))),
    Column("recovery p99", lambda r: secs(r.get("recovery_p99_s"))),
)


VERDICT_WORDS = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive", "not_applicable": "N/A"}


def _era_verdict(era: str) -> Column[Mapping[str, Any]]:
    def cell(r: Mapping[str, Any]) -> str:
        v = (r.get("by_era") or {}).get(era)
        if not isinstance(v, Mapping):
            return "not of this era"
        word = VERDICT_WORDS.get(str(v.get("verdict")), str(v.get("verdict")))
        counts = [f"{v[k]} {k}" for k in ("server", "client") if v.get(k)]
        return f"{word} ({', '.join(counts)})" if counts else word

    return Column("modern (2026-07-28)" if era == "modern" else "handshake", cell)


ERA_GATE_COLUMNS: tuple[Column[Mapping[str, Any]], ...] = (
    Column("rule", lambda r: f"{r.get('number')} {r.get('title')}"),
    _era_verdict("handshake"),
    _era_verdict("modern"),
)


def eras_block(doc: Mapping[str, Any]) -> Block | None:
    es = doc.get("eras")
    if not isinstance(es, Mapping):
        return None
    lines = [
        "The run tested both protocol eras at once against one server (docs/eras.md): each client spoke one "
        "(the era it established its session in). A recovery is a resumption in the handshake era, a "
        "re-issue of the call in the modern era; got back: its call answered, or its stream open again."
    ]
    lines += [str(n) for n in es.get("notes") or []]
    rows = [r for r in es.get("eras") or [] if isinstance(r, Mapping)]
    tables = [table(ERA_COLUMNS, rows, "Per era.")]
    gates = [g for g in es.get("gates") or [] if isinstance(g, Mapping)]
    if gates:
        tables.append(
            table(
                ERA_GATE_COLUMNS,
                gates,
                "Each rule judged again on each era's part of the run alone (its clients, their flows and "
                "sessions): figures, not the run's verdict, which judges every client at once. Violations "
                "by whom in brackets; an era's part may be too thin for a rule's evidence minima.",
            )
        )
    return Block("eras", "By protocol era", lines, tables)


def blocks(doc: Mapping[str, Any]) -> list[Block]:
    made = (
        unanswered_block(doc),
        fault_outcomes_block(doc),
        lab_latency_block(doc),
        phases_block(doc),
        capacity_block(doc),
        rollout_block(doc),
        restarts_block(doc),
        eras_block(doc),
        processes_block(doc),
    )
    return [b for b in made if b is not None]
