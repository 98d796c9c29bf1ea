"""The three hops the lab's own latency is measured on, each joined once per run from the
ledgers: request (client send -> proxy sees the request), upstream (server send -> proxy
sees the event; reference server only) and delivery (proxy forwards an event -> client
accepts it). `lab.checker.health.lab_latency` turns them into the report's figures."""

from __future__ import annotations

from pathlib import PurePath

import numpy as np
import pandas as pd

from lab.checker.context import Context, text_key
from lab.checker.inputs.load import SOURCE, MissingInput
from lab.checker.truth.conn_flows import conn_flows


def part_of(ctx: Context, src: pd.Series) -> pd.Series:
    """The Locust worker (process monitor name) of each client row, from its ledger file."""
    files = ctx.data.client_files
    names = np.array([PurePath(p).stem for p in files] + [None], dtype=object)
    index = pd.to_numeric(src, errors="coerce").to_numpy(dtype="float64")
    valid = np.isfinite(index) & (index >= 0) & (index < len(files))
    positions = np.where(valid, np.nan_to_num(index, nan=0.0), len(files)).astype("int64")
    return pd.Series(names[positions], index=src.index, dtype="object")


def request_delays(ctx: Context) -> pd.DataFrame:
    """Hop `request`: t (the client's send, epoch s), delay (s), part (its worker); only
    requests the tap saw with a `t_request`. MissingInput without a tap or client ledger."""
    return ctx.cached("lab_latency_request", lambda: _request_delays(ctx))


def _request_delays(ctx: Context) -> pd.DataFrame:
    ex = ctx.require_client("http_exchanges")
    flows = conn_flows(ctx)
    if not flows["t_request"].notna().any():
        raise MissingInput("the proxy's flow records have no t_request (a tap of an older lab)")
    left = pd.DataFrame(
        {
            "client_id": ex["client_id"].astype("object"),
            "conn_id": pd.to_numeric(ex["conn_id"], errors="coerce").astype("Int64"),
            "t": pd.to_numeric(ex["started_at"], errors="coerce").astype("float64"),
            "part": part_of(ctx, ex[SOURCE]) if SOURCE in ex.columns else None,
        }
    )
    joined = left.merge(
        flows[["client_id", "conn_id", "t_request"]], on=["client_id", "conn_id"], how="inner"
    )
    joined = joined[joined["t_request"].notna() & joined["t"].notna()]
    joined["delay"] = joined["t_request"] - joined["t"]
    out = joined[["t", "delay", "part"]].reset_index(drop=True)
    out.attrs["unmatched"] = len(left) - len(out)
    return out


def upstream_delays(ctx: Context) -> pd.DataFrame:
    """Hop `upstream`: per event the server sent (first sends) joined to the tap's first
    `sent` record of it: t (the server's send, epoch s), delay (s). MissingInput without
    a server ledger or a tap."""
    return ctx.cached("lab_latency_upstream", lambda: _upstream_delays(ctx))


def _upstream_delays(ctx: Context) -> pd.DataFrame:
    server = ctx.data.server
    if server is None:
        raise MissingInput(f"no server ledger ({ctx.data.why_absent('server')}): a URL target keeps its own")
    sent = ctx.data.tap_records("sent")
    ev = server["events_sent"]
    first = ev[pd.to_numeric(ev["replay"], errors="coerce").fillna(0).astype("int64") == 0]
    first = first[first["event_id"].notna() & first["session"].notna()]
    by_event = pd.Series(
        pd.to_numeric(first["sent_at"], errors="coerce").astype("float64").to_numpy(),
        index=text_key(first["session"], first["event_id"]).to_numpy(),
    )
    by_event = by_event[~by_event.index.duplicated(keep="first")]
    seen = sent[sent["event_id"].notna() & sent["session"].notna()].sort_values("t", kind="stable")
    seen_t = pd.Series(
        seen["t"].astype("float64").to_numpy(), index=text_key(seen["session"], seen["event_id"]).to_numpy()
    )
    seen_t = seen_t[~seen_t.index.duplicated(keep="first")]
    both = by_event.index.intersection(seen_t.index)
    t = by_event.loc[both].to_numpy(dtype="float64")
    frame = pd.DataFrame({"t": t, "delay": seen_t.loc[both].to_numpy(dtype="float64") - t, "part": None})
    out: pd.DataFrame = frame[np.isfinite(frame["t"])].sort_values("t", kind="stable").reset_index(drop=True)
    out.attrs["unmatched"] = len(by_event) - len(out)
    return out


def delivery_delays(ctx: Context) -> pd.DataFrame:
    """Hop `delivery`: per accepted event joined to its forward: t (forwarded, epoch s),
    delay (s), part (its worker), client_id, stream_key, accepted_at. MissingInput
    without a tap or client ledger."""
    return ctx.cached("lab_latency_delivery", lambda: _delivery_delays(ctx))


def _delivery_delays(ctx: Context) -> pd.DataFrame:
    inbox = ctx.require_client("inbox")
    fwd = ctx.data.tap_records("forwarded")
    flows = conn_flows(ctx)
    r = pd.DataFrame(
        {
            "client_id": inbox["client_id"].astype("object"),
            "conn_id": pd.to_numeric(inbox["conn_id"], errors="coerce").astype("Int64"),
            "stream_key": inbox["stream_key"].astype("object"),
            "event_id": inbox["event_id"].astype("object"),
            "digest": inbox["message_digest"].astype("object"),
            "accepted_at": pd.to_numeric(inbox["accepted_at"], errors="coerce").astype("float64"),
            "part": part_of(ctx, inbox[SOURCE]) if SOURCE in inbox.columns else None,
        }
    )
    r = r.merge(flows[["client_id", "conn_id", "flow"]], on=["client_id", "conn_id"], how="left")
    # An event without an ID gets a synthetic one in the inbox (`~…`); the tap has null.
    eid = r["event_id"].where(~r["event_id"].astype(str).str.startswith("~"))
    r["key"] = text_key(r["flow"], r["digest"], eid)
    f = fwd.sort_values("t", kind="stable")
    forwards = pd.Series(
        f["t"].astype("float64").to_numpy(),
        index=text_key(f["flow"], f["digest"], f["event_id"]).to_numpy(),
    )
    forwards = forwards[~forwards.index.duplicated(keep="first")]
    r["t"] = r["key"].map(forwards).astype("float64").where(r["flow"].notna())
    out = r[r["t"].notna()].copy()
    out["delay"] = out["accepted_at"] - out["t"]
    out = out[["t", "delay", "part", "client_id", "stream_key", "accepted_at"]].reset_index(drop=True)
    out.attrs["unmatched"] = len(r) - len(out)
    return out
