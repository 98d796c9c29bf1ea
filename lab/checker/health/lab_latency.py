"""The lab's own latency, hop by hop: how long the lab itself takes to carry a request to
the target and an event back to the client, measured from the ledgers of every run.

A resume latency (gate 5) runs from a loss to the next event the client accepts: the
part of it spent inside the lab (a Locust worker whose loop was busy, the nemesis,
mitmdump) is not the target's. This module measures each hop the ledgers let it see:

    request   the client sends a request -> the proxy sees it: the client's
              `http_exchanges.started_at` to the tap's `flow` `t_request` of the same
              connection (`x-lab-conn` = client_id:conn_id). Carries the worker's loop
              and connection pool, the nemesis, mitmdump's accept.
    upstream  the server sends an event -> the proxy sees it: the server ledger's
              `events_sent.sent_at` (first sends, not replays) to the tap's `sent` `t` of
              that event (session + event ID; the first time the tap saw it). Reference
              server only. Carries the server's write and mitmdump's read: a mitmdump
              whose event loop lags behind shows here first.
    delivery  the proxy forwards an event -> the client accepts it: the tap's
              `forwarded` `t` to the inbox's `accepted_at` of that event, on the
              connection that delivered it (the receipt's client_id + conn_id -> the tap
              flow; then the event ID and digest; the first forward of a repeated one).
              Carries the nemesis and the worker: its loop, SSE decoding, the core.
    nemesis   the delay the nemesis adds on purpose: its `latency` toxics (nemesis.jsonl,
              configured latency ± jitter per window). Not measured per chunk: the log
              holds each toxic's configuration, not each chunk's delay.

Per hop: count, p50, p99 and max (nearest rank, like gate 5) for the run, per phase when
the scenario has [[phases]], per Locust worker (by its ledger file), and, when latency
toxics were in place, outside their windows (the lab's own delay, not the fault's).

**The warning.** When a measured hop's p99 (outside latency toxics) is over
`WARN_SHARE` of the resume budget (`budgets.resume_p99_s`), the lab distorts what gate 5
measures: the section and gate 5 carry a plain warning naming the hop and the process
most likely responsible (`suspect`). Gate 5's verdict is not changed by it. The section
also gives gate 5's latencies net of the lab's delivery delay: each recovery minus the
delivery hop of the event that ended it (its receipt: same client, stream and
`accepted_at` = `recovered_at`), where that event can be joined.

The lab's CPU and memory per process are report.json `processes` (`lab.checker.health.processes`);
this section refers to them, it does not repeat them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.health import processes
from lab.checker.health.lab_hops import delivery_delays, request_delays, upstream_delays
from lab.checker.health.lab_limits import JUDGED_ON_TARGET, server_violations
from lab.checker.inputs.load import MissingInput
from lab.checker.inputs.phase_specs import IMPLICIT, phase_specs
from lab.checker.model import Evidence, GateResult, JsonValue, Verdict, made_inconclusive
from lab.checker.truth.liveness import never_finished_latencies
from lab.checker.truth.recoveries import nearest_rank, run_latencies

WARN_SHARE = 0.10
"""A hop whose p99 is over this share of the resume budget distorts gate 5."""
MIN_PER_WORKER = 20
"""Samples a worker needs before its own p99 is compared with the others'."""
WORKER_OUTLIER = 2.0
"""A worker whose p99 is this many times the other workers' highest is the suspect."""
NOTE_PREFIX = "lab latency:"
DOMINATES_SHARE = 0.5
"""Gate 5 failing on latency alone while the lab's own p99 on the path is this share of the
budget or more is inconclusive: the latency measured is mostly the lab's."""

