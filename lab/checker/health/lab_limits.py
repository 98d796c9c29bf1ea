"""The lab must not be the bottleneck it measures.

A latency measured while one of the lab's own processes (a Locust worker, mitmdump, the
nemesis, the Locust master) runs flat out is the lab's latency, and a knee found then is
the lab's knee. From the process monitor's samples (`lab.checker.health.processes`) this module
says when a finding coincides with a saturated lab process (or a saturated box), names
the process, and estimates how many Locust workers the load would have needed:

- gate 7 (a recovery phase that did not come back) and a capacity step past the knee
  ask `limit(ctx, start, end)` for their window;
- gate 5 (resume p99) is qualified after the fact (`qualify_resume`): when most of its
  slow recoveries were lost while a lab process was saturated, the failure is the lab's.

A finding limited by the lab is never reported as the target's: a failing gate becomes
inconclusive, with the evidence `lab not saturated` unmet and the process named; a knee
is reported as "limited by the lab (<process>)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.health import processes
from lab.checker.health.processes import (
    BOX,
    FDS_NEAR_LIMIT,
    SATURATED_CPU,
    SATURATED_SHARE,
    ProcessSamples,
    Saturation,
)
from lab.checker.model import Evidence, GateResult, JsonValue, Verdict, made_inconclusive
from lab.checker.truth import request_hops
from lab.checker.truth.liveness import never_finished_latencies
from lab.checker.truth.recoveries import nearest_rank, run_latencies

WORKER_CPU_AIM = 0.7
"""A worker sized to use at most this share of a core leaves room for bursts."""


def server_violations(result: GateResult) -> int:
    """Gate 5's violations the server committed on the wire (`no_priming`,
    `silent_resumption`, `unreplayed_resumption`): never the lab's latency, so nothing
    may excuse them."""
    m = result.measured
    names = ("no_priming", "silent_resumptions", "unreplayed_resumptions")
    return sum(int(cast(int, m.get(name) or 0)) for name in names)


@dataclass(frozen=True, slots=True)
class LabLimit:
    """Saturated lab processes in a window, and what it would have taken instead."""

    saturated: tuple[Saturation, ...]
    cpus: int | None
    workers_needed: int | None = None
    basis: str = ""
    """How `workers_needed` was estimated (or why it could not be)."""

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(s.part for s in self.saturated))

    def text(self) -> str:
        parts = "; ".join(processes.describe(s, self.cpus) for s in self.saturated)
        extra = f"; {self.basis}" if self.basis else ""
        return f"limited by the lab ({', '.join(self.names)}): {parts}{extra}"


def _workers(s: ProcessSamples, start: float | None, end: float | None) -> tuple[int, float]:
    """(worker processes seen, their summed mean CPU) in the window."""
    f = processes.window(s, start, end)
    w = f[f["part"].astype(str).str.fullmatch(r"worker-\d+")]
    if not len(w):
        return 0, 0.0
    means = w.groupby("part")["cpu"].mean()
    return len(means), float(means.sum())


def workers_needed(
    s: ProcessSamples,
    start: float,
    end: float,
    users: int | None,
    reference: tuple[float, float, int | None] | None = None,
) -> tuple[int | None, str]:
    """How many Locust workers the load of [start, end) would have needed to keep each
    below `WORKER_CPU_AIM` of a core. From the workers' CPU per user in `reference` (a
    window, with its users, where they were not saturated) when there is one; else a
    lower bound from what they used in the window itself (saturated, they used less than
    they needed)."""
    count, cpu = _workers(s, start, end)
    if count == 0:
        return None, "no Locust worker was sampled"
    if reference is not None and users:
        r_start, r_end, r_users = reference
        r_count, r_cpu = _workers(s, r_start, r_end)
        if r_count and r_users and r_cpu > 0:
            per_user = r_cpu / r_users
            need = max(count + 1, math.ceil(users * per_user / WORKER_CPU_AIM))
            return need, (
                f"{per_user * 1000:.2f} millicores per client at {r_users} clients (unsaturated), "
                f"x {users} clients / {WORKER_CPU_AIM:.0%} of a core per worker: {need} workers needed "
                f"({count} ran)"
            )
    need = max(count + 1, math.ceil(cpu / WORKER_CPU_AIM))
    return need, (
        f"at least {need} workers needed ({count} ran, using {cpu:.2f} cores together while saturated; "
        f"{WORKER_CPU_AIM:.0%} of a core each is the aim)"
    )


def limit(
    ctx: Context,
    start: float,
    end: float,
    *,
    users: int | None = None,
    reference: tuple[float, float, int | None] | None = None,
) -> LabLimit | None:
    """The lab's saturated processes in [start, end), or None when none was (or there are
    no process samples)."""
    s = processes.samples(ctx)
    if not s.present:
        return None
    sat = tuple(processes.saturated(s, start, end))
    if not sat:
        return None
    need, basis = None, ""
    if any(x.part.startswith("worker-") for x in sat):
        need, basis = workers_needed(s, start, end, users, reference)
    elif any(x.part == "mitmproxy" for x in sat):
        basis = "mitmdump is one process: more Locust workers would not help; the chain needs another proxy"
    elif any(x.part == BOX for x in sat):
        basis = (
            "every process shares this machine: a bigger box, or the load spread over more machines (compose)"
        )
    return LabLimit(sat, s.cpus, need, basis)


TARGET_IDLE_CPU = 0.5
"""A monitored target whose CPU p95 stays under this (cores) was not CPU-bound."""


def target_cpu_p95(ctx: Context, start: float, end: float) -> float | None:
    """The reference server's CPU p95 (cores) in [start, end); None when it was not
    sampled (a URL target runs elsewhere)."""
    s = processes.samples(ctx)
    if not s.present:
        return None
    f = processes.window(s, start, end)
    server = f[[not processes.is_lab(str(p)) for p in f["part"]]]
    if not len(server):
        return None
    per_tick = server.groupby("t")["cpu"].sum().to_numpy(dtype="float64")
    return float(np.quantile(per_tick, 0.95))


def limit_json(lim: LabLimit | None) -> dict[str, object] | None:
    if lim is None:
        return None
    return {
        "processes": lim.names,
        "saturated": [processes.saturation_json(x) for x in lim.saturated],
        "workers_needed": lim.workers_needed,
        "basis": lim.basis,
        "text": lim.text(),
    }


def lab_evidence(lim: LabLimit) -> Evidence:
    return Evidence(
        "lab not saturated",
        f"no lab process at >= {SATURATED_CPU:.0%} of a core in >= {SATURATED_SHARE:.0%} of the samples, "
        f"nor with open fds at >= {FDS_NEAR_LIMIT:.0%} of its limit",
        ", ".join(lim.names),
        False,
        lim.text(),
    )


JUDGED_ON_TARGET = "target_share"
"""Gate 5's `judged_on` when it judged the target on its own share (lab.checker.truth.shares)."""


