"""Time series for the figures, computed from a loaded run folder (`RunData`).

Every series is indexed by the whole second it covers (epoch seconds, int: the bin is
[s, s+1)), values are counts. `origin` is the zero of the figures' time axis.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checker import RunData, per_second
from lab.checker import active_clients as clients_active


def origin(data: RunData) -> float | None:
    """run.json started_at, else the earliest time in the ledgers, else None."""
    started = (data.run or {}).get("started_at")
    if isinstance(started, int | float) and not isinstance(started, bool):
        return float(started)
    candidates: list[float] = []
    if data.tap is not None and len(data.tap["flow"]):
        candidates.append(float(data.tap["flow"]["t"].min()))
    if data.client is not None and len(data.client["http_exchanges"]):
        candidates.append(float(data.client["http_exchanges"]["started_at"].min()))
    finite = [c for c in candidates if math.isfinite(c)]
    return min(finite) if finite else None


def _bins(times: pd.Series) -> pd.Series:
    if not len(times):
        return pd.Series(dtype="int64")
    seconds = np.floor(times.astype("float64").dropna().to_numpy()).astype("int64")
    return pd.Series(seconds).value_counts().sort_index()


def events_per_second(data: RunData) -> tuple[pd.Series, str]:
    """(events per second, what was counted): the tap's `sent` events with a message;
    else the server's non-priming `events_sent`; else the clients' accepted receipts."""
    if data.tap is not None:
        sent = data.tap["sent"]
        mask = sent["has_data"].fillna(False).astype(bool) & ~sent["priming"].fillna(False).astype(bool)
        return _bins(sent.loc[mask, "t"]), "events sent (tap)"
    if data.server is not None:
        ev = data.server["events_sent"]
        return _bins(ev.loc[ev["kind"] != "priming", "sent_at"]), "events sent (server ledger)"
    if data.client is not None:
        inbox = data.client["inbox"]
        return _bins(inbox.loc[inbox["kind"] != "priming", "accepted_at"]), "events accepted (clients)"
    return pd.Series(dtype="int64"), "no events recorded"


def active_clients(data: RunData) -> pd.Series:
    """Clients with at least one request open during each second (the checker's own count,
    `lab.checker.active_clients`, which its collapse detection uses)."""
    if data.client is None or "http_exchanges" in data.client_tables_absent:
        return pd.Series(dtype="int64")
    return clients_active(data.client["http_exchanges"])


def reconnects_per_second(data: RunData) -> pd.Series:
    if data.client is None or "reconnects" in data.client_tables_absent:
        return pd.Series(dtype="int64")
    return per_second(data.client["reconnects"])
