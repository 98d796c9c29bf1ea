"""Whose latency, for a client under test: each recovery of gate 5
(lab.checker.truth.client_delivery `recoveries`) split into the client's, the lab's and
the target's share, from the wire and the application log only (the lab did not write
this client: it has no ledger of it).

A recovery runs from the loss (`lost_at`: the lost flow's end, seen by the proxy) to the
application's next message of the call (`recovered_at`, its log). Between them the client
makes attempts (lab.checker.truth.client_wire `attempts`: resumptions, reopened streams,
re-handshakes, resent calls), each answering the loss of the flow before it:

    wait      that loss -> the proxy has the attempt (`t_req`): the part the client was
              advised to wait (`advised_s`: SSE `retry`, `Retry-After`) is the
              **target's** when the target gave the advice, the **lab's** when a storm
              the proxy answered gave it; the rest is the **client's**. (The request's
              way from the client to the proxy, through the nemesis, is in the client's
              share: the lab cannot time when a client it did not write sent it. On a
              box that is not saturated that way is a few milliseconds, lab.checker.health
              `lab_hops` for the lab's own clients.)
    delivery  the proxy forwards the message that ended the recovery -> the application
              logs it: the **lab's** (mitmdump, the nemesis; and the client's own parsing,
              which the lab cannot tell apart, counted in the client's favour).

Everything else (the target's answer to each attempt, from the proxy having it to the
next loss or to the message that ended the recovery) is the **target's**, except the
answers a storm of the proxy gave (the **lab's**). The shares add up to the latency.

A recovery that never ended is infinite in one share: the **client's** when it made no
attempt after the last loss, or its last attempt was answered 404 (the session was gone:
the client must start a new one) or by a storm of the proxy, or the target did send on
the last attempt's flow and the proxy forwarded it (the application never got it); the
**target's** when the target answered the last attempt with another error, or with 200
and no event at all. A recovery without a message forwarded by the proxy (the tap
cannot place its end) is not split (NaN shares): gate 5 judges it on its whole latency.

Seconds throughout; gate 5 for a client under test (lab.checker.rules.resume_sut)
judges the client on its share through lab.checker.truth.shares `judge_share`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.truth import client_wire
from lab.checker.truth.client_delivery import call_flows, deliveries, recoveries
from lab.checker.truth.shares import SESSION_GONE, SHARES, SLACK_S

__all__ = ["SHARES", "sut_recovery_shares"]


def sut_recovery_shares(ctx: Context) -> pd.DataFrame:
    """gate 5's recoveries of a client under test (all of them, censored too, in the same
    order), with `client_s`, `lab_s` and `target_s` (inf: never ended, on whose side; NaN:
    not split). Computed once per run."""
    return ctx.cached("sut_recovery_shares", lambda: _shares(ctx))


def _shares(ctx: Context) -> pd.DataFrame:
    rec = recoveries(ctx)
    out = rec.copy()
    for share in SHARES:
        out[f"{share}_s"] = np.nan
    if not len(out):
        return out
    flows = client_wire.flows(ctx)
    by_flow = {str(r["flow"]): r for r in client_wire.records(flows.drop_duplicates("flow"))}
    attempts = client_wire.records(client_wire.attempts(ctx).sort_values("t_req", kind="stable"))
    of_client: dict[object, list[dict[str, Any]]] = {}
    for a in attempts:
        of_client.setdefault(a["client_id"], []).append(a)
    forwarded_at = _recovering_forward_times(ctx, flows)
    carried = _flows_with_messages(ctx)
    rows = [
        _split_one(r, of_client.get(r["client_id"], []), by_flow, forwarded_at, carried)
        for r in client_wire.records(out)
    ]
    split = pd.DataFrame(rows, columns=list(SHARES), index=out.index)
    for share in SHARES:
        out[f"{share}_s"] = split[share].astype("float64")
    return out


def _recovering_forward_times(ctx: Context, flows: pd.DataFrame) -> dict[tuple[object, float], float]:
    """(call, delivery time) -> when the proxy forwarded the message the application got
    then, for every delivery of a message the server sent on a call's flows."""
    chained = call_flows(flows)
    call_of = dict(zip(chained["flow"].tolist(), chained["call"].tolist(), strict=True))
    dl = deliveries(ctx)
    if not len(dl):
        return {}
    owner = dl["src_flow"].map(call_of)
    known = owner.notna() & pd.to_numeric(dl["fwd_t"], errors="coerce").notna()
    out: dict[tuple[object, float], float] = {}
    for call, t, fwd in zip(
        owner[known].tolist(),
        dl.loc[known, "t"].astype("float64").tolist(),
        dl.loc[known, "fwd_t"].astype("float64").tolist(),
        strict=True,
    ):
        out.setdefault((call, t), fwd)
    return out


