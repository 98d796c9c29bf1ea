"""What gate 8 (`lab.checker.rules.rollout`) reads: the knob log `lab run` wrote
(`phases.jsonl`), the rollout steps and the rollback time, the shadow-ledger comparison,
and the tap's resumptions and new streams, joined once per run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context, text_key
from lab.checker.inputs.jsonl import LedgerError, read_jsonl
from lab.checker.inputs.load import MissingInput
from lab.checker.inputs.phase_specs import PhaseSpec
from lab.checker.model import JsonValue
from lab.checker.timeline import phases
from lab.checker.truth.streams import stream_truth

FILE = "phases.jsonl"
SCHEMA = "mcpLabPhases.v1"
RECORDS: dict[str, tuple[str, ...]] = {
    "timeline": ("t",),
    "knobs": ("t", "phase", "knobs"),
    "probe": ("t", "action"),
    "knee": ("t", "step"),
}
ROLLOUT_KNOBS = ("resumable_fraction", "rollback")
NEW_STREAM_SLACK_S = 1.0
"""Requests answered within this long after the rollback knob may have been served before it."""


@dataclass(frozen=True, slots=True)
class Knob:
    phase: str
    t: float
    knobs: Mapping[str, Any]
    ok: bool
    error: str | None
    at_start: bool = False
    """The first phase's knobs, given to the server as its settings (`via` settings): in
    force from the server's start, whenever `lab run` wrote the record."""


def knob_log(ctx: Context) -> tuple[list[Knob], str | None]:
    """(the knob changes phases.jsonl records, why it could not be read or None)."""

    def read() -> tuple[list[Knob], str | None]:
        path = ctx.data.run_dir / FILE
        if not path.is_file():
            return [], f"{FILE} is missing"
        try:
            frames = read_jsonl(path, FILE, RECORDS, SCHEMA)
        except LedgerError as e:
            return [], f"{FILE}: {e.message}"
        out = []
        for r in frames.frames["knobs"].to_dict("records"):
            status = r.get("status")
            ok = r.get("via") == "settings" or status == 200
            raw = r.get("knobs")
            knobs: dict[str, Any] = raw if isinstance(raw, dict) else {}
            out.append(
                Knob(str(r["phase"]), float(r["t"]), knobs, ok, r.get("error"), r.get("via") == "settings")
            )
        return out, None

    return ctx.cached("rollout_knobs", read)


@dataclass(slots=True)
class Step:
    """A phase from the first rollout knob on, with the knobs in force in it."""

    spec: PhaseSpec
    fraction: float | None
    """The resumable fraction in force (None: not set by any phase so far)."""
    sets_fraction: bool
    after_rollback: bool
    is_rollback: bool
    knob_t: float | None
    """When this phase's own knobs took effect (None: it sets none, or it failed)."""
    data: dict[str, JsonValue] = field(default_factory=dict)


def rollout_steps(ctx: Context) -> list[Step]:
    specs = phases.specs(ctx)
    knobs, _ = knob_log(ctx)
    applied = {k.phase: k for k in knobs if k.ok}
    first = next((i for i, p in enumerate(specs) if any(k in p.knobs for k in ROLLOUT_KNOBS)), None)
    if first is None:
        return []
    out = []
    fraction: float | None = None
    rolled = False
    for p in specs[: first + 1]:
        if "resumable_fraction" in p.knobs:
            fraction = float(p.knobs["resumable_fraction"])
    for i, p in enumerate(specs[first:], start=first):
        sets = "resumable_fraction" in p.knobs
        if sets and i > first:
            fraction = float(p.knobs["resumable_fraction"])
        is_rb = "rollback" in p.knobs and not rolled
        knob = applied.get(p.name)
        # The server started with the first phase's knobs: they hold from the phase's start
        # (a busy box wrote their record seconds late, and a share judged from then on had
        # no sessions left to count).
        t = None if knob is None or not p.knobs else (min(knob.t, p.start) if knob.at_start else knob.t)
        out.append(Step(p, fraction, sets, rolled or is_rb, is_rb, t))
        rolled = rolled or is_rb
    return out


def rollback_time(steps: list[Step]) -> float | None:
    rb = next((s for s in steps if s.is_rollback), None)
    return None if rb is None else rb.knob_t


def tap_tables(ctx: Context) -> dict[str, pd.DataFrame]:
    if ctx.data.tap is None:
        raise MissingInput(
            f"the rollout is judged from the wire: no proxy record ({ctx.data.why_absent('tap')})"
        )
    return ctx.data.tap


def server_tables(ctx: Context) -> dict[str, pd.DataFrame]:
    if ctx.data.server is None:
        raise MissingInput(
            f"the rollout needs the reference server's ledger (its shadow ledger and sessions): "
            f"{ctx.data.why_absent('server')}"
        )
    return ctx.data.server