def qualify_resume(ctx: Context, result: GateResult) -> GateResult:
    """Gate 5 failed on the total latency (its recoveries could not be split): if most of its slow recoveries were lost while a lab process was
    saturated (its sample within a second of the loss at >= 90 % of a core), the p99 is
    the lab's: the gate is inconclusive, naming the process."""
    if result.verdict is not Verdict.FAIL:
        return result
    if server_violations(result):
        return result  # the server broke a rule on the wire: that is no latency of the lab's
    if result.measured.get("judged_on") == JUDGED_ON_TARGET:
        return result  # the target's own share, timed at the wire, failed: whatever the lab did
    s = processes.samples(ctx)
    if not s.present or ctx.data.client is None or "recoveries" in ctx.data.client_tables_absent:
        return result
    budget = ctx.budgets.resume_p99_s
    lat = run_latencies(ctx)
    slow = lat[~lat["censored"] & (lat["latency"] >= budget)]
    if not len(slow):
        return result
    f = s.frame
    lab = f[[processes.is_lab(str(p)) for p in f["part"]]]
    hot = lab[lab["cpu"] >= SATURATED_CPU]
    if not len(hot):
        return result
    hot_seconds = np.floor(hot["t"].to_numpy(dtype="float64")).astype("int64")
    hot_set = set(hot_seconds.tolist())
    lost = np.floor(slow["lost_at"].to_numpy(dtype="float64")).astype("int64")
    during = [any(sec + d in hot_set for d in (-1, 0, 1)) for sec in lost.tolist()]
    share = sum(during) / len(during)
    if share < SATURATED_SHARE:
        return result
    parts = hot.assign(second=hot_seconds)
    lost_seconds = {
        sec + d for sec, hit in zip(lost.tolist(), during, strict=True) if hit for d in (-1, 0, 1)
    }
    named = parts[parts["second"].isin(lost_seconds)]["part"].value_counts()
    names = ", ".join(f"{p} ({n} samples)" for p, n in named.head(4).items())
    text = (
        f"limited by the lab ({names}): {share:.0%} of the {len(slow)} slow recoveries were lost while "
        f"a lab process used >= {SATURATED_CPU:.0%} of a core; the latency measured is the lab's, not the target's"
    )
    evidence = Evidence(
        "lab not saturated", "slow recoveries not during a saturated lab process", names, False, text
    )
    return made_inconclusive(result, evidence, text)