HOPS: dict[str, str] = {
    "request": "client send → proxy sees the request",
    "upstream": "server sends an event → proxy sees it",
    "delivery": "proxy forwards an event → client accepts it",
    "nemesis": "nemesis's added delay (latency toxics)",
}
PATH_PARTS: dict[str, tuple[str, ...]] = {
    "request": ("worker-", "nemesis", "mitmproxy"),
    "upstream": ("mitmproxy",),
    "delivery": ("worker-", "nemesis", "mitmproxy"),
}
"""The lab processes on each hop's path (a part's name starts so; the server is the target)."""
MEASURED = ("request", "upstream", "delivery")


# ---------------------------------------------------------------------------- the hops


def latency_windows(ctx: Context) -> list[dict[str, Any]]:
    """The nemesis's latency toxics: proxy, toxic, stream, latency_ms, jitter_ms,
    toxicity, start, end (epoch s; an unclosed window ends at the run's stop)."""
    nem = ctx.data.nemesis
    if nem is None or not len(nem) or "kind" not in nem.columns:
        return []
    rows = nem[nem["type"].isin(["toxic_added", "toxic_removed"])].sort_values("t", kind="stable")
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for r in rows.to_dict("records"):
        key = (str(r.get("proxy")), str(r.get("toxic")))
        if r["type"] == "toxic_added":
            if r.get("kind") != "latency":
                continue
            given = r.get("attributes")
            attrs: dict[str, Any] = given if isinstance(given, dict) else {}
            open_[key] = {
                "proxy": key[0],
                "toxic": key[1],
                "stream": r.get("stream"),
                "latency_ms": _num(attrs.get("latency")),
                "jitter_ms": _num(attrs.get("jitter")),
                "toxicity": _num(r.get("toxicity")),
                "start": float(r["t"]),
                "end": None,
            }
        elif key in open_:
            w = open_.pop(key)
            w["end"] = float(r["t"])
            out.append(w)
    stop = ctx.stopped_at
    for w in open_.values():
        w["end"] = stop
        out.append(w)
    return sorted(out, key=lambda w: w["start"])


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _outside(t: np.ndarray, windows: list[dict[str, Any]]) -> np.ndarray:
    mask = np.ones(len(t), dtype=bool)
    for w in windows:
        end = w["end"] if w["end"] is not None else math.inf
        mask &= ~((t >= w["start"]) & (t < end))
    return mask


# ---------------------------------------------------------------------------- figures


