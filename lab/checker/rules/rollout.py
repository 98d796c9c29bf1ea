"""Gate 8 — rollout and rollback (scenarios whose phases set the reference server's
rollout knobs: `resumable_fraction`, `rollback`).

The rollout of resumable streams goes in steps: a share of sessions (1 %, 10 %, 50 %,
100 %) gets event IDs while every session writes the server's stream ledger (its
*shadow* ledger); exposure grows only while no event crosses streams. A rollback stops
resumption for new streams but keeps the old generation's cursor index until its
sessions expire. The knobs' times are those `lab run` logged when the admin control
answered (`phases.jsonl`, `knobs` records); `R` is the rollback's.

Five named checks, each a count of violations with witnesses and its own evidence:

1. `cross_stream` — in every phase from the first knob on, 0 events on a stream they do
   not belong to: gate 1's offending sends and receipts, by their time, plus the
   **shadow comparison**: every event the tap saw the server send (with or without an
   event ID) must be in the server's own stream ledger (`events_sent`) on the stream its
   connection carried (`crossed`: the ledger has that message on another stream, or in
   another session, only). Evidence: each rollout step had events compared.
2. `resumable_share` — per phase that sets `resumable_fraction` (before any rollback):
   of the sessions the server created once the knob was in force (from 1 s after it was
   sent; server ledger `sessions.created_at`, `resumable`), the share resumable is the knob within sampling
   error: |share - f| <= 3 sqrt(f (1 - f) / n) + 1/n. Evidence: n >= min_rollout_sessions.
3. `old_cursors_resume` — after R (from 1 s after it: a request answered sooner may have
   been served before the knob), every resumption (tap flow `stream` resume, answered
   by the server) whose cursor event the server first sent before R resumed (2xx), or
   got 404 because its session was gone; a refusal of the cursor (400, 409, 410 or 422)
   is a violation, except verdicts that say the stream's own events aged out
   (`unknown_stream`, `evicted`: noted); load shedding (429, 503) is noted, not judged. Evidence: >= 1 old cursor resumed after R.
4. `new_streams_not_resumable` — every stream opened after R (a POST or standalone GET
   whose head passed >= 1 s after R) carries no event ID (tap `sent`, priming included).
   Evidence: >= 1 such stream with an event.
5. `expired_cursors_rejected` — a resumption carrying a session the server ledger shows
   ended (expired, deleted, evicted) before it gets the documented rejection: 404 (the
   session is gone; the client must initialize anew). A 2xx is a violation. Evidence:
   >= 1 such resumption of a session created before R.

Needs the proxy tap, the server ledger and phases.jsonl; without them it is
inconclusive. The report's `rollout` section has the per-phase table (`section`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of, short, tap_ref
from lab.checker.inputs.load import MissingInput
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.cross_stream import check as cross_stream_check
from lab.checker.timeline import capacity, phases
from lab.checker.timeline.rollout import (
    FILE,
    NEW_STREAM_SLACK_S,
    ROLLOUT_KNOBS,
    Step,
    knob_log,
    new_streams,
    resumptions,
    rollback_time,
    rollout_steps,
    server_tables,
    shadow_comparison,
    within,
)
from lab.checker.truth.wire import server_sends

CURSOR_REFUSALS = (400, 409, 410, 422)
"""The statuses a server refuses a cursor with (the reference server's `--cursor-reject-status`)."""
AGED_OUT = ("unknown_stream", "evicted")
"""Cursor verdicts that say the stream's own events are gone (retention), not the rollback."""
CHECK_NAMES = (
    "cross_stream",
    "resumable_share",
    "old_cursors_resume",
    "new_streams_not_resumable",
    "expired_cursors_rejected",
)


def applies(ctx: Context) -> bool:
    return any(any(k in p.knobs for k in ROLLOUT_KNOBS) for p in phases.specs(ctx))


def _witness_flow(check: str, text: str, row: pd.Series, names: list[str]) -> Witness:
    return Witness(check, text, Attribution.SERVER, row_of(row, names), tuple(tap_ref(row)))


@dataclass(slots=True)
class Outcome:
    name: str
    violations: int = 0
    witnesses: list[Witness] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: dict[str, JsonValue] = field(default_factory=dict)


def gate1_times(ctx: Context) -> list[tuple[float, Witness | None]]:
    """Gate 1's violations with their times: every offending server send (with its
    witness for the first few), and the clients' offending receipts by their witnesses."""

    def make() -> list[tuple[float, Witness | None]]:
        first = Context(ctx.data, ctx.budgets, 20, ctx._cache)
        result = cross_stream_check(first)
        if not result.violations:
            return []
        server = [w for w in result.witnesses if w.attribution is Attribution.SERVER]
        shown = {(w.row.get("flow"), w.row.get("index")): w for w in server}
        out: list[tuple[float, Witness | None]] = []
        sends = server_sends(ctx)
        for t, flow, index in zip(sends["t"], sends["flow"], sends["index"], strict=True):
            out.append((float(t), shown.get((flow, index))))
        if result.attribution_counts.get("client"):
            full = Context(ctx.data, ctx.budgets, capacity.MAX_WITNESSES, ctx._cache)
            for w in cross_stream_check(full).witnesses:
                t = w.row.get("accepted_at")
                if w.attribution is not Attribution.SERVER and isinstance(t, int | float):
                    out.append((float(t), w))
        return out

    return ctx.cached("rollout_gate1", make)


def check_cross_stream(ctx: Context, steps: list[Step]) -> Outcome:
    out = Outcome("cross_stream")
    shadow = shadow_comparison(ctx)
    g1 = gate1_times(ctx)
    origin = ctx.origin
    for st in steps:
        a, b = st.spec.start, st.spec.end
        inside = shadow[within(shadow["t"], a, b)]
        crossed = inside[inside["shadow"] == "crossed"]
        unrecorded = int((inside["shadow"] == "unrecorded").sum())
        gate1 = [w for t, w in g1 if a <= t < b]
        st.data.update(
            shadow_events=len(inside),
            shadow_matched=int((inside["shadow"] == "match").sum()),
            shadow_crossed=len(crossed),
            shadow_unrecorded=unrecorded,
            gate1_violations=len(gate1),
        )
        count = len(crossed) + len(gate1)
        if count:
            out.violations += count
            for _, r in crossed.head(2).iterrows():
                text = (
                    f"phase {st.spec.name!r}: the server sent message {short(r['digest'])} on stream "
                    f"{r['on_logical']} {at(r['t'], origin)}, but its own stream ledger has that message only "
                    "on another stream (shadow comparison)"
                )
                out.witnesses.append(
                    _witness_flow(
                        "cross_stream", text, r, ["session", "flow", "event_id", "digest", "on_logical", "t"]
                    )
                )
            for w in [w for w in gate1 if w is not None][:2]:
                out.witnesses.append(
                    Witness(
                        "cross_stream",
                        f"phase {st.spec.name!r}: {w.explanation}",
                        w.attribution,
                        w.row,
                        w.refs,
                    )
                )
        if unrecorded:
            out.notes.append(
                f"phase {st.spec.name!r}: {unrecorded} event(s) the proxy saw the server send are not in its "
                "stream ledger (a ledger that stopped writing, or events of another server)"
            )
        if st.sets_fraction and not st.after_rollback:
            out.evidence.append(
                Evidence(
                    f"events compared in {st.spec.name}",
                    1,
                    len(inside),
                    len(inside) >= 1,
                    "events the proxy saw the server send, looked up in the server's shadow (stream) ledger",
                )
            )
    out.measured = {
        "shadow_events": len(shadow),
        "shadow_crossed": int((shadow["shadow"] == "crossed").sum()),
        "shadow_unrecorded": int((shadow["shadow"] == "unrecorded").sum()),
        "shadow_unmapped": int((shadow["shadow"] == "unmapped").sum()),
        "gate1_violations": len(g1),
    }
    return out


def share_band(f: float, n: int) -> float:
    """The allowed |share - f| for n sessions: 3 binomial standard errors + 1/n."""
    return 3.0 * math.sqrt(f * (1.0 - f) / n) + 1.0 / n if n else math.inf


def check_resumable_share(ctx: Context, steps: list[Step], min_sessions: int) -> Outcome:
    out = Outcome("resumable_share")
    sessions = server_tables(ctx)["sessions"]
    created = pd.to_numeric(sessions["created_at"], errors="coerce")
    resumable = pd.to_numeric(sessions["resumable"], errors="coerce").fillna(0).astype(int)
    need = max(1, min_sessions)
    origin = ctx.origin
    for st in steps:
        if not st.sets_fraction or st.after_rollback or st.fraction is None:
            continue
        if st.knob_t is None:
            out.evidence.append(
                Evidence(f"knob applied in {st.spec.name}", True, False, False, "phases.jsonl")
            )
            continue
        # A session created within a second of the knob may have been made before the server
        # applied it (the knob's time is when `lab run` sent it): left out, as resumptions
        # are in `old_cursors_resume`. Counted in, they biased a short phase's share.
        mask = (created >= st.knob_t + NEW_STREAM_SLACK_S) & (created < st.spec.end)
        n, k = int(mask.sum()), int(resumable[mask].sum())
        f = st.fraction
        share = k / n if n else None
        band = share_band(f, n)
        st.data.update(sessions_created=n, resumable_sessions=k, share=share, expected=f, band=round(band, 4))
        out.evidence.append(Evidence(f"sessions created in {st.spec.name}", need, n, n >= need))
        if share is not None and abs(share - f) > band:
            out.violations += 1
            text = (
                f"phase {st.spec.name!r} (sessions created T+{st.knob_t - (origin or 0):.0f} s..): {k} of {n} "
                f"sessions resumable ({share:.1%}), the knob says {f:.1%} (allowed ±{band:.1%})"
            )
            out.witnesses.append(
                Witness(
                    "resumable_share",
                    text,
                    Attribution.SERVER,
                    {"phase": st.spec.name, "sessions": n, "resumable": k, "share": share, "expected": f},
                )
            )
    return out


def check_old_cursors(ctx: Context, rollback_t: float) -> Outcome:
    out = Outcome("old_cursors_resume")
    res = resumptions(ctx)
    # A resumption answered within a second of the knob may have been served before it.
    after = pd.to_numeric(res["t"], errors="coerce") >= rollback_t + NEW_STREAM_SLACK_S
    old = res[after & (res["cursor_first_t"] < rollback_t)]
    ok = old[(old["status"] >= 200) & (old["status"] < 300)]
    gone = old[old["status"] == 404]
    refused = old[old["status"].isin(CURSOR_REFUSALS)]
    other = old[~old["status"].isin(CURSOR_REFUSALS) & (old["status"] >= 400) & (old["status"] != 404)]
    if len(other):
        codes = ", ".join(str(int(c)) for c in sorted(set(other["status"].dropna())))
        out.notes.append(
            f"{len(other)} old-cursor resumption(s) answered {codes} (not a cursor refusal): not judged"
        )
    aged = refused[refused["cursor_verdict"].isin(AGED_OUT)]
    bad = refused[~refused["cursor_verdict"].isin(AGED_OUT)]
    out.violations = len(bad)
    for _, r in bad.head(5).iterrows():
        text = (
            f"{at(r['t'], ctx.origin)}, after the rollback, a resumption of a stream opened before it "
            f"(cursor {short(r['last_event_id_out'], 40)}, first sent {at(r['cursor_first_t'], ctx.origin)}) "
            f"was refused with {int(r['status'])} (verdict {r['cursor_verdict']}) although its session "
            f"{'lived on' if pd.isna(r['session_ended_at']) else 'had not yet ended'}: the old cursor index was not kept"
        )
        out.witnesses.append(
            _witness_flow(
                "old_cursors_resume",
                text,
                r,
                [
                    "flow",
                    "conn",
                    "session",
                    "last_event_id_out",
                    "status",
                    "cursor_verdict",
                    "cursor_first_t",
                    "t",
                ],
            )
        )
    if len(aged):
        out.notes.append(
            f"{len(aged)} old cursor(s) refused because their stream's events had aged out "
            f"({', '.join(sorted(set(aged['cursor_verdict'].astype(str))))}): not the rollback's doing"
        )
    out.evidence.append(Evidence("old cursors resumed after the rollback", 1, len(ok), len(ok) >= 1))
    out.measured = {
        "old_cursor_resumptions": len(old),
        "resumed": len(ok),
        "session_gone_404": len(gone),
        "refused": len(bad),
    }
    return out


def check_new_streams(ctx: Context, rollback_t: float) -> Outcome:
    out = Outcome("new_streams_not_resumable")
    new = new_streams(ctx, rollback_t)
    with_events = new[new["events"] > 0]
    bad = with_events[with_events["with_ids"] > 0]
    out.violations = len(bad)
    for _, r in bad.head(5).iterrows():
        text = (
            f"a {r['method']} stream opened {at(r['t'], ctx.origin)}, after the rollback, carried "
            f"{int(r['with_ids'])} event(s) with an ID (first {short(r['first_id'], 40)}): new streams must not be resumable"
        )
        out.witnesses.append(
            _witness_flow(
                "new_streams_not_resumable", text, r, ["flow", "conn", "session", "method", "t", "with_ids"]
            )
        )
    out.evidence.append(
        Evidence("streams opened after the rollback", 1, len(with_events), len(with_events) >= 1)
    )
    out.measured = {"new_streams": len(with_events), "new_streams_with_ids": len(bad)}
    return out


def check_expired(ctx: Context, rollback_t: float) -> Outcome:
    out = Outcome("expired_cursors_rejected")
    res = resumptions(ctx)
    ended = pd.to_numeric(res["session_ended_at"], errors="coerce")
    late = res[ended.notna() & (pd.to_numeric(res["t"], errors="coerce") > ended + 0.5)]
    old_sessions = late[pd.to_numeric(late["session_created_at"], errors="coerce") < rollback_t]
    bad = late[(late["status"] >= 200) & (late["status"] < 300)]
    odd = late[(late["status"] != 404) & ~((late["status"] >= 200) & (late["status"] < 300))]
    out.violations = len(bad)
    for _, r in bad.head(5).iterrows():
        text = (
            f"{at(r['t'], ctx.origin)} a cursor of session {short(r['session'], 24)}, which the server ended "
            f"({r['session_end_reason']}) {at(r['session_ended_at'], ctx.origin)}, was resumed ({int(r['status'])}): "
            "the documented rejection is 404"
        )
        out.witnesses.append(
            _witness_flow(
                "expired_cursors_rejected",
                text,
                r,
                ["flow", "conn", "session", "last_event_id_out", "status", "session_ended_at", "t"],
            )
        )
    if len(odd):
        codes = ", ".join(str(int(c)) for c in sorted(set(odd["status"].dropna())))
        out.notes.append(f"{len(odd)} resumption(s) of an ended session were refused with {codes}, not 404")
    sessions = server_tables(ctx)["sessions"]
    expired_old = sessions[
        (pd.to_numeric(sessions["created_at"], errors="coerce") < rollback_t)
        & sessions["end_reason"].isin(["expired"])
    ]
    out.evidence.append(Evidence("old sessions expired", 1, len(expired_old), len(expired_old) >= 1))
    out.evidence.append(
        Evidence(
            "cursors of expired old sessions presented",
            1,
            len(old_sessions),
            len(old_sessions) >= 1,
            "resumptions carrying a session created before the rollback, after it ended",
        )
    )
    out.measured = {
        "after_session_end": len(late),
        "of_old_sessions": len(old_sessions),
        "rejected_404": int((late["status"] == 404).sum()),
        "resumed": len(bad),
        "old_sessions_expired": len(expired_old),
    }
    return out


# ----------------------------------------------------------------------------- the gate


def outcomes(ctx: Context) -> tuple[list[Step], list[Outcome], list[Evidence]]:
    def make() -> tuple[list[Step], list[Outcome], list[Evidence]]:
        steps = rollout_steps(ctx)
        knobs, why = knob_log(ctx)
        evidence = [Evidence("knob log", FILE, why or "ok", why is None, why or "")]
        failed = [k for k in knobs if not k.ok]
        planned = [s for s in steps if any(k in s.spec.knobs for k in ROLLOUT_KNOBS) and s.spec.reached]
        applied = sum(1 for s in planned if s.knob_t is not None)
        evidence.append(
            Evidence(
                "knobs applied",
                len(planned),
                applied,
                applied == len(planned),
                "; ".join(f"{k.phase}: {k.error}" for k in failed)
                or "the admin control took every phase's knobs",
            )
        )
        tol = phases.tolerances(ctx.data.run)
        results = [
            check_cross_stream(ctx, steps),
            check_resumable_share(ctx, steps, int(tol["min_rollout_sessions"])),
        ]
        rb_t = rollback_time(steps)
        if any(s.is_rollback for s in steps):
            if rb_t is None:
                evidence.append(
                    Evidence("rollback applied", True, False, False, "no successful rollback knob")
                )
            else:
                results += [
                    check_old_cursors(ctx, rb_t),
                    check_new_streams(ctx, rb_t),
                    check_expired(ctx, rb_t),
                ]
        return steps, results, evidence

    return ctx.cached("rollout_outcomes", make)


def check(ctx: Context) -> GateResult:
    steps, results, evidence = outcomes(ctx)
    all_evidence = [ctx.events_evidence(), *evidence, *(e for r in results for e in r.evidence)]
    violations = sum(r.violations for r in results)
    witnesses = [w for r in results for w in r.witnesses]
    by_check = {r.name: r.violations for r in results}
    summary = (
        "; ".join(f"{name} {n}" for name, n in by_check.items())
        + f" (violations; {len(steps)} phases judged)"
    )
    return GateResult(
        verdict=decide(violations > 0, all_evidence),
        summary=summary,
        budget={
            "cross_stream_max": 0,
            "min_rollout_sessions": int(phases.tolerances(ctx.data.run)["min_rollout_sessions"]),
        },
        measured={"checks": {r.name: {"violations": r.violations, **r.measured} for r in results}},
        evidence=tuple(all_evidence),
        violations=violations,
        witnesses=tuple(witnesses[: max(ctx.witness_limit, len(results))]),
        attribution_counts={"server": violations} if violations else {},
        notes=tuple(n for r in results for n in r.notes),
    )


def section(ctx: Context) -> dict[str, JsonValue] | None:
    """report.json `rollout`: per phase, the knobs in force and what each check saw."""
    if not applies(ctx):
        return None
    try:
        steps, results, _ = outcomes(ctx)
    except MissingInput as e:
        return {"phases": [], "checks": [], "error": str(e)}
    origin = ctx.origin or 0.0
    rows: list[dict[str, JsonValue]] = []
    for st in steps:
        rows.append(
            {
                "phase": st.spec.name,
                "kind": st.spec.kind,
                "start_s": round(st.spec.start - origin, 3),
                "end_s": round(st.spec.end - origin, 3),
                "resumable_fraction": st.fraction,
                "rollback": st.after_rollback,
                "knob_applied_s": None if st.knob_t is None else round(st.knob_t - origin, 3),
                **st.data,
            }
        )
    checks: list[JsonValue] = [
        {
            "check": r.name,
            "violations": r.violations,
            "evidence": [
                {"name": e.name, "required": e.required, "observed": e.observed, "ok": e.ok}
                for e in r.evidence
            ],
            "witnesses": [w.explanation for w in r.witnesses[:3]],
            "notes": list(r.notes),
            "measured": r.measured,
        }
        for r in results
    ]
    return {"phases": list(rows), "checks": checks}


RULE = Rule(
    id="rollout",
    number=8,
    title="Rollout and rollback keep every stream's events apart",
    blames=(Attribution.SERVER,),
    evidence="phases that set the server's rollout knobs, and the knobs' log",
    check=check,
    check_under_test=check,
    applies=applies,
)
