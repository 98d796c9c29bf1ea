"""A run's timeline, phase by phase: what the load, the faults and the lab looked like in
each phase of the scenario (`[[phases]]`; a run without phases is one implicit phase).

The phases come from run.json (`scenario.phases`, counted from `started_at`), cut at
`stopped_at` (a phase the run never reached is listed with `reached` false and no
metrics). Every metric is measured from the ledgers over a time window, so the same
functions serve the report's phase table, gate 7 (steady state restored: a phase's last
half) and the capacity knee (a ramp step), and `lab run` uses them live to stop a ramp
one step past its knee (`measure_frames` with only the client tables).

Metrics of a window [start, end) (times epoch s, rates per second of the window):
    events, events_per_s          SSE events with a message the server sent (tap `sent`,
                                  has_data, not priming; else the server ledger; else the
                                  clients' accepted receipts), by the time they were sent
    calls, calls_per_s            tool calls that got their outcome in the window
                                  (client `operations` by `finished_at`)
    call_errors, call_error_rate  of those, the ones whose outcome is `error` or `unknown`
                                  (`cancelled` ones are the client's choice: left out)
    recoveries, resume_p50_s, resume_p99_s
                                  client `recoveries` whose loss was detected in the window
                                  (gate 5's latencies: never recovered = infinite, p99 then
                                  null with `resume_p99_unbounded`; losses too close to the
                                  run's stop to have had a chance are censored), plus the
                                  calls that never got an outcome that started in it
    reconnects, reconnect_qps_peak
                                  client `reconnects` sent in the window, and the busiest
                                  1 s bin (gate 6's bins)
    status_4xx, status_5xx        responses the clients got (tap `flow` records by the time
                                  their head passed, whoever answered: the server or a
                                  proxy storm; without a tap the clients' exchanges)
    clients_max                   the most clients with a request open in a second
    faults                        fault kind -> times it fired (the sources of
                                  `lab.checker.truth.faults`, by the time of each record)
    lab_cpu_peak, lab_saturated   each process's highest CPU (cores) in the window, and
                                  the lab processes saturated in it (`lab.checker.health.processes`)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.health import processes
from lab.checker.inputs.load import MissingInput, RunData
from lab.checker.inputs.phase_specs import PhaseSpec, number, phase_specs
from lab.checker.model import JsonValue
from lab.checker.truth.faults import SOURCE_OF, firings
from lab.checker.truth.liveness import active_clients, never_finished_latencies
from lab.checker.truth.reconnects import per_second
from lab.checker.truth.recoveries import PERCENTILE, client_ends, latencies, nearest_rank
from lab.checker.truth.shares import recovery_shares
from lab.faults.kinds import REGISTRY

ERROR_OUTCOMES = ("error", "unknown")
FINISHED_OUTCOMES = ("ok", "error", "unknown")


def specs(ctx: Context) -> list[PhaseSpec]:
    return ctx.cached("phase_specs", lambda: phase_specs(ctx.data.run))


# ------------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class Metrics:
    start: float
    end: float
    events: int | None
    events_per_s: float | None
    calls: int | None
    calls_per_s: float | None
    call_errors: int | None
    call_error_rate: float | None
    recoveries: int | None
    never_recovered: int | None
    resume_p50_s: float | None
    resume_p99_s: float | None
    resume_p99_unbounded: bool
    reconnects: int | None
    reconnect_qps_peak: int | None
    status_4xx: int | None
    status_5xx: int | None
    clients_max: int | None
    faults: Mapping[str, int]
    lab_cpu_peak: Mapping[str, float]
    lab_saturated: tuple[processes.Saturation, ...]
    resume_target_p99: float | None = None
    """p99 of the target's share of the same recoveries (lab.checker.truth.shares; the
    whole latency for those that could not be split, inf for a share never ended); None
    when not one of them could be split (no tap, or `lab run`'s live table)."""

    @property
    def resume_p99_or_inf(self) -> float | None:
        """p99 with an unbounded one as inf (None: no recovery)."""
        return math.inf if self.resume_p99_unbounded else self.resume_p99_s


def within(times: pd.Series | np.ndarray, start: float, end: float) -> np.ndarray:
    t = np.asarray(pd.to_numeric(pd.Series(times), errors="coerce"), dtype="float64")
    return (t >= start) & (t < end)


def _rate(count: int | None, seconds: float) -> float | None:
    if count is None or seconds <= 0:
        return None
    return round(count / seconds, 3)


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def event_times(data: RunData) -> np.ndarray | None:
    """When each SSE event with a message was sent (as gate counts do), or None."""
    if data.tap is not None:
        sent = data.tap["sent"]
        mask = sent["has_data"].fillna(False).astype(bool) & ~sent["priming"].fillna(False).astype(bool)
        return np.asarray(sent.loc[mask, "t"].astype("float64"))
    if data.server is not None:
        ev = data.server["events_sent"]
        return np.asarray(ev.loc[ev["kind"] != "priming", "sent_at"].astype("float64"))
    if data.client is not None and "inbox" in data.client:
        inbox = data.client["inbox"]
        return np.asarray(inbox.loc[inbox["kind"] != "priming", "accepted_at"].astype("float64"))
    return None


def _client(data: RunData, table: str) -> pd.DataFrame | None:
    if data.client is None or table in data.client_tables_absent or table not in data.client:
        return None
    return data.client[table]


def fault_times(data: RunData) -> pd.DataFrame:
    """t, fault: one row per firing (the first record of each decision), from the sources
    `lab.checker.truth.faults` counts (each kind from the tap sources its registry entry
    declares)."""
    rows: list[tuple[float, str, str]] = []
    if data.tap is not None:
        for t, faults in zip(data.tap["flow"]["t"], data.tap["flow"]["faults"], strict=True):
            if isinstance(faults, list):
                rows += [(t, str(f.get("fault")), "tap_flow") for f in faults if isinstance(f, dict)]
        for kind, source in (
            ("forwarded", "tap_forwarded"),
            ("dropped", "tap_dropped"),
            ("fault", "tap_fault"),
        ):
            hit = firings(data.tap[kind]) if kind != "fault" else data.tap[kind]
            hit = hit[hit["fault"].notna()]
            rows += [(t, str(f), source) for t, f in zip(hit["t"], hit["fault"], strict=True)]
    if data.nemesis is not None and len(data.nemesis):
        added = data.nemesis[data.nemesis["type"] == "toxic_added"]
        rows += [(t, f"toxic:{k}", "nemesis") for t, k in zip(added["t"], added["kind"], strict=True)]
    frame = pd.DataFrame(rows, columns=["t", "fault", "source"])
    if not len(frame):
        return frame
    keep = []
    for fault, source in zip(frame["fault"], frame["source"], strict=True):
        spec = REGISTRY.get(fault)
        keep.append(spec is None or source in {SOURCE_OF[e] for e in spec.evidence})
    return frame[np.array(keep, dtype=bool)]


def _statuses(data: RunData) -> tuple[np.ndarray, np.ndarray] | None:
    if data.tap is not None:
        flows = data.tap["flow"]
        return (
            np.asarray(pd.to_numeric(flows["t"], errors="coerce"), dtype="float64"),
            np.asarray(pd.to_numeric(flows["status"], errors="coerce"), dtype="float64"),
        )
    x = _client(data, "http_exchanges")
    if x is None:
        return None
    return (
        np.asarray(pd.to_numeric(x["ended_at"], errors="coerce"), dtype="float64"),
        np.asarray(pd.to_numeric(x["status"], errors="coerce"), dtype="float64"),
    )


def measure(ctx: Context, start: float, end: float) -> Metrics:
    """The metrics of [start, end) from every ledger of the run (and its process samples),
    with the target's share of its resume latency."""
    stuck = _stuck(ctx)
    m = measure_frames(
        ctx.data,
        start,
        end,
        budget_s=ctx.budgets.resume_p99_s,
        stopped_at=ctx.stopped_at,
        stuck=stuck,
        samples=processes.samples(ctx),
        faults=ctx.cached("phase_fault_times", lambda: fault_times(ctx.data)),
        active=ctx.cached("phase_active_clients", lambda: _active(ctx.data)),
    )
    return replace(m, resume_target_p99=_target_p99(ctx, start, end, stuck))


def _target_p99(ctx: Context, start: float, end: float, stuck: pd.DataFrame | None) -> float | None:
    """The target's share p99 of the recoveries lost in [start, end), judged as gate 5
    judges them (the whole latency where a recovery was not split; a call that never
    finished is infinite); None when none of them was split."""
    try:
        shares = recovery_shares(ctx)
    except MissingInput:
        return None
    inside = shares[within(shares["lost_at"], start, end)]
    if not len(inside) or not inside["target_s"].notna().any():
        return None
    judged = inside["target_s"].astype("float64").fillna(inside["latency"].astype("float64")).to_numpy()
    if stuck is not None and len(stuck):
        judged = np.concatenate(
            [judged, np.full(int(within(stuck["started_at"], start, end).sum()), math.inf)]
        )
    return nearest_rank(judged, PERCENTILE)


def _active(data: RunData) -> pd.Series | None:
    x = _client(data, "http_exchanges")
    return None if x is None else active_clients(x)


def _stuck(ctx: Context) -> pd.DataFrame | None:
    try:
        return never_finished_latencies(ctx)
    except Exception:  # liveness says its own error; the phase table goes on without it
        return None


def measure_frames(
    data: RunData,
    start: float,
    end: float,
    *,
    budget_s: float,
    stopped_at: float | None,
    stuck: pd.DataFrame | None = None,
    samples: processes.ProcessSamples | None = None,
    faults: pd.DataFrame | None = None,
    active: pd.Series | None = None,
) -> Metrics:
    """The metrics of [start, end) from whatever `data` holds (a ledger it lacks leaves
    its metrics None). Pure: `lab run` calls it live with the client tables alone."""
    seconds = max(0.0, end - start)
    times = event_times(data)
    events = int(within(times, start, end).sum()) if times is not None else None
    calls, errors = _calls(data, start, end)
    recoveries, never, p50, p99 = _resume_latency(data, start, end, budget_s, stopped_at, stuck)
    reconnects, peak = _reconnects(data, start, end)
    s4, s5 = _status_counts(data, start, end)
    if active is None:
        active = _active(data)
    clients_max = None
    if active is not None:
        idx = active.index.to_numpy(dtype="float64")
        inside_a = active[(idx >= math.floor(start)) & (idx < end)]
        clients_max = int(inside_a.max()) if len(inside_a) else 0
    fired: Counter[str] = Counter()
    if faults is not None and len(faults):
        fired = Counter(faults.loc[within(faults["t"], start, end), "fault"].astype(str))
    peaks: dict[str, float] = {}
    sat: tuple[processes.Saturation, ...] = ()
    if samples is not None and samples.present:
        peaks = processes.cpu_peaks(samples, start, end)
        sat = tuple(processes.saturated(samples, start, end))
    return Metrics(
        start=start,
        end=end,
        events=events,
        events_per_s=_rate(events, seconds),
        calls=calls,
        calls_per_s=_rate(calls, seconds),
        call_errors=errors,
        call_error_rate=round(errors / calls, 4)
        if calls and errors is not None
        else (0.0 if calls == 0 else None),
        recoveries=recoveries,
        never_recovered=never,
        resume_p50_s=_finite(p50),
        resume_p99_s=_finite(p99),
        resume_p99_unbounded=bool(math.isinf(p99)),
        reconnects=reconnects,
        reconnect_qps_peak=peak,
        status_4xx=s4,
        status_5xx=s5,
        clients_max=clients_max,
        faults=dict(sorted(fired.items())),
        lab_cpu_peak=peaks,
        lab_saturated=sat,
    )


def _calls(data: RunData, start: float, end: float) -> tuple[int | None, int | None]:
    """(calls, errors): the client's operations that finished in [start, end), and in error."""
    ops = _client(data, "operations")
    if ops is None:
        return None, None
    done = ops[within(ops["finished_at"], start, end) & ops["outcome"].isin(FINISHED_OUTCOMES).to_numpy()]
    return len(done), int(done["outcome"].isin(ERROR_OUTCOMES).sum())


def _resume_latency(
    data: RunData,
    start: float,
    end: float,
    budget_s: float,
    stopped_at: float | None,
    stuck: pd.DataFrame | None,
) -> tuple[int | None, int | None, float, float]:
    """(recoveries, never recovered, p50, p99) of the losses in [start, end), censored ones
    left out; a call that never finished (`stuck`) counts as a loss never recovered."""
    rec = _client(data, "recoveries")
    if rec is None:
        return None, None, math.nan, math.nan
    lat = latencies(rec[within(rec["lost_at"], start, end)], budget_s, stopped_at, client_ends(data))
    values = lat.loc[~lat["censored"], "latency"].to_numpy(dtype="float64")
    if stuck is not None and len(stuck):
        values = np.concatenate(
            [values, np.full(int(within(stuck["started_at"], start, end).sum()), math.inf)]
        )
    p50, p99 = nearest_rank(values, 0.5), nearest_rank(values, PERCENTILE)
    return len(values), int(np.isinf(values).sum()), p50, p99


def _reconnects(data: RunData, start: float, end: float) -> tuple[int | None, int | None]:
    """(reconnects, the busiest second's count) of the client's attempts sent in [start, end)."""
    rc = _client(data, "reconnects")
    if rc is None:
        return None, None
    inside = rc[within(rc["sent_at"], start, end)]
    bins = per_second(inside)
    return len(inside), int(bins.max()) if len(bins) else 0


def _status_counts(data: RunData, start: float, end: float) -> tuple[int | None, int | None]:
    """(4xx, 5xx): the answers with those statuses in [start, end)."""
    status = _statuses(data)
    if status is None:
        return None, None
    t, code = status
    answered = (t >= start) & (t < end)
    s4 = int((answered & (code >= 400) & (code < 500)).sum())
    s5 = int((answered & (code >= 500) & (code < 600)).sum())
    return s4, s5


def metrics_json(m: Metrics) -> dict[str, JsonValue]:
    return {
        "events": m.events,
        "events_per_s": m.events_per_s,
        "calls": m.calls,
        "calls_per_s": m.calls_per_s,
        "call_errors": m.call_errors,
        "call_error_rate": m.call_error_rate,
        "recoveries": m.recoveries,
        "never_recovered": m.never_recovered,
        "resume_p50_s": m.resume_p50_s,
        "resume_p99_s": m.resume_p99_s,
        "resume_p99_unbounded": m.resume_p99_unbounded,
        "resume_target_p99_s": _finite(m.resume_target_p99) if m.resume_target_p99 is not None else None,
        "resume_target_p99_unbounded": m.resume_target_p99 is not None and math.isinf(m.resume_target_p99),
        "reconnects": m.reconnects,
        "reconnect_qps_peak": m.reconnect_qps_peak,
        "status_4xx": m.status_4xx,
        "status_5xx": m.status_5xx,
        "clients_max": m.clients_max,
        "faults": dict(m.faults),
        "lab_cpu_peak": dict(m.lab_cpu_peak),
        "lab_saturated": list(dict.fromkeys(s.part for s in m.lab_saturated)),
    }


def phase_metrics(ctx: Context, spec: PhaseSpec, *, last_half: bool = False) -> Metrics | None:
    """A phase's metrics (cached), over the whole phase or its last half; None if the run
    never reached it."""
    if not spec.reached:
        return None
    start, end = spec.last_half() if last_half else (spec.start, spec.end)
    key = f"phase_metrics:{spec.name}:{start}:{end}"
    return ctx.cached(key, lambda: measure(ctx, start, end))


def section(ctx: Context) -> list[dict[str, JsonValue]]:
    """report.json `phases`: one entry per phase (docs/report.md)."""
    origin = ctx.origin or 0.0
    out: list[dict[str, JsonValue]] = []
    for spec in specs(ctx):
        m = phase_metrics(ctx, spec)
        entry: dict[str, JsonValue] = {
            "name": spec.name,
            "kind": spec.kind,
            "start": spec.start,
            "end": spec.end,
            "start_s": round(spec.start - origin, 3),
            "end_s": round(spec.end - origin, 3),
            "reached": spec.reached,
            "complete": spec.complete,
            "users": spec.users,
            "knobs": {str(k): v for k, v in spec.knobs.items()},
        }
        if m is not None:
            entry.update(metrics_json(m))
        out.append(entry)
    return out


# ------------------------------------------------------------------------- tolerances

TOLERANCE_DEFAULTS: dict[str, float] = {
    "recovery_events_ratio": 0.9,
    "recovery_resume_p99_factor": 1.5,
    "recovery_resume_p99_slack_s": 0.25,
    "recovery_error_rate_slack": 0.01,
    "min_baseline_events": 100,
    "call_error_rate_max": 0.01,
    "min_rollout_sessions": 10,
    "unanswered_max_share": 0.01,
    "answer_p99_s": 2.0,
}
"""Tolerances of gate 7, the capacity knee, the capacity rule and the rollout (run.json `budgets`;
docs/scenarios.md): a name run.json does not give takes its default."""


@dataclass(frozen=True, slots=True)
class Tolerances:
    values: Mapping[str, float]
    defaulted: tuple[str, ...]

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def tolerances(run: Mapping[str, Any] | None) -> Tolerances:
    raw = (run or {}).get("budgets")
    given: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    values, defaulted = {}, []
    for name, default in TOLERANCE_DEFAULTS.items():
        value = number(given.get(name))
        if value is None or value < 0:
            values[name], value = default, default
            defaulted.append(name)
        values[name] = value
    return Tolerances(values, tuple(defaulted))