def stats(values: np.ndarray) -> dict[str, JsonValue]:
    """count, p50_s, p99_s, max_s (nearest rank; null without values)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {
        "count": len(v),
        "p50_s": _r(nearest_rank(v, 0.5)),
        "p99_s": _r(nearest_rank(v, 0.99)),
        "max_s": _r(float(v.max())),
    }


def _r(value: float) -> float:
    return round(value, 4)


def _by_worker(frame: pd.DataFrame) -> list[dict[str, JsonValue]]:
    if "part" not in frame.columns or frame["part"].isna().all():
        return []
    out: list[dict[str, JsonValue]] = []
    for part, g in frame.groupby("part", sort=True):
        out.append({"part": str(part), **stats(g["delay"].to_numpy(dtype="float64"))})
    return out


def _hop(name: str, frame: pd.DataFrame, windows: list[dict[str, Any]]) -> dict[str, JsonValue]:
    delays = frame["delay"].to_numpy(dtype="float64")
    t = frame["t"].to_numpy(dtype="float64")
    clean = _outside(t, windows)
    out: dict[str, JsonValue] = {
        "hop": name,
        "title": HOPS[name],
        "measured": True,
        "why_not": None,
        **stats(delays),
        "unmatched": int(frame.attrs.get("unmatched", 0)),
        "negative": int((delays < 0).sum()),
        "outside_toxics": stats(delays[clean]) if windows else None,
        "by_worker": list(_by_worker(frame)),
    }
    return out


def _not_measured(name: str, why: str) -> dict[str, JsonValue]:
    return {"hop": name, "title": HOPS[name], "measured": False, "why_not": why, "count": 0}


def _nemesis_hop(ctx: Context, windows: list[dict[str, Any]]) -> dict[str, JsonValue]:
    origin = ctx.origin or 0.0
    shown: list[JsonValue] = [
        {
            "proxy": w["proxy"],
            "stream": w["stream"],
            "latency_ms": w["latency_ms"],
            "jitter_ms": w["jitter_ms"],
            "toxicity": w["toxicity"],
            "start_s": _r(w["start"] - origin),
            "end_s": None if w["end"] is None else _r(w["end"] - origin),
        }
        for w in windows
    ]
    added = [(w["latency_ms"] or 0.0) + (w["jitter_ms"] or 0.0) for w in windows]
    why = (
        "configured, not measured: the nemesis log holds each latency toxic's setting, not each chunk's delay"
        if windows
        else "no latency toxic was in place"
        if ctx.data.nemesis is not None
        else "no nemesis log"
    )
    return {
        "hop": "nemesis",
        "title": HOPS["nemesis"],
        "measured": False,
        "why_not": why,
        "count": len(windows),
        "windows": shown,
        "configured_max_s": _r(max(added) / 1000.0) if added else None,
    }


def _frames(ctx: Context) -> dict[str, pd.DataFrame | str]:
    """hop -> its delays, or why it could not be measured."""
    out: dict[str, pd.DataFrame | str] = {}
    makers = (("request", request_delays), ("upstream", upstream_delays), ("delivery", delivery_delays))
    for name, make in makers:
        try:
            out[name] = make(ctx)
        except MissingInput as e:
            out[name] = str(e)
    return out


# ---------------------------------------------------------------------------- suspect


def suspect(ctx: Context, hop: dict[str, Any]) -> tuple[str, str]:
    """(process, basis): the lab process most likely behind a slow hop. A worker whose own
    p99 stands out from the other workers' is named by that; else the busiest lab process
    on the hop's path (`PATH_PARTS`) by CPU p95 (`processes`)."""
    path = PATH_PARTS[str(hop["hop"])]
    workers = [w for w in hop.get("by_worker") or [] if w.get("count", 0) >= MIN_PER_WORKER]
    if len(workers) >= 2:
        ranked = sorted(workers, key=lambda w: -(w["p99_s"] or 0.0))
        worst, rest = ranked[0], ranked[1:]
        others = max(w["p99_s"] or 0.0 for w in rest)
        if (worst["p99_s"] or 0.0) >= WORKER_OUTLIER * max(others, 1e-3):
            return str(worst["part"]), (
                f"its clients' p99 on this hop is {worst['p99_s']:.3f} s, the other workers' at most {others:.3f} s"
            )
    s = processes.samples(ctx)
    if s.present:
        rows: list[dict[str, Any]] = [
            p
            for p in processes.summary(s)
            if p["role"] == "lab" and str(p["part"]).startswith(path) and p.get("cpu_p95") is not None
        ]
        if rows:
            top = max(rows, key=lambda p: float(p["cpu_p95"] or 0.0))
            return str(top["part"]), (
                f"the busiest process on the hop's path by CPU: p95 {top['cpu_p95']:.2f} cores, "
                f"mean {top['cpu_mean']:.2f} (see `processes`)"
            )
    if path == ("mitmproxy",):
        return "mitmproxy", "the only lab process on this hop"
    return "a Locust worker, the nemesis or mitmdump", "no process samples to tell them apart"


# ---------------------------------------------------------------------------- resume


