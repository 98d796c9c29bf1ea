"""Rule 16 — the target held the load (capacity checks only: `check = "capacity"`).

A capacity check asks "did my server hold N clients?", with no faults by design. The
answer is judged phase by phase (each `[[phases]]` entry, or the whole run as one), from
the wire, on the target's own share of each figure:

    unanswered    requests sent in the phase that the target left without an answer (the
                  `proxy_to_server` hop of lab.checker.truth.request_hops: the proxy had
                  the request, no answer came back, and the server's ledger, where there is
                  one, has none) over the requests sent <= `unanswered_max_share` (1 %)
    answer p99    the target's time to answer: the proxy has the request -> the answer's
                  head passes the proxy (the tap's `t_request` and `t`), p99 over the
                  phase's answered requests < `answer_p99_s` (2 s); each request is placed
                  in its phase by when its client sent it, as the unanswered ones are
    resume p99    the target's share of each recovery (lab.checker.truth.shares), where
                  the phase had any, < `resume_p99_s`, by the one rule `judge_share`

and the lab must not be at its limits in a phase it judges:
- a lab process saturated in the phase (a Locust worker, mitmdump, the nemesis:
  lab.checker.health.lab_limits), or many requests lost on the lab's own hops, make the
  phase **limited by the lab**: the capacity measured there is the lab's, and the rule is
  inconclusive, naming the parts;
- the whole box saturated is shared with the target: a target that met its budgets on a
  busier box than it needed met them (a note says so), but a miss there may be the box's:
  the answer time (the proxy's timing) is then not held against the target, nor are
  unanswered requests when the answers it did give were slow too (median >= 1 s: the
  whole chain was slow). A box that is busy does not leave some requests without any
  answer while the target answers the others at once: those stay the target's;
- with mitmdump itself saturated, its timing and its upstream connection are the lab's:
  neither figure is held against the target;
- a target share of the resume latency over budget fails whatever the lab did (the same
  rule as gate 5, `judge_share`).

A ramp of steps (lab.checker.timeline.capacity) stops being judged after its knee: the
step past the knee is what found it, and the rule names the knee instead. A miss of the
target's fails the rule, one witness per phase and figure, blamed on the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from lab.checker.context import Context
from lab.checker.health import lab_limits, processes
from lab.checker.health.processes import BOX
from lab.checker.inputs.phase_specs import PhaseSpec, capacity_check
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Scalar, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.timeline import capacity, phases
from lab.checker.truth import request_hops
from lab.checker.truth.conn_flows import conn_flows
from lab.checker.truth.recoveries import nearest_rank
from lab.checker.truth.shares import judge_share

CHAIN_SLOW_S = 1.0
"""With the box saturated, answers this slow at the median say the whole chain was slow:
the requests left unanswered may then be the lab's."""


@dataclass(slots=True)
class PhaseFigures:
    """One judged phase: its figures, the target's misses, and the lab's limits."""

    name: str
    users: int | None
    sent: int
    answered: int
    target_unanswered: int
    lab_unanswered: int
    answer_p99_s: float
    resume_total_p99_s: float
    resume_target_p99_s: float
    misses: list[tuple[str, str]] = field(default_factory=list)
    """(figure, words) the target missed."""
    limited: list[str] = field(default_factory=list)
    """Why the lab limited this phase, in words."""
    notes: list[str] = field(default_factory=list)
    """What the lab's state was without limiting the verdict (a busy box, when the target
    met its budgets)."""

    def json(self) -> dict[str, JsonValue]:
        def fin(v: float) -> JsonValue:
            return None if math.isnan(v) else ("inf" if math.isinf(v) else round(v, 4))

        return {
            "phase": self.name,
            "users": self.users,
            "sent": self.sent,
            "answered": self.answered,
            "target_unanswered": self.target_unanswered,
            "lab_unanswered": self.lab_unanswered,
            "answer_p99_s": fin(self.answer_p99_s),
            "resume_p99_s": fin(self.resume_total_p99_s),
            "resume_target_p99_s": fin(self.resume_target_p99_s),
            "misses": [m for m, _ in self.misses],
            "limited_by_lab": list(self.limited),
            "notes": list(self.notes),
        }


def applies(ctx: Context) -> bool:
    return capacity_check(ctx.data.run)