def _flows_with_messages(ctx: Context) -> set[object]:
    """Flows on which the proxy forwarded an event with a message (not a priming event)."""
    sent = ctx.data.tap_records("sent")
    fwd = ctx.data.tap_records("forwarded")
    if not len(sent) or not len(fwd):
        return set()
    messages = sent[sent["has_data"].fillna(False).astype(bool) & ~sent["priming"].fillna(False).astype(bool)]
    passed = set(zip(fwd["flow"].tolist(), fwd["index"].tolist(), strict=True))
    return {
        f
        for f, i in zip(messages["flow"].tolist(), messages["index"].tolist(), strict=True)
        if (f, i) in passed
    }


def _split_one(
    r: dict[str, Any],
    attempts: list[dict[str, Any]],
    by_flow: dict[str, dict[str, Any]],
    forwarded_at: dict[tuple[object, float], float],
    carried: set[object],
) -> tuple[float, float, float]:
    """(client, lab, target) of one recovery (see the module docstring)."""
    lost = float(r["lost_at"])
    end = _number(r["recovered_at"], math.inf)
    mine = [
        a
        for a in attempts
        if lost - SLACK_S <= a["t_req"] <= end + SLACK_S
        and _number(a["lost_at"], -math.inf) >= lost - SLACK_S
    ]
    client = lab = 0.0
    for a in mine:
        waited = max(0.0, float(a["waited_s"]))
        advised = min(waited, _number(a["advised_s"], 0.0))
        previous = by_flow.get(str(a["previous"]))
        client += waited - advised
        if previous is not None and previous["answered_by"] == "proxy":
            lab += advised + _answer_span(previous)
    if math.isinf(end):
        return _never(mine, by_flow, carried, client, lab)
    fwd = forwarded_at.get((r["call"], end))
    if fwd is None:
        return (math.nan, math.nan, math.nan)
    lab += max(0.0, end - fwd)
    target = max(0.0, end - lost - client - lab)
    return (client, lab, target)


def _answer_span(flow: dict[str, Any]) -> float:
    """How long the proxy's own answer to an attempt took (its request to its end)."""
    stop = _number(flow["end_t"], _number(flow["t"], flow["t_req"]))
    return max(0.0, stop - float(flow["t_req"]))


def _never(
    mine: list[dict[str, Any]],
    by_flow: dict[str, dict[str, Any]],
    carried: set[object],
    client: float,
    lab: float,
) -> tuple[float, float, float]:
    row = by_flow.get(str(mine[-1]["flow"])) if mine else None
    if row is None:
        return (math.inf, lab, 0.0)  # no attempt after the loss: the client never tried again
    status = _number(row["status"], math.nan)
    if row["answered_by"] == "proxy" or math.isnan(status) or status == SESSION_GONE:
        return (math.inf, lab, 0.0)  # the client must try again (or start a new session)
    if status >= 400:
        return (client, lab, math.inf)  # the target refused the recovery
    if row["flow"] in carried:
        return (math.inf, lab, 0.0)  # the target's events reached the client, not its application
    return (client, lab, math.inf)  # answered 200, and nothing came


def _number(value: object, default: float) -> float:
    """`value` as a float; `default` for a missing one (None, NaN, NA)."""
    if isinstance(value, int | float | np.floating | np.integer) and not math.isnan(float(value)):
        return float(value)
    return default