def _resume(ctx: Context, frames: dict[str, pd.DataFrame | str]) -> dict[str, JsonValue] | None:
    """Gate 5's latencies as measured and net of the delivery hop of the event that
    ended each recovery (where it joins); None without a recoveries table."""
    try:
        lat = run_latencies(ctx)
    except MissingInput:
        return None
    lat = lat[~lat["censored"]]
    measured = lat["latency"].to_numpy(dtype="float64")
    net = measured.copy()
    joined = 0
    delivery = frames.get("delivery")
    if isinstance(delivery, pd.DataFrame) and len(delivery) and len(lat):
        # The receipt that ended a recovery was accepted at the very `now` the recovery
        # was marked recovered (the core writes both with one clock reading).
        receipts = delivery[["client_id", "stream_key", "accepted_at", "delay"]].drop_duplicates(
            ["client_id", "stream_key", "accepted_at"]
        )
        ended = pd.DataFrame(
            {
                "row": np.arange(len(lat)),
                "client_id": lat["client_id"].astype("object").to_numpy(),
                "stream_key": lat["stream_key"].astype("object").to_numpy(),
                "accepted_at": pd.to_numeric(lat["recovered_at"], errors="coerce")
                .astype("float64")
                .to_numpy(),
            }
        )
        ended = ended[ended["accepted_at"].notna()]
        hits = ended.merge(receipts, on=["client_id", "stream_key", "accepted_at"], how="inner")
        rows = hits["row"].to_numpy(dtype="int64")
        joined = len(rows)
        net[rows] = measured[rows] - np.maximum(hits["delay"].to_numpy(dtype="float64"), 0.0)
    stuck = len(never_finished_latencies(ctx)) if ctx.data.tap is not None else 0
    if stuck:
        measured = np.concatenate([measured, np.full(stuck, math.inf)])
        net = np.concatenate([net, np.full(stuck, math.inf)])
    p99, net_p99 = nearest_rank(measured, 0.99), nearest_rank(net, 0.99)
    return {
        "recoveries": len(measured),
        "joined": joined,
        "p50_s": _finite(nearest_rank(measured, 0.5)),
        "p99_s": _finite(p99),
        "p99_unbounded": bool(math.isinf(p99)),
        "net_p50_s": _finite(nearest_rank(net, 0.5)),
        "net_p99_s": _finite(net_p99),
        "net_p99_unbounded": bool(math.isinf(net_p99)),
    }


def _finite(value: float) -> float | None:
    return _r(value) if math.isfinite(value) else None


# ---------------------------------------------------------------------------- section


def section(ctx: Context) -> dict[str, JsonValue]:
    """report.json `lab_latency`."""
    return ctx.cached("lab_latency_section", lambda: _section(ctx))


def _section(ctx: Context) -> dict[str, JsonValue]:
    budget = ctx.budgets.resume_p99_s
    limit = WARN_SHARE * budget
    windows = latency_windows(ctx)
    frames = _frames(ctx)
    hops: list[dict[str, Any]] = []
    for name in MEASURED:
        got = frames[name]
        hops.append(_hop(name, got, windows) if isinstance(got, pd.DataFrame) else _not_measured(name, got))
    hops.append(_nemesis_hop(ctx, windows))
    warned: list[dict[str, JsonValue]] = []
    for h in hops:
        if not h["measured"]:
            continue
        judged = judged_figures(h)
        p99 = judged.get("p99_s")
        if p99 is None or p99 <= limit:
            continue
        process, basis = suspect(ctx, h)
        where = " outside latency toxics" if h.get("outside_toxics") else ""
        text = (
            f"the lab's own latency on one step of the chain, {h['title']} (hop '{h['hop']}'), has p99 "
            f"{p99:.3f} s{where}, "
            f"{p99 / budget:.0%} of the resume budget ({budget:g} s; warning above {WARN_SHARE:.0%}): "
            f"resume latencies measured in this run include it; most likely {process} ({basis})"
        )
        warned.append({"hop": h["hop"], "p99_s": p99, "process": process, "basis": basis, "text": text})
    per_phase: list[JsonValue] = []
    specs = phase_specs(ctx.data.run)
    if not (len(specs) == 1 and specs[0].kind == IMPLICIT):
        origin = ctx.origin or 0.0
        for p in specs:
            row: dict[str, JsonValue] = {
                "name": p.name,
                "kind": p.kind,
                "start_s": _r(p.start - origin),
                "end_s": _r(p.end - origin),
                "reached": p.reached,
            }
            for name in MEASURED:
                got = frames[name]
                if isinstance(got, pd.DataFrame) and p.reached:
                    t = got["t"].to_numpy(dtype="float64")
                    inside = (t >= p.start) & (t < p.end)
                    row[name] = stats(got["delay"].to_numpy(dtype="float64")[inside])
                else:
                    row[name] = None
            in_phase = [
                (w["latency_ms"] or 0.0) + (w["jitter_ms"] or 0.0)
                for w in windows
                if w["start"] < p.end and (w["end"] is None or w["end"] > p.start)
            ]
            row["nemesis_latency_max_s"] = _r(max(in_phase) / 1000.0) if in_phase else None
            per_phase.append(row)
    return {
        "budget_resume_p99_s": budget,
        "warn_share": WARN_SHARE,
        "warn_above_s": _r(limit),
        "hops": cast(JsonValue, hops),
        "phases": per_phase,
        "resume": _resume(ctx, frames),
        "warnings": list(warned),
        "processes": "CPU and memory of each lab process: report.json `processes`",
    }