def measure(
    ctx: Context, spec: PhaseSpec, requests: pd.DataFrame, answers: pd.DataFrame, budget: dict[str, float]
) -> PhaseFigures:
    """The figures of one phase, and what the target missed or the lab limited there."""
    rows = requests[phases.within(requests["started_at"], spec.start, spec.end)]
    lost = rows[rows["unanswered"]]
    target_lost = lost[lost["hop"] == request_hops.PROXY_TO_SERVER]
    lab_lost = lost[lost["hop"].isin(lab_limits.LAB_HOPS)]
    mine = answers[phases.within(answers["sent_at"], spec.start, spec.end)]
    latencies = mine["latency"].to_numpy(dtype="float64")
    answer_p99 = nearest_rank(latencies, 0.99)  # NaN without answers
    answer_p50 = nearest_rank(latencies, 0.5)
    m = phases.phase_metrics(ctx, spec)
    total = math.nan if m is None or m.resume_p99_or_inf is None else float(m.resume_p99_or_inf)
    target = math.nan if m is None or m.resume_target_p99 is None else float(m.resume_target_p99)
    f = PhaseFigures(
        spec.name,
        spec.users,
        len(rows),
        len(mine),
        len(target_lost),
        len(lab_lost),
        answer_p99,
        total,
        target,
    )
    lim = lab_limits.limit(ctx, spec.start, spec.end, users=spec.users)
    parts = [x for x in lim.saturated if x.part != BOX] if lim is not None else []
    box = lim is not None and len(parts) < len(lim.saturated)
    if parts:
        assert lim is not None
        f.limited.append(lab_limits.LabLimit(tuple(parts), lim.cpus, lim.workers_needed, lim.basis).text())
    if request_hops.many(lab_lost, len(rows)):
        hops = ", ".join(
            f"{str(h).replace('_to_', ' → ')} {n:,}" for h, n in lab_lost["hop"].value_counts().items()
        )
        f.limited.append(
            f"{len(lab_lost):,} of {len(rows):,} requests lost in the lab's part of the chain ({hops})"
        )
    proxy_saturated = any(x.part == "mitmproxy" for x in parts)
    # A busy box slows every answer through the proxy alike; it does not leave some requests
    # without any answer while the target answers the others at once.
    chain_slow = proxy_saturated or (box and answer_p50 >= CHAIN_SLOW_S)
    share = len(target_lost) / len(rows) if len(rows) else 0.0
    if share > budget["unanswered_max_share"]:
        words = (
            f"{len(target_lost):,} of {len(rows):,} requests ({share:.2%}) went unanswered by the target "
            f"(budget {budget['unanswered_max_share']:.2%})"
        )
        if chain_slow:
            f.limited.append(
                words + " (the proxy's side was the lab's: mitmdump or the box saturated, answers slow)"
            )
        else:
            f.misses.append(("unanswered", words))
    if not math.isnan(answer_p99) and answer_p99 >= budget["answer_p99_s"]:
        words = (
            f"the target's time to answer has p99 {answer_p99:.3f} s over {len(mine):,} answers "
            f"(budget < {budget['answer_p99_s']:g} s)"
        )
        if proxy_saturated or box:
            f.limited.append(words + " (mitmdump or the box saturated: the proxy's timing is the lab's here)")
        else:
            f.misses.append(("answer_p99_s", words))
    if not math.isnan(total):
        verdict = judge_share(
            total, total if math.isnan(target) else target, ctx.budgets.resume_p99_s, share="target"
        )
        if verdict.failed:
            f.misses.append(("resume_p99_s", f"resume latency: {verdict.text}"))
        elif verdict.limited_by_lab:
            f.limited.append(f"resume latency: {verdict.text}")
    if box and not parts and not f.limited:
        # The box is shared with the target: a target that met its budgets on a busier box
        # than it needed met them (a miss the box could have caused is limited above).
        assert lim is not None
        busy = "; ".join(processes.describe(x, lim.cpus) for x in lim.saturated)
        f.notes.append(
            f"a busy box, shared with the target, limited nothing the target was judged on: {busy}"
        )
    return f


def answer_times(ctx: Context, requests: pd.DataFrame) -> pd.DataFrame:
    """sent_at, latency (s): each request the target answered, timed at the proxy, placed
    in its phase by when the client sent it (as the requests are counted)."""
    flows = conn_flows(ctx)
    ok = (flows["answered_by"] == "server") & flows["status"].notna()
    got = flows[ok & flows["t_request"].notna() & flows["t_head"].notna()]
    sent = requests[["client_id", "conn_id", "started_at"]].drop_duplicates(["client_id", "conn_id"])
    joined = got.merge(
        sent.astype({"conn_id": got["conn_id"].dtype}), on=["client_id", "conn_id"], how="left"
    )
    # A flow no client ledger row names (another caller) keeps the proxy's time.
    at = joined["started_at"].fillna(joined["t_request"])
    return pd.DataFrame({"sent_at": at, "latency": joined["t_head"] - joined["t_request"]})


