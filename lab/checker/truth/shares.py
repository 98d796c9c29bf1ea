"""Whose latency: each recovery of the lab's clients split into the client's, the lab's and
the target's share, each segment timed by the clock that sees it and joined by the flow
key the lab already has (`x-lab-conn` = client_id:conn_id on the tap's flow records).

A recovery runs from the loss the client detected (`recoveries.lost_at`) to the next
event it accepted on the resumed stream (`recovered_at`), through one or more attempts
(`reconnects` rows of that client, on that stream, or re-handshakes, sent inside it).
Each attempt is

    wait      the loss (for a later attempt: the end of the one before) -> the attempt
              leaves the client (`sent_at`): the part it was advised to wait (SSE `retry`,
              `Retry-After`: `advised_delay`) is the **target's** when the target gave the
              advice (the stream's `retry`, the target's answer to the attempt before), the
              **lab's** when a storm the proxy answered gave it; the rest is the client's
    request   the attempt leaves the client -> the proxy sees it (`t_request`): the **lab's**
              (the worker's loop, the nemesis, mitmdump's accept)
    answer    the proxy has it -> the end of that attempt, for every attempt but the last
              (its exchange's `ended_at` in the client's ledger, else the loss the next
              attempt answers): answered by the target, the **target's** until its answer
              reached the proxy (first event, else head) and the **lab's** after (a toxic
              holding the answer back); answered by the proxy (an injected storm) or never
              seen by it, the **lab's**
    and, for the last attempt of a recovery that ended,
    target    the proxy has the request -> the proxy sees the target's first event on
              that flow (its first answer byte, the response head, without one): the
              **target's**
    delivery  the proxy sees that event -> the client accepts the event that ended the
              recovery: the **lab's** (mitmdump, the nemesis, the worker).

The client's share is what is left: waits beyond the advice, and the client's own work.
A recovery that never ended is infinite in one share: the target's when its last attempt
was answered by the target and that flow carried no event; the lab's when the target did
send events there (they never reached the client), when the proxy answered it (a storm)
or never saw it; the client's when the target answered its last attempt 404 (the session
was gone: by the rules the call's recovery ends there, and the client starts again), or
when its last attempt was a new handshake the target answered 2xx (the session was made
again: what kept the recovery from ending came after). A
recovery without any attempt in the ledgers (a call waiting for an answer that never came,
a client that never tried again: the ledgers cannot tell which), or whose attempts the
tap cannot place (no tap, an older tap without `t_request`, the last attempt never seen
by the proxy although the recovery ended), is not split: NaN shares, and gate 5 then
judges it on its whole latency (nothing excuses it). A recovery whose attempts cannot be
found in the tap (no tap, an older tap without `t_request`) is not split (NaN shares).

Figures are seconds; this module measures, and gate 5 (`lab.checker.rules.resume`)
judges the target on its share (`judge_share`), the same rule for any latency the lab
judges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.inputs.load import MissingInput
from lab.checker.truth.conn_flows import conn_flows
from lab.checker.truth.recoveries import PERCENTILE, nearest_rank, run_latencies

SHARES = ("client", "lab", "target")
RECONNECT_KINDS_OF_STREAM = ("resume", "reopen", "resend")
"""Attempts that carry the stream itself (a re-handshake only makes the session again)."""
SESSION_GONE = 404
"""The status that says the session is gone: the client must start a new one."""
REHANDSHAKE = "reinitialize"
"""The reconnects' kind of a new handshake (lab.client)."""
SLACK_S = 0.001
"""Clock rounding allowed when an attempt is placed inside its recovery."""


def recovery_shares(ctx: Context) -> pd.DataFrame:
    """Per counted recovery (gate 5's, censored left out): its `recoveries` row with
    `latency` and `client_s`, `lab_s`, `target_s` (s; inf = never ended, on whose side;
    NaN = not split). Computed once per run.
    MissingInput without the client ledgers or the tap."""
    return ctx.cached("recovery_shares", lambda: _recovery_shares(ctx))