def judged_figures(hop: Mapping[str, Any]) -> Mapping[str, Any]:
    """A hop's figures as the warning judges them: outside latency toxics where there were
    some (a delay inside one is the fault's, not the lab's)."""
    outside = hop.get("outside_toxics")
    return outside if isinstance(outside, Mapping) and outside else hop


def lab_share_of_path(sec: Mapping[str, Any]) -> tuple[float, list[str]]:
    """The lab's own p99 on a resumption's path (request + upstream + delivery hops, outside
    latency toxics where there were some) and its parts, as text."""
    total, parts = 0.0, []
    for h in sec.get("hops") or []:
        if not isinstance(h, dict) or h.get("hop") not in MEASURED:
            continue
        judged = judged_figures(h)
        p99 = judged.get("p99_s")
        if isinstance(p99, int | float) and math.isfinite(p99):
            total += float(p99)
            parts.append(f"{h.get('title') or h['hop']} {float(p99):.3f} s")
    return total, parts


def qualify_resume(ctx: Context, result: GateResult) -> GateResult:
    """Gate 5 with the lab-latency warnings in its notes; and a failure on latency alone
    (no server violation from the wire) while the lab's own p99 on a resumption's path is
    at least `DOMINATES_SHARE` of the budget is the lab's, not the target's: inconclusive,
    saying so (the lab is never the bottleneck it measures)."""
    sec = section(ctx)
    warned = sec.get("warnings")
    if not isinstance(warned, list) or not warned:
        return result
    budget = ctx.budgets.resume_p99_s
    own, parts = lab_share_of_path(sec)
    on_total = result.measured.get("judged_on") != JUDGED_ON_TARGET
    if (
        on_total
        and result.verdict is Verdict.FAIL
        and server_violations(result) == 0
        and own >= DOMINATES_SHARE * budget
    ):
        text = (
            f"limited by the lab: its own steps of the chain add p99 {own:.3f} s to a resumption "
            f"({'; '.join(parts)}), {own / budget:.0%} of the {budget:g} s budget (at least "
            f"{DOMINATES_SHARE:.0%} is the lab's to answer for, not the target's)"
        )
        evidence = Evidence(
            "lab latency", f"< {DOMINATES_SHARE:.0%} of the budget", f"{own:.3f} s", False, text
        )
        result = made_inconclusive(result, evidence, text)
    resume = sec.get("resume")
    net = ""
    if isinstance(resume, dict) and resume.get("joined"):
        p99 = "never (inf)" if resume.get("net_p99_unbounded") else f"{resume['net_p99_s']:.3f} s"
        net = f"; resume p99 net of the lab's delivery delay: {p99} ({resume['joined']} recoveries joined)"
    notes = [f"{NOTE_PREFIX} {w['text']}{net}" for w in warned if isinstance(w, dict)]
    fresh = [n for n in notes if n not in result.notes]
    if not fresh:
        return result
    return replace(result, notes=(*result.notes, *fresh))
