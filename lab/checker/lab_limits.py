"""The lab must not be the bottleneck it measures.

A latency measured while one of the lab's own processes (a Locust worker, mitmdump, the
nemesis, the Locust master) runs flat out is the lab's latency, and a knee found then is
the lab's knee. From the process monitor's samples (`lab.checker.processes`) this module
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

import numpy as np

from lab.checker import processes
from lab.checker.context import Context
from lab.checker.gate_resume import run_latencies, server_violations
from lab.checker.model import Evidence, GateResult, Verdict
from lab.checker.processes import BOX, SATURATED_CPU, SATURATED_SHARE, ProcessSamples, Saturation

WORKER_CPU_AIM = 0.7
"""A worker sized to use at most this share of a core leaves room for bursts."""


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
        return [s.part for s in self.saturated]

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
        "saturated": [
            {"part": x.part, "share": round(x.share, 3), "cpu_mean": round(x.cpu_mean, 3)}
            for x in lim.saturated
        ],
        "workers_needed": lim.workers_needed,
        "basis": lim.basis,
        "text": lim.text(),
    }


def lab_evidence(lim: LabLimit) -> Evidence:
    return Evidence(
        "lab not saturated",
        f"no lab process at >= {SATURATED_CPU:.0%} of a core in >= {SATURATED_SHARE:.0%} of the samples",
        ", ".join(lim.names),
        False,
        lim.text(),
    )


def qualify_resume(ctx: Context, result: GateResult) -> GateResult:
    """Gate 5 failed: if most of its slow recoveries were lost while a lab process was
    saturated (its sample within a second of the loss at >= 90 % of a core), the p99 is
    the lab's: the gate is inconclusive, naming the process."""
    if result.verdict is not Verdict.FAIL:
        return result
    if server_violations(result):
        return result  # the server broke a rule on the wire: that is no latency of the lab's
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
    return replace(
        result,
        verdict=Verdict.INCONCLUSIVE,
        summary=f"{result.summary}; {text}",
        evidence=(*result.evidence, evidence),
        notes=(*result.notes, text),
    )
