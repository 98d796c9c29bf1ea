"""report.json `restarts`: what each restart of the target did, seen from the wire.

`lab run` writes one line per restart to `restarts.jsonl` (`mcpLabRestarts.v1`: when it
sent the stop, when the server was back, docs/ledgers.md); everything else here is the
proxy tap's, through the clients' flows (lab.checker.truth.client_wire), so it holds for
any target and any client:

- **down, from the wire**: from the first request the target left without an answer, or
  the first stream it dropped (`server_gone`) or ended before its work was done (a
  standalone GET, or a call's stream without its answer: a stopping server ending its
  streams), at or after the stop, to the first answer it gave after that;
- **calls in flight**: `tools/call` requests sent before the target went down whose answer
  had not passed by then; each is then *answered after* (on a resumption of its stream,
  or a re-send with the same idempotency key, answered), or *never answered* (lost: its
  outcome never reached the client);
- **run twice**: writes among them answered with two different results (gate 2's wire
  finding);
- **sessions**: those in use in the 30 s before, by their first answer after: kept
  (2xx), lost (404), of which re-handshaken (the same client sent `initialize` later);
- **throughput back**: seconds from going down until the server's events per second are
  back to `RECOVERED_SHARE` of their rate in the 10 s before.

The store the reference server had (`volatile`: sessions and streams in memory, lost by a
restart; `durable`: kept) is said with each restart: the same numbers mean different
things for each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.model import JsonValue
from lab.checker.truth import client_wire

FILE = "restarts.jsonl"
SESSION_LOOKBACK_S = 30.0
"""Sessions answered in this many seconds before a restart count as in use at it."""
BASELINE_S = 10.0
RECOVERED_SHARE = 0.8
MIN_BASELINE_RATE = 5.0
"""Events per second below which "back to the rate before" says nothing (no figure)."""


def records(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The restarts `lab run` recorded (in order), and problems reading them."""
    path = run_dir / FILE
    if not path.exists():
        return [], []
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line)
        except ValueError:
            problems.append(f"{FILE} line {i}: not JSON")
            continue
        if isinstance(rec, dict) and rec.get("type") == "restart":
            out.append(rec)
    return sorted(out, key=lambda r: _int(r.get("n")) or 0), problems


def planned(ctx: Context) -> list[Mapping[str, Any]]:
    sc = (ctx.data.run or {}).get("scenario")
    got = sc.get("restarts") if isinstance(sc, Mapping) else None
    return [r for r in got if isinstance(r, Mapping)] if isinstance(got, list) else []


def section(ctx: Context) -> dict[str, JsonValue] | None:
    """None when the run planned no restart."""
    plan = planned(ctx)
    recs, problems = records(ctx.data.run_dir)
    if not plan and not recs:
        return None
    origin = ctx.origin or 0.0
    flows = client_wire.flows(ctx)
    events = _event_times(ctx)
    results = ctx.data.tap["result"] if ctx.data.tap is not None else pd.DataFrame()
    rows: list[JsonValue] = []
    ends = [_num(r.get("stop_sent")) for r in recs[1:]] + [None]
    for rec, next_stop in zip(recs, ends, strict=True):
        rows.append(_row(rec, flows, events, results, origin, until=next_stop))
    notes = list(problems)
    if len(recs) < len(plan):
        notes.append(
            f"{len(plan)} restart(s) planned, {len(recs)} done: the run ended before the others (run.json end_reason)"
        )
    return {"planned": len(plan), "done": len(recs), "restarts": rows, "notes": list(notes)}


def _row(
    rec: Mapping[str, Any],
    flows: pd.DataFrame,
    events: np.ndarray,
    results: pd.DataFrame,
    origin: float,
    *,
    until: float | None,
) -> dict[str, JsonValue]:
    base: dict[str, JsonValue] = {
        "n": _int(rec.get("n")),
        "how": str(rec.get("how") or ""),
        "store": None if rec.get("store") is None else str(rec.get("store")),
        "applicable": rec.get("applicable", True) is not False,
        "ok": rec.get("ok", True) is not False,
        "error": None if rec.get("error") is None else str(rec.get("error")),
    }
    stop = _num(rec.get("stop_sent"))
    if not base["applicable"] or stop is None:
        return {**base, "why": None if rec.get("why") is None else str(rec.get("why"))}
    ready = _num(rec.get("ready"))
    base.update(
        at_s=round(stop - origin, 3),
        down_by_lab_s=None if ready is None else round(ready - stop, 3),
        exit_code=_int(rec.get("exit_code")),
    )
    down_at, up_at = _down_and_up(flows, stop, until)
    base.update(
        down_at_s=None if down_at is None else round(down_at - origin, 3),
        down_wire_s=None if down_at is None or up_at is None else round(up_at - down_at, 3),
    )
    if down_at is None:
        base["note"] = "no request went unanswered and no stream was dropped: the wire saw no downtime"
        return base
    base.update(_calls(flows, results, down_at))
    base["sessions"] = _sessions(flows, down_at, up_at)
    base["throughput_back_s"] = _throughput_back(events, down_at, up_at)
    return base


