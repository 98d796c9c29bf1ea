"""Unanswered requests by hop: report.json `unanswered`, the section of report.md and
report.html — the requests sent, seen by the proxy, answered by the server and by the
proxy, and got by the clients; the requests that went unanswered, by the hop where each
was lost (`lab.checker.truth.request_hops` holds the rules), over the run and per 10 s bin;
the first witnesses of each hop; and the lab's part in them
(`lab.checker.health.lab_limits.unanswered_limit`, passed in by `lab.checker.judge.sections`).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, client_ref, row_of, tap_ref
from lab.checker.model import JsonValue
from lab.checker.truth.request_hops import (
    ANSWERED,
    BIN_S,
    CLIENT_SIDE,
    CLIENT_TO_PROXY,
    HOPS,
    MANY_PER_BIN,
    MANY_SHARE,
    PROXY_TO_SERVER,
    SERVER_TO_PROXY,
    Findings,
    connection_errors,
    counted,
    findings,
    many,
)

WITNESSES_PER_HOP = 2


def _hop_counts(rows: pd.DataFrame, f: Findings) -> dict[str, int | None]:
    """Per hop, how many of `rows` (null where the ledgers cannot see the hop)."""
    hops = rows["hop"].value_counts()
    return {
        h: (int(hops.get(h, 0)) if f.tap_known and (f.client_known or h not in CLIENT_SIDE) else None)
        for h in HOPS
    }


def _funnel(rows: pd.DataFrame, f: Findings) -> dict[str, int | None]:
    status = rows["tap_status"]
    by = rows["answered_by"]

    def tap(mask: pd.Series) -> int | None:
        return int(mask.to_numpy(dtype=bool).sum()) if f.tap_known else None

    return {
        "sent": len(rows) if f.client_known else None,
        "reached_proxy": tap(rows["at_proxy"]),
        "answered_by_server": tap(status.notna() & (by == "server")),
        "answered_by_proxy": tap(status.notna() & (by == "proxy")),
        "answered_at_client": int(rows["client_status"].notna().sum()) if f.client_known else None,
    }


def bins(f: Findings) -> list[dict[str, JsonValue]]:
    """Per 10 s bin from the run's start (by the time requests were sent): the funnel and
    the unanswered requests per hop; every bin from the first to the last."""
    rows = f.rows[f.rows["bin"].notna()]
    if not len(rows):
        return []
    out: list[dict[str, JsonValue]] = []
    first, last = int(rows["bin"].min()), int(rows["bin"].max())
    grouped = dict(tuple(rows.groupby("bin", sort=True)))
    for b in range(first, last + 1):
        g = grouped.get(b)
        if g is None:
            g = rows.iloc[0:0]
        lost = g[g["unanswered"]]
        out.append(
            {
                "bin": b,
                "start_s": b * BIN_S,
                "end_s": (b + 1) * BIN_S,
                **_funnel(g, f),
                "unanswered": len(lost),
                "by_hop": _hop_counts(lost, f),  # type: ignore[dict-item]
                "by_fault": int((g["hop"] != ANSWERED).sum() - len(lost) - int(g["closed_early"].sum())),
                "closed_early": int(g["closed_early"].sum()),
            }
        )
    return out


def _errors(rows: pd.DataFrame) -> dict[str, int]:
    counts = rows["error"].fillna("").astype(str).replace("", "none").value_counts()
    return {str(k): int(v) for k, v in counts.items()}


# ---------------------------------------------------------------------------- witnesses


def witnesses(ctx: Context, f: Findings) -> list[dict[str, JsonValue]]:
    lost = counted(f)
    out: list[dict[str, JsonValue]] = []
    for hop in HOPS:
        for _, r in lost[lost["hop"] == hop].head(WITNESSES_PER_HOP).iterrows():
            refs = client_ref(ctx.data.client_files, "http_exchanges", r) + tap_ref(r)
            out.append(
                {
                    "hop": hop,
                    "explanation": explain(r, ctx, f.client_known),
                    "row": dict(
                        row_of(
                            r,
                            [
                                "client_id",
                                "conn_id",
                                "purpose",
                                "method",
                                "started_at",
                                "ended_at",
                                "error",
                                "t_request",
                                "tap_status",
                                "answered_by",
                                "server_status",
                            ],
                        )
                    ),
                    "refs": list(refs),
                }
            )
    return out


def explain(r: pd.Series, ctx: Context, client_known: bool) -> str:
    o = ctx.origin
    what = " ".join(str(x) for x in (r["purpose"], r["method"]) if isinstance(x, str) and x) or "request"
    head = f"client {r['client_id']}'s {what} (connection {r['conn_id']}) sent {at(r['started_at'], o)}"
    hop = r["hop"]
    if hop == CLIENT_TO_PROXY:
        where = "the proxy never saw it"
    elif hop == PROXY_TO_SERVER:
        where = f"the proxy saw it {at(r['t_request'], o)}; no answer came from the server's side"
        where += ", and the server's ledger has none" if "server" in _sources(ctx) else ""
    elif hop == SERVER_TO_PROXY:
        where = (
            f"the server answered {_status(r['server_status'])} (its ledger); the proxy never saw that answer"
        )
    else:
        who = "the proxy's own" if r["answered_by"] == "proxy" else "the server's"
        where = (
            f"the proxy passed {who} {_status(r['tap_status'])} {at(r['flow_t'], o)}; the client never got it"
        )
    if not client_known:
        return f"{head}: {where}"
    waited = r["ended_at"] - r["started_at"]
    gave_up = f"{waited:.1f} s" if isinstance(waited, float) and math.isfinite(waited) else "?"
    return f"{head}: {where}; the client stopped waiting after {gave_up} ({r['error'] or 'no error'})"


def _status(value: Any) -> str:
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return "?"


def _sources(ctx: Context) -> tuple[str, ...]:
    return findings(ctx).sources


# ---------------------------------------------------------------------------- section


def section(
    ctx: Context, lab: dict[str, JsonValue] | None, saturated: list[str] | None
) -> dict[str, JsonValue]:
    """report.json `unanswered` (docs/report.md); `lab`: the lab's limit on them
    (`lab_limits.unanswered_limit_json`), null when none; `saturated`: the lab parts
    saturated while many went unanswered (null when few did)."""
    f = findings(ctx)
    rows = f.rows
    lost = counted(f)
    funnel = _funnel(rows, f)
    sent = funnel["sent"] if funnel["sent"] is not None else funnel["reached_proxy"]
    by_hop = _hop_counts(lost, f)
    faulted = rows[rows["by_fault"]]
    early = rows[rows["closed_early"]]
    conn = connection_errors(rows)
    if not len(rows):
        status = "no_requests"
    elif f.client_known:
        status = "ok" if f.tap_known else "tap_missing"
    else:
        status = "client_unknown"
    top = max(((n or 0, h) for h, n in by_hop.items()), default=(0, ""))
    errors: dict[str, JsonValue] = {h: dict(_errors(lost[lost["hop"] == h])) for h in HOPS if by_hop[h]}
    return {
        "status": status,
        "sources": list(f.sources),
        "bin_s": BIN_S,
        "many_share": MANY_SHARE,
        "many_per_bin": MANY_PER_BIN,
        **funnel,
        "unanswered": len(lost),
        "share": round(len(lost) / sent, 4) if sent else None,
        "many": many(lost, sent or 0),
        "most_at": top[1] if top[0] else None,
        "by_hop": by_hop,  # type: ignore[dict-item]
        "errors_by_hop": errors,
        "server_to_proxy_checked": "server" in f.sources,
        "connection_errors": len(conn),
        "by_fault": {h: int((faulted["hop"] == h).sum()) for h in HOPS},
        "closed_early": len(early),
        "proxy_only": f.proxy_only,
        "open_at_proxy_stop": f.open_at_proxy_stop,
        "bins": bins(f),  # type: ignore[dict-item]
        "witnesses": witnesses(ctx, f),  # type: ignore[dict-item]
        "lab_limit": lab,
        "lab_saturated": list(saturated) if saturated is not None else None,
        "hops": dict(HOPS),
    }