def _judged(ctx: Context) -> tuple[list[PhaseSpec], str | None]:
    """The phases the rule judges, and the words on a ramp's knee (None without one)."""
    planned = phases.specs(ctx)
    specs = [p for p in planned if p.reached and p.seconds > 0]
    if len(capacity.steps(planned)) < 2:
        return specs, None  # one ramp, or none: no knee to find
    sec = capacity.section(ctx)
    if not isinstance(sec, dict) or sec.get("knee_users") is None:
        return specs, None
    past = sec.get("past_knee")
    if not sec.get("knee_passed"):
        return specs, f"every step of the ramp held, up to {sec['knee_users']:,} clients"
    knee = f"the knee is at {sec['knee_users']:,} clients (step {sec.get('knee_step')})"
    start = past.get("start") if isinstance(past, dict) else None
    if not isinstance(past, dict) or not isinstance(start, int | float):
        return specs, knee
    cut = float(start)
    return [
        p for p in specs if p.start < cut - 1e-6
    ], f"{knee}; the steps from {past.get('name')} on found it"


def check(ctx: Context) -> GateResult:
    tol = phases.tolerances(ctx.data.run)
    budget = {
        "unanswered_max_share": tol["unanswered_max_share"],
        "answer_p99_s": tol["answer_p99_s"],
        "resume_p99_s": ctx.budgets.resume_p99_s,
    }
    found = request_hops.findings(ctx)
    specs, knee = _judged(ctx)
    answers = answer_times(ctx, found.rows)
    figures = [measure(ctx, s, found.rows, answers, budget) for s in specs]
    sent = sum(f.sent for f in figures)
    answered = sum(f.answered for f in figures)
    misses = [(f, m, w) for f in figures for m, w in f.misses]
    limited = [(f, w) for f in figures for w in f.limited]
    evidence = [
        ctx.events_evidence(),
        Evidence("requests sent", 1, sent, sent >= 1, "in the phases judged, from the client ledgers"),
        Evidence(
            "requests the target answered, timed at the proxy",
            1,
            answered,
            answered >= 1,
            "the proxy's record (tap): when it had each request, and when the answer's head passed",
        ),
        Evidence(
            "lab within its limits",
            True,
            not limited,
            not limited,
            "; ".join(f"{f.name}: {w}" for f, w in limited[:3]),
        ),
        Evidence("hops known", True, found.tap_known, found.tap_known, "without the tap no loss has a hop"),
        *ctx.client_evidence(),
    ]
    witnesses = tuple(
        Witness(
            check=metric,
            explanation=f"phase {f.name} ({f.users if f.users is not None else '?'} clients): {words}",
            attribution=Attribution.SERVER,
            row={"phase": f.name, "metric": metric},
        )
        for f, metric, words in misses[: ctx.witness_limit]
    )
    verdict = decide(bool(misses), evidence)
    worst = max((f.target_unanswered / f.sent if f.sent else 0.0 for f in figures), default=0.0)
    head = (
        f"{sum(f.target_unanswered for f in figures):,} of {sent:,} requests unanswered by the target "
        f"(worst phase {worst:.2%}, budget {budget['unanswered_max_share']:.2%}); answer p99 "
        + ", ".join(f"{f.name} {_s(f.answer_p99_s)}" for f in figures)
        + f" (budget < {budget['answer_p99_s']:g} s)"
    )
    if misses:
        head += f"; missed: {'; '.join(f'{f.name}: {w}' for f, _, w in misses[:3])}"
    elif limited:
        head += f"; limited by the lab: {'; '.join(f'{f.name}: {w}' for f, w in limited[:2])}"
    notes = ((knee,) if knee else ()) + tuple(f"{f.name}: {n}" for f in figures for n in f.notes)
    measured: dict[str, JsonValue] = {
        "phases": [f.json() for f in figures],
        "knee": knee,
        "sent": sent,
        "answered": answered,
    }
    budget_out: dict[str, Scalar] = dict(budget)
    return GateResult(
        verdict=verdict,
        summary=head,
        budget=budget_out,
        measured=measured,
        evidence=tuple(evidence),
        violations=len(misses),
        witnesses=witnesses,
        attribution_counts={Attribution.SERVER.value: len(misses)} if misses else {},
        notes=notes,
    )


def _s(v: float) -> str:
    return "n/a" if math.isnan(v) else ("never" if math.isinf(v) else f"{v:.3f} s")


RULE = Rule(
    id="capacity",
    number=16,
    title="The target held the load (capacity checks)",
    blames=(Attribution.SERVER,),
    evidence=(
        "requests sent and answered per phase, timed at the proxy (tap), the client ledgers, and the lab "
        "within its limits"
    ),
    check=check,
    budget_key="unanswered_max_share",
    applies=applies,
)