def _down_and_up(flows: pd.DataFrame, stop: float, until: float | None) -> tuple[float | None, float | None]:
    """When the wire saw the target go down (at or after the stop) and first answer again."""
    if not len(flows):
        return None, None
    lo = stop
    hi = math.inf if until is None else until
    t_req = flows["t_req"].to_numpy(dtype=float)
    end_t = flows["end_t"].to_numpy(dtype=float)
    status = flows["status"]
    unanswered = status.isna().to_numpy() & (t_req >= lo) & (t_req < hi)
    # A stream the target dropped, or ended before its work was done (a stopping server
    # that ends its streams, with `retry` advice or not): a standalone GET, or a call's
    # stream without its answer.
    ended = flows["end_reason"].to_numpy()
    cut_short = (ended == "complete") & (
        (flows["method"] == "GET").to_numpy()
        | (
            (flows["rpc_method"] == "tools/call").to_numpy()
            & ~flows["answered"].fillna(False).astype(bool).to_numpy()
        )
    )
    dropped = ((ended == "server_gone") | cut_short) & (end_t >= lo) & (end_t < hi)
    times = np.concatenate([t_req[unanswered], end_t[dropped]])
    if not len(times):
        return None, None
    down = float(times.min())
    answer_t = flows["t"].to_numpy(dtype=float)
    later = status.notna().to_numpy() & (t_req > down) & (flows["answered_by"] == "server").to_numpy()
    up = float(answer_t[later].min()) if later.any() else None
    return down, up


def _calls(flows: pd.DataFrame, results: pd.DataFrame, down: float) -> dict[str, JsonValue]:
    calls = flows[(flows["rpc_method"] == "tools/call") & (flows["t_req"] < down)]
    ended = calls["end_t"].fillna(math.inf)
    answered = calls["answered"].fillna(False).astype(bool)
    # (An answer's head passed before the restart on a JSON answer: `t` is then its end.)
    cut = calls[(ended >= down - 0.5) & ~answered]
    later = flows[flows["t_req"] >= down - 0.5]
    resumed_ok = set(
        later.loc[later["answered"].fillna(False).astype(bool), "stream_flow"].dropna().astype(str)
    )
    resent_ok = set(later.loc[later["answered"].fillna(False).astype(bool), "key"].dropna().astype(str))
    answered_after = 0
    lost: dict[str, int] = {}
    keys: set[str] = set()
    for r in cut.itertuples(index=False):
        key = None if r.key is None or (isinstance(r.key, float) and math.isnan(r.key)) else str(r.key)
        if key is not None:
            keys.add(key)
        if str(r.flow) in resumed_ok or (key is not None and key in resent_ok):
            answered_after += 1
        else:
            tool = _tool(r.tool)
            lost[tool] = lost.get(tool, 0) + 1
    tools = cut["tool"].map(_tool).value_counts()
    return {
        "calls_in_flight": len(cut),
        "in_flight_by_tool": {str(k): int(v) for k, v in sorted(tools.items())},
        "answered_after": answered_after,
        "never_answered": sum(lost.values()),
        "never_answered_by_tool": dict(sorted(lost.items())),
        "run_twice": _run_twice(results, keys),
    }


def _tool(name: object) -> str:
    return "?" if name is None or (isinstance(name, float) and math.isnan(name)) else str(name)


def _run_twice(results: pd.DataFrame, keys: set[str]) -> int:
    """Writes among `keys` answered with two different (non-error) results on the wire."""
    if not keys or not len(results) or "idempotency_key" not in results.columns:
        return 0
    r = results[results["idempotency_key"].astype(str).isin(keys)]
    r = r[~r["is_error"].fillna(False).astype(bool)]
    if not len(r):
        return 0
    distinct = r.groupby([r["auth"].astype(str), r["idempotency_key"].astype(str)])["result_digest"].nunique()
    return int((distinct > 1).sum())


def _sessions(flows: pd.DataFrame, down: float, up: float | None) -> dict[str, JsonValue]:
    have = flows[flows["session"].notna() & flows["status"].notna()]
    st = have["status"].astype(float)
    before = have[(have["t_req"] >= down - SESSION_LOOKBACK_S) & (have["t_req"] < down) & (st < 300)]
    in_use = set(before["session"].astype(str))
    after = have[(have["t_req"] >= down) & (have["answered_by"] == "server")].sort_values(
        "t_req", kind="stable"
    )
    first = after.drop_duplicates("session")
    first = first[first["session"].astype(str).isin(in_use)]
    kept = first[first["status"].astype(float) < 300]
    gone = first[first["status"].astype(float) == 404]
    inits = flows[flows["rpc_method"] == "initialize"]
    rehandshook = 0
    for r in gone.itertuples(index=False):
        mine = inits[(inits["client_id"] == r.client_id) & (inits["t_req"] > r.t_req)]
        rehandshook += bool(len(mine))
    return {
        "in_use": len(in_use),
        "kept": len(kept),
        "lost": len(gone),
        "rehandshaken": rehandshook,
        "not_used_again": len(in_use) - len(first),
    }


def _event_times(ctx: Context) -> np.ndarray:
    tap = ctx.data.tap
    if tap is None or not len(tap["sent"]):
        return np.empty(0)
    sent = tap["sent"]
    data = sent["has_data"].fillna(False).astype(bool) & ~sent["priming"].fillna(False).astype(bool)
    return np.sort(sent.loc[data, "t"].to_numpy(dtype=float))


def _throughput_back(events: np.ndarray, down: float, up: float | None) -> float | None:
    """Seconds from going down until a whole second carried RECOVERED_SHARE of the events per
    second of the BASELINE_S before; None when the baseline is too thin or it never did."""
    if up is None or not len(events):
        return None
    lo, hi = np.searchsorted(events, [down - BASELINE_S - 1, down - 1])
    rate = (hi - lo) / BASELINE_S
    if rate < MIN_BASELINE_RATE:
        return None
    start = max(up - 1.0, down)
    t = start
    last = float(events[-1])
    while t + 1.0 <= last:
        a, b = np.searchsorted(events, [t, t + 1.0])
        if b - a >= RECOVERED_SHARE * rate:
            return round(t + 1.0 - down, 3)
        t += 0.25
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    x = _num(value)
    return None if x is None else int(x)