def _recovery_shares(ctx: Context) -> pd.DataFrame:
    lat = run_latencies(ctx)
    rec = lat[~lat["censored"]].reset_index(drop=True)
    if ctx.data.tap is None:
        raise MissingInput("no proxy record (tap): the shares of a recovery are timed on the wire")
    out = rec.copy()
    out["lost_at"] = out["lost_at"].astype("float64")
    out["recovered_at"] = pd.to_numeric(out["recovered_at"], errors="coerce").astype("float64")
    out["latency"] = out["latency"].astype("float64")
    for share in SHARES:
        out[f"{share}_s"] = np.nan
    if not len(out):
        return out
    flows = _attempt_flows(ctx)
    pairs = _attempts_in_recoveries(ctx, out, flows)
    if len(pairs):
        split = _split(pairs, out)
        for share in SHARES:
            out[f"{share}_s"] = split[share].reindex(out.index)
    return out


def _attempt_flows(ctx: Context) -> pd.DataFrame:
    """The tap's flows by connection (lab.checker.truth.conn_flows) with whether the
    target had the request and the first event the target sent on each."""
    flows = conn_flows(ctx)
    sent = ctx.data.tap_records("sent")
    data = sent[sent["has_data"].astype(bool) & ~sent["priming"].astype(bool)] if len(sent) else sent
    first = data.groupby("flow", sort=False)["t"].min() if len(data) else pd.Series(dtype="float64")
    # Forwarded to the target: answered by it, or by nobody (the proxy sent it on and no
    # answer came back); not a storm the proxy answered itself.
    return flows.assign(
        by_target=(flows["answered_by"].astype(str) != "proxy").to_numpy(),
        t_event=flows["flow"].map(first).astype("float64").to_numpy(),
    )


