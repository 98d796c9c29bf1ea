"""A run of both protocol eras, figure by figure for each (report.json `eras`).

In a run of both eras (run.json `target.era = "both"`: each client speaks one, one server
serves both) a server whose modern path breaks its handshake path, or the reverse, shows
as one era's figures going wrong while the other's hold. The gates judge every client
whatever its era; this section splits what the clients saw by era:

- a client's era is the one it established its session in (its `sessions` row
  `established`: a modern revision there is the modern era, whose "session" is its
  `server/discover`), else the one its ID gives (`lab.wire.revisions.era_of_client`, as
  the Locust user chose it);
- per era: clients, calls by outcome, writes sent more than once (gate 2's side), messages
  accepted and refused (gate 1's), requests and their 4xx/5xx answers, reconnect attempts
  (gate 6's), recoveries (resumptions in the handshake era, re-issues in the modern era)
  with how many got back and their latency p50/p99 (gate 5's).

None for a run of one era (the report's header says which).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.model import JsonValue
from lab.checker.truth.recoveries import nearest_rank
from lab.wire.revisions import MODERN_REVISIONS, era_of_client

ERAS = ("handshake", "modern")


def section(ctx: Context) -> JsonValue:
    if ctx.eras() != frozenset(ERAS):
        return None
    client = ctx.data.client
    if client is None:
        return {"eras": [], "notes": ["no client ledger: the lab's clients' figures cannot be split by era"]}
    era_of = client_eras(ctx)
    rows: list[JsonValue] = [_figures(ctx, era, era_of) for era in ERAS]
    return {"eras": rows, "notes": []}


def client_eras(ctx: Context) -> dict[str, str]:
    """client_id -> the era it spoke (module docstring)."""
    client = ctx.data.client
    assert client is not None
    ids: set[str] = set()
    for table in ("operations", "http_exchanges", "sessions"):
        if table in client and "client_id" in client[table].columns:
            ids.update(str(c) for c in client[table]["client_id"].dropna().unique())
    out = {c: era_of_client(c) for c in ids}
    if "sessions" in client:
        s = client["sessions"]
        est = s[(s["what"] == "established") & s["protocol_version"].notna()]
        for cid, version in zip(est["client_id"].tolist(), est["protocol_version"].tolist(), strict=True):
            out[str(cid)] = "modern" if version in MODERN_REVISIONS else "handshake"
    return out


def _of(frame: pd.DataFrame, era: str, era_of: dict[str, str]) -> pd.DataFrame:
    return frame[frame["client_id"].map(lambda c: era_of.get(str(c)) == era)]


def _figures(ctx: Context, era: str, era_of: dict[str, str]) -> dict[str, JsonValue]:
    client = ctx.data.client
    assert client is not None

    def table(name: str) -> pd.DataFrame:
        frame = client.get(name)
        if frame is None or "client_id" not in frame.columns:
            return pd.DataFrame(columns=["client_id"])
        return _of(frame, era, era_of)

    ops = table("operations")
    outcomes: dict[str, JsonValue] = (
        {str(k): int(v) for k, v in ops["outcome"].value_counts().items()} if len(ops) else {}
    )
    writes = ops[ops["write"].astype(bool)] if len(ops) else ops
    resent = int((pd.to_numeric(writes["attempts"], errors="coerce") > 1).sum()) if len(writes) else 0
    ex = table("http_exchanges")
    status = pd.to_numeric(ex["status"], errors="coerce") if len(ex) else pd.Series(dtype=float)
    rec = table("recoveries")
    back = rec[rec["recovered_at"].notna()] if len(rec) else rec
    took = (
        (pd.to_numeric(back["recovered_at"]) - pd.to_numeric(back["lost_at"])).to_numpy(dtype=float)
        if len(back)
        else np.array([])
    )
    inbox = ctx.data.client.get("inbox") if ctx.data.client is not None else None
    accepted = len(_of(inbox, era, era_of)) if inbox is not None and "client_id" in inbox.columns else 0
    return {
        "era": era,
        "clients": sum(1 for e in era_of.values() if e == era),
        "calls": len(ops),
        "outcomes": outcomes,
        "writes_sent_again": resent,
        "accepted": accepted,
        "rejected": len(table("events_rejected")),
        "requests": len(ex),
        "status_4xx": int(((status >= 400) & (status < 500)).sum()),
        "status_5xx": int((status >= 500).sum()),
        "reconnects": len(table("reconnects")),
        "recoveries": len(rec),
        "recovered": len(back),
        "recovery_p50_s": _quantile(took, 0.50),
        "recovery_p99_s": _quantile(took, 0.99),
    }


def _quantile(values: np.ndarray, q: float) -> float | None:
    """Gate 5's percentile (`nearest_rank`), rounded to the millisecond; None for no values."""
    v = nearest_rank(values, q)
    return None if math.isnan(v) else round(v, 3)