# ----------------------------------------------------------------------------- checks


def shadow_comparison(ctx: Context) -> pd.DataFrame:
    """Every event with a message the tap saw the server send, with `shadow`: `match`
    (the server's stream ledger has it on the stream its connection carried), `crossed`
    (the ledger has that message only on another stream or in another session),
    `unrecorded` (nowhere in the ledger) or `unmapped` (the connection's stream is not
    in the ledger)."""

    def make() -> pd.DataFrame:
        server = server_tables(ctx)
        truth = stream_truth(ctx)
        sent = truth.sent
        sent = sent[
            sent["flow"].notna() & sent["has_data"].astype(bool) & ~sent["priming"].astype(bool)
        ].copy()
        ev = server["events_sent"]
        on_stream = set(text_key(ev["session"], ev["stream_id"], ev["digest"]).tolist())
        anywhere = set(ev["digest"].astype(str).tolist())
        mapped = sent["on_logical"].astype(str).str.contains("|", regex=False) & ~sent["on_logical"].astype(
            str
        ).str.startswith(("flow:", "unknown:"))
        key = sent["on_logical"].astype(str) + "|" + sent["digest"].astype(str)
        status = np.where(
            ~mapped.to_numpy(),
            "unmapped",
            np.where(
                [k in on_stream for k in key.tolist()],
                "match",
                np.where(
                    [d in anywhere for d in sent["digest"].astype(str).tolist()], "crossed", "unrecorded"
                ),
            ),
        )
        sent["shadow"] = status
        return sent

    return ctx.cached("rollout_shadow", make)


def within(times: pd.Series, start: float, end: float) -> pd.Series:
    t = pd.to_numeric(times, errors="coerce")
    return (t >= start) & (t < end)


def resumptions(ctx: Context) -> pd.DataFrame:
    """Resumption flows the server answered, with the time their cursor event was first
    sent (`cursor_first_t`), the server's `cursor_verdict`, and the session's end."""

    def make() -> pd.DataFrame:
        tap = tap_tables(ctx)
        server = server_tables(ctx)
        flows = tap["flow"].drop_duplicates("flow", keep="last")
        answered = flows["answered_by"].astype(str) == "server" if "answered_by" in flows else True
        res = flows[
            (flows["method"] == "GET")
            & flows["last_event_id_out"].notna()
            & answered
            & flows["status"].notna()
        ].copy()
        sent = tap["sent"]
        first = sent[sent["event_id"].notna()].groupby(["session", "event_id"], sort=False)["t"].min()
        res["cursor_first_t"] = [
            first.get((s, c), math.nan) for s, c in zip(res["session"], res["last_event_id_out"], strict=True)
        ]
        req = server["requests"]
        verdicts = (
            req[req["conn"].notna()].drop_duplicates("conn", keep="last").set_index("conn")["cursor_verdict"]
        )
        res["cursor_verdict"] = res["conn"].map(verdicts)
        sess = server["sessions"].drop_duplicates("session", keep="last").set_index("session")
        res["session_created_at"] = res["session"].map(sess["created_at"])
        res["session_ended_at"] = res["session"].map(sess["ended_at"])
        res["session_end_reason"] = res["session"].map(sess["end_reason"])
        res["status"] = pd.to_numeric(res["status"], errors="coerce")
        return res

    return ctx.cached("rollout_resumes", make)


def new_streams(ctx: Context, rollback_t: float) -> pd.DataFrame:
    """Streams opened after the rollback: flows (POST, or GET without a cursor) the
    server answered 2xx, whose head passed >= 1 s after it, with `with_ids` (how many
    of their events carried an event ID) and `events`."""
    tap = tap_tables(ctx)
    flows = tap["flow"].drop_duplicates("flow", keep="last")
    status = pd.to_numeric(flows["status"], errors="coerce")
    opened = flows[
        ((flows["method"] == "POST") | ((flows["method"] == "GET") & flows["last_event_id_out"].isna()))
        & (status >= 200)
        & (status < 300)
        & (pd.to_numeric(flows["t"], errors="coerce") >= rollback_t + NEW_STREAM_SLACK_S)
    ].copy()
    sent = tap["sent"]
    on = sent[sent["flow"].isin(set(opened["flow"]))]
    opened["events"] = opened["flow"].map(on.groupby("flow").size()).fillna(0).astype(int)
    opened["with_ids"] = (
        opened["flow"].map(on[on["event_id"].notna()].groupby("flow").size()).fillna(0).astype(int)
    )
    first_id = on[on["event_id"].notna()].drop_duplicates("flow").set_index("flow")
    opened["first_id"] = opened["flow"].map(first_id["event_id"]) if len(first_id) else None
    return opened