# ---------------------------------------------------------------------------- unanswered requests

LAB_HOPS = (request_hops.CLIENT_TO_PROXY, request_hops.SERVER_TO_PROXY, request_hops.PROXY_TO_CLIENT)
"""Hops only the lab's own parts sit on (the worker, the nemesis, mitmdump)."""
PROXY_PARTS = ("mitmproxy", BOX)
"""Saturated, these make `proxy_to_server` losses the lab's too: mitmdump's upstream
connection, or a machine the target shares with the lab."""
TOUCH_SLACK_S = 1.0
"""A request that failed this long before a loss was detected still caused it."""


@dataclass(frozen=True, slots=True)
class UnansweredLimit:
    """Many requests went unanswered: the lab parts saturated meanwhile, and whether the
    requests lost on the hops those parts carry are many themselves (`applies`: the
    verdict then names the parts and the reasons)."""

    unanswered: int
    """The lab's unanswered requests (`rows`)."""
    sent: int
    by_hop: dict[str, int]
    reasons: tuple[str, ...]
    """`nemesis: 19,870 of 20,000 file descriptors`, `mitmproxy: CPU 0.98 core`, ..."""
    parts: tuple[str, ...]
    start: float
    end: float
    applies: bool
    rows: pd.DataFrame
    """The requests left without an answer on those hops (closed early ones too: a request
    the client gave up on at its exit after a few seconds was as stuck), not by fault:
    client_id, started_at, ended_at, hop, ..."""

    def text(self) -> str:
        hops = ", ".join(f"{h.replace('_to_', ' → ')} {n:,}" for h, n in self.by_hop.items() if n)
        return (
            f"limited by the lab ({', '.join(self.parts)}): {self.unanswered:,} of {self.sent:,} requests went "
            f"unanswered in the lab's part of the chain ({hops}) while {'; '.join(self.reasons)}"
        )


def unanswered_limit(ctx: Context) -> UnansweredLimit | None:
    """The lab's part in the run's unanswered requests, or None when they were few. It
    `applies` when a lab part was saturated while they went unanswered (CPU or open fds
    per `limit`, or connections that failed before the proxy outside any toxic) and the
    requests lost on the hops the lab carries were many."""
    return ctx.cached("unanswered_limit", lambda: _unanswered_limit(ctx))


def _unanswered_limit(ctx: Context) -> UnansweredLimit | None:
    f = request_hops.findings(ctx)
    lost = request_hops.counted(f)
    sent = len(f.rows)
    if not request_hops.many(lost, sent):
        return None
    span = request_hops.window(lost)
    assert span is not None
    lim = limit(ctx, *span)
    reasons: list[str] = []
    parts: list[str] = []
    if lim is not None:
        reasons += [s.short(lim.cpus) for s in lim.saturated]
        parts += lim.names
    conn = request_hops.connection_errors(f.rows)
    if request_hops.many(conn, sent):
        first = first_hop(ctx)
        causes = ", ".join(f"{k} {v:,}" for k, v in conn["error"].value_counts().items())
        reasons.append(f"{first}: {len(conn):,} connections failed before the proxy ({causes})")
        parts.append(first)
    hops = LAB_HOPS + ((request_hops.PROXY_TO_SERVER,) if any(p in PROXY_PARTS for p in parts) else ())
    ours = lost[lost["hop"].isin(hops)]
    counts = ours["hop"].value_counts()
    stuck = f.rows[f.rows["hop"].isin(hops) & ~f.rows["by_fault"]]
    return UnansweredLimit(
        unanswered=len(ours),
        sent=sent,
        by_hop={h: int(counts.get(h, 0)) for h in request_hops.HOPS},
        reasons=tuple(reasons),
        parts=tuple(dict.fromkeys(parts)),
        start=span[0],
        end=span[1],
        applies=bool(reasons) and request_hops.many(ours, sent),
        rows=stuck,
    )


def first_hop(ctx: Context) -> str:
    """The part the clients connect to: the nemesis when the run started one."""
    procs = (ctx.data.run or {}).get("processes")
    names = {p.get("name") for p in procs if isinstance(p, dict)} if isinstance(procs, list) else set()
    return "nemesis" if "nemesis" in names or not names else "mitmproxy"