def _attempts_in_recoveries(ctx: Context, rec: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """(recovery, attempt) pairs: the client's attempts on the recovery's stream, and its
    re-handshakes, sent between the loss and the recovery, in order, joined to their flow."""
    rc = ctx.require_client("reconnects")
    att = pd.DataFrame(
        {
            "client_id": rc["client_id"].astype("object"),
            "kind": rc["kind"].astype("object"),
            "a_stream": rc["stream_key"].astype("object"),
            "a_lost": pd.to_numeric(rc["lost_at"], errors="coerce").astype("float64"),
            "sent": pd.to_numeric(rc["sent_at"], errors="coerce").astype("float64"),
            "advised": pd.to_numeric(rc["advised_delay"], errors="coerce").astype("float64").fillna(0.0),
            "conn_id": pd.to_numeric(rc["conn_id"], errors="coerce").astype("Int64"),
        }
    )
    att = att[att["kind"] != "delete"]
    r = rec[["client_id", "stream_key", "lost_at", "recovered_at"]].assign(rid=rec.index)
    pairs = r.merge(att, on="client_id", how="inner")
    end = pairs["recovered_at"].fillna(math.inf)
    inside = (pairs["sent"] >= pairs["lost_at"] - SLACK_S) & (pairs["sent"] <= end + SLACK_S)
    ours = (pairs["a_stream"] == pairs["stream_key"]) | (pairs["kind"] == "reinitialize")
    pairs = pairs[inside & ours]
    pairs = pairs.merge(flows, on=["client_id", "conn_id"], how="left")
    pairs = pairs.merge(_exchange_ends(ctx), on=["client_id", "conn_id"], how="left")
    return pairs.sort_values(["rid", "sent"], kind="stable").reset_index(drop=True)


def _exchange_ends(ctx: Context) -> pd.DataFrame:
    """When each of the clients' exchanges ended (client_id, conn_id -> `ended`, s; NaN
    when the ledger has no end): how an attempt that failed ends, seen by the client."""
    try:
        ex = ctx.require_client("http_exchanges")
    except MissingInput:
        ex = None
    if ex is None or not len(ex):
        return pd.DataFrame(
            {
                "client_id": pd.Series(dtype="object"),
                "conn_id": pd.Series(dtype="Int64"),
                "ended": pd.Series(dtype="float64"),
            }
        )
    out = pd.DataFrame(
        {
            "client_id": ex["client_id"].astype("object"),
            "conn_id": pd.to_numeric(ex["conn_id"], errors="coerce").astype("Int64"),
            "ended": pd.to_numeric(ex["ended_at"], errors="coerce").astype("float64"),
        }
    )
    return out.dropna(subset=["conn_id"]).drop_duplicates(["client_id", "conn_id"], keep="last")


@dataclass(frozen=True, slots=True)
class _Segments:
    """Each pair's segments, as arrays over the pairs (s)."""

    advised: np.ndarray
    """The target's advised waits."""
    request: np.ndarray
    """The request's way to the proxy, and the waits a proxy's storm advised."""
    answer_target: np.ndarray
    answer_lab: np.ndarray


def _segments(pairs: pd.DataFrame) -> tuple[_Segments, np.ndarray]:
    sent = pairs["sent"].to_numpy(dtype="float64")
    t_req = pairs["t_request"].to_numpy(dtype="float64")
    seen = np.isfinite(t_req)
    request = np.where(seen, np.clip(t_req - sent, 0.0, None), 0.0)
    last = (pairs["rid"] != pairs["rid"].shift(-1)).to_numpy()
    start = np.where(seen, t_req, sent)
    # Where an attempt that was not the last ended: its exchange's end in the client's
    # ledger (a reset, a refusal, a timeout), else the loss the next attempt answers.
    # (The lab's client writes the recovery's first loss in every attempt's `lost_at`:
    # a first attempt a toxic held for 5 s and then reset was otherwise no one's span,
    # and its 5 s fell to the client, the share left over.)
    next_lost = pairs.groupby("rid", sort=False)["a_lost"].shift(-1).to_numpy(dtype="float64")
    ended = pairs["ended"].to_numpy(dtype="float64")
    end = np.where(np.isfinite(ended), ended, next_lost)
    span = np.where(~last & np.isfinite(end), np.clip(end - start, 0.0, None), 0.0)
    # Each attempt waited from the end of the one before it (the first: from the loss).
    prev_end = pd.Series(np.where(last, np.nan, end), index=pairs.index).groupby(pairs["rid"], sort=False)
    since = prev_end.shift(1).to_numpy(dtype="float64")
    since = np.fmax(since, pairs["a_lost"].to_numpy(dtype="float64"))  # (fmax passes a NaN over)
    wait = np.clip(sent - since, 0.0, None)
    advised = np.minimum(np.nan_to_num(wait), pairs["advised"].to_numpy(dtype="float64"))
    by_target = pairs["by_target"].fillna(False).to_numpy(dtype=bool) & seen
    # The advice an attempt waited for came with the answer to the one before it: the
    # target's, or a storm the proxy answered in its place (the lab's fault). The first
    # attempt's came with the stream that was lost (its `retry`): the target's.
    prev = pd.Series(by_target, index=pairs.index).groupby(pairs["rid"], sort=False).shift(1)
    advice_by_target = prev.fillna(True).to_numpy(dtype=bool)
    # A target that answered an attempt is blamed until its answer reached the proxy (its
    # first event, else the head, else the flow's end there); what came after, until the
    # client saw the attempt end, was on the lab's side (a toxic holding the answer).
    answered = pairs["t_event"].to_numpy(dtype="float64")
    answered = np.where(np.isfinite(answered), answered, pairs["t_head"].to_numpy(dtype="float64"))
    answered = np.where(np.isfinite(answered), np.clip(answered, start, start + span), start + span)
    target_part = np.where(by_target, answered - start, 0.0)
    return (
        _Segments(
            np.where(advice_by_target, advised, 0.0),
            request + np.where(advice_by_target, 0.0, advised),
            target_part,
            span - target_part,
        ),
        last,
    )


def _split(pairs: pd.DataFrame, rec: pd.DataFrame) -> pd.DataFrame:
    """rid -> the client's, lab's and target's share of each recovery that has attempts."""
    seg, last = _segments(pairs)
    per = pd.DataFrame(
        {
            "rid": pairs["rid"].to_numpy(),
            "target": seg.advised + seg.answer_target,
            "lab": seg.request + seg.answer_lab,
        }
    )
    sums = per.groupby("rid", sort=False)[["target", "lab"]].sum()
    final = pairs[last].set_index("rid")
    lat = rec["latency"].reindex(sums.index).to_numpy(dtype="float64")
    recovered = rec["recovered_at"].reindex(sums.index).to_numpy(dtype="float64")
    t_req = final["t_request"].reindex(sums.index).to_numpy(dtype="float64")
    first = final["t_event"].reindex(sums.index).to_numpy(dtype="float64")
    head = final["t_head"].reindex(sums.index).to_numpy(dtype="float64")
    by_target = final["by_target"].reindex(sums.index).fillna(False).to_numpy(dtype=bool)
    # The answer of the last attempt: its first event if it came before the recovery
    # ended (else the response head); the target's from the request, the lab's after.
    answer = np.where(np.isfinite(first) & (first <= recovered + SLACK_S), first, head)
    ok = np.isfinite(lat) & np.isfinite(t_req) & np.isfinite(answer) & by_target
    target = sums["target"].to_numpy() + np.where(ok, np.clip(answer - t_req, 0.0, None), 0.0)
    lab = sums["lab"].to_numpy() + np.where(ok, np.clip(recovered - answer, 0.0, None), 0.0)
    # Never ended: whose side the last attempt stopped on. A session the target said was
    # gone (404) ends the call's recovery by the rules: the client's to start again. Any
    # other refusal (a 400 for a session it should call unknown, a 5xx) is the target's.
    never = ~np.isfinite(lat)
    seen = np.isfinite(t_req)
    status = final["status"].reindex(sums.index).to_numpy(dtype="float64")
    gone = never & seen & by_target & (status == SESSION_GONE)
    # A new handshake the target answered (2xx) is no silence: the session was made again,
    # and what kept the recovery from ending came after it, on the client's side (or the
    # deployment's: each next request routed to a replica that lacks the new session).
    rehandshake = final["kind"].reindex(sums.index).astype(str).to_numpy() == REHANDSHAKE
    made_again = never & seen & by_target & rehandshake & (status >= 200) & (status < 300)
    gone = gone | made_again
    silent_target = never & seen & by_target & ~np.isfinite(first) & ~gone
    target = np.where(silent_target, math.inf, target)
    lab = np.where(never & ~silent_target & ~gone, math.inf, lab)
    with np.errstate(invalid="ignore"):  # inf - inf where a share is infinite: overwritten below
        rest = np.clip(lat - target - lab, 0.0, None)
    client = np.where(gone, math.inf, np.where(never, 0.0, rest))
    # A finished recovery whose last attempt the proxy never saw cannot be split.
    unsplit = ~never & ~ok
    out = pd.DataFrame({"client": client, "lab": lab, "target": target}, index=sums.index)
    out.loc[unsplit, ["client", "lab", "target"]] = np.nan
    return out


@dataclass(frozen=True, slots=True)
class ShareFigures:
    """One share's distribution over the recoveries split (s; inf = never ended there)."""

    name: str
    n: int
    p50_s: float
    p99_s: float


def share_figures(shares: pd.DataFrame, *, total: str = "latency") -> dict[str, ShareFigures]:
    """p50 and p99 (nearest rank, as gate 5) of each share and of the total (column
    `total`), over the recoveries that could be split."""
    split = shares[shares["target_s"].notna()]
    out = {}
    for name in ("total", *SHARES):
        column = total if name == "total" else f"{name}_s"
        values = split[column].to_numpy(dtype="float64")
        out[name] = ShareFigures(
            name, len(values), nearest_rank(values, 0.5), nearest_rank(values, PERCENTILE)
        )
    return out


@dataclass(frozen=True, slots=True)
class ShareVerdict:
    """How a latency is judged once it is split: on the share of the party under judgement."""

    failed: bool
    """The judged share's p99 is at or over the budget: that party's failure."""
    limited_by_lab: bool
    """The total is over the budget and the judged share is not: inconclusive."""
    text: str


def judge_share(
    total_p99: float, share_p99: float, budget: float, *, share: str, rest: str = "the lab"
) -> ShareVerdict:
    """The one rule for every latency the lab judges: the party is judged on its own share
    (the target on `target`, a client under test on `client`); a total over the budget
    that its share does not explain is someone else's (`rest`: the lab's, for the
    target; the target's or the lab's, for a client under test), never a failure."""
    shown = _shown(share_p99)
    if not math.isnan(share_p99) and share_p99 >= budget:
        return ShareVerdict(True, False, f"the {share}'s share alone has p99 {shown} (budget < {budget:g} s)")
    if not math.isnan(total_p99) and total_p99 >= budget:
        return ShareVerdict(
            False,
            True,
            f"limited by {rest}: p99 {_shown(total_p99)} in all, but the {share}'s share has p99 {shown} "
            f"(budget < {budget:g} s)",
        )
    return ShareVerdict(False, False, f"the {share}'s share has p99 {shown}")


def _shown(value: float) -> str:
    return "n/a" if math.isnan(value) else ("never (inf)" if math.isinf(value) else f"{value:.3f} s")