def unanswered_limit_json(lim: UnansweredLimit | None, origin: float | None) -> dict[str, JsonValue] | None:
    """report.json `unanswered.lab_limit`: null unless the lab's limit applies."""
    if lim is None or not lim.applies:
        return None
    zero = origin or 0.0
    return {
        "parts": list(lim.parts),
        "reasons": list(lim.reasons),
        "unanswered": lim.unanswered,
        "by_hop": dict(lim.by_hop),
        "start_s": round(lim.start - zero, 3),
        "end_s": round(lim.end - zero, 3),
        "text": lim.text(),
    }


def qualify_unanswered(ctx: Context, result: GateResult) -> GateResult:
    """Gate 5 failed while many requests went unanswered on the lab's hops with a lab part
    saturated: if the recoveries those requests did not touch would pass (or there are
    none), the failure is the lab's — inconclusive, naming the parts and reasons. A wire
    violation by the server stays a failure. Otherwise (and for a gate that did not
    fail) the finding is a note."""
    if result.verdict is Verdict.PASS:
        return result
    lim = unanswered_limit(ctx)
    if lim is None or not lim.applies:
        return result
    text = lim.text()
    if result.verdict is not Verdict.FAIL or server_violations(result):
        return replace(result, notes=(*result.notes, text))
    lat = _gate5_latencies(ctx)
    touched = _touched(lat, lim.rows)
    rest = lat[~touched]["latency"].to_numpy(dtype="float64")
    budget = ctx.budgets.resume_p99_s
    rest_p99 = nearest_rank(rest, 0.99)
    if len(rest) and rest_p99 >= budget:
        return replace(
            result,
            notes=(
                *result.notes,
                f"{text}; without the {int(touched.sum())} recoveries they touched the p99 is still "
                f"{'never' if math.isinf(rest_p99) else f'{rest_p99:.3f} s'}: the failure stands",
            ),
        )
    without = (
        "no recovery is left without them"
        if not len(rest)
        else f"without the {int(touched.sum())} recoveries they touched the p99 is {rest_p99:.3f} s"
    )
    full = f"{text}; {without}: the latency measured is the lab's, not the target's"
    evidence = Evidence(
        "lab not saturated",
        "no lab part saturated while requests went unanswered on its hops",
        ", ".join(lim.parts),
        False,
        full,
    )
    return made_inconclusive(result, evidence, text, full)


def _gate5_latencies(ctx: Context) -> pd.DataFrame:
    """Gate 5's counted recoveries (client_id, lost_at, end, latency): the client's and the
    calls that never got an outcome, censored ones left out."""
    lat = run_latencies(ctx)
    lat = lat[~lat["censored"]]
    frame = pd.DataFrame(
        {
            "client_id": lat["client_id"].astype(str).to_numpy(),
            "lost_at": lat["lost_at"].astype("float64").to_numpy(),
            "latency": lat["latency"].astype("float64").to_numpy(),
        }
    )
    stuck = never_finished_latencies(ctx)
    if len(stuck):
        frame = pd.concat(
            [
                frame,
                pd.DataFrame(
                    {
                        "client_id": stuck["client_id"].astype(str).to_numpy(),
                        "lost_at": stuck["started_at"].astype("float64").to_numpy(),
                        "latency": math.inf,
                    }
                ),
            ],
            ignore_index=True,
        )
    frame["end"] = frame["lost_at"] + frame["latency"]
    return frame


def _touched(lat: pd.DataFrame, lost: pd.DataFrame) -> np.ndarray:
    """Per recovery: did one of its client's unanswered requests overlap it (sent before
    it ended, given up no earlier than TOUCH_SLACK_S before the loss)?"""
    if not len(lat) or not len(lost):
        return np.zeros(len(lat), dtype=bool)
    req = pd.DataFrame(
        {
            "client_id": lost["client_id"].astype(str).to_numpy(),
            "sent": lost["started_at"].to_numpy(dtype="float64"),
            "gave_up": lost["ended_at"].fillna(lost["started_at"]).to_numpy(dtype="float64"),
        }
    )
    pairs = lat.reset_index(drop=True).reset_index(names="i").merge(req, on="client_id", how="inner")
    hit = pairs[(pairs["sent"] <= pairs["end"]) & (pairs["gave_up"] >= pairs["lost_at"] - TOUCH_SLACK_S)]
    out = np.zeros(len(lat), dtype=bool)
    out[hit["i"].unique()] = True
    return out
