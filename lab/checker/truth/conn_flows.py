"""The tap's flows by connection (`x-lab-conn` = client_id:conn_id), the one join key
between the client ledgers and the wire: for the lab's hops (lab.checker.health.lab_hops)
and for the shares of a recovery (lab.checker.truth.shares)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn


def conn_flows(ctx: Context) -> pd.DataFrame:
    """One row per (client_id, conn_id) (its first flow): client_id, conn_id (Int64),
    flow, t_request (when the proxy had the request; NaN when the tap does not record it),
    t_head (when its answer's head passed, or the flow ended without one), answered_by,
    status (NaN without an answer)."""

    def make() -> pd.DataFrame:
        tap = ctx.data.tap_records("flow").drop_duplicates("flow", keep="last")
        client, conn = split_conn(tap["conn"])
        t_request = (
            pd.to_numeric(tap["t_request"], errors="coerce").astype("float64")
            if "t_request" in tap.columns
            else pd.Series(np.nan, index=tap.index, dtype="float64")
        )
        out = pd.DataFrame(
            {
                "client_id": client,
                "conn_id": conn,
                "flow": tap["flow"].astype("object"),
                "t_request": t_request,
                "t_head": pd.to_numeric(tap["t"], errors="coerce").astype("float64"),
                "answered_by": tap["answered_by"].astype("object"),
                "status": pd.to_numeric(tap["status"], errors="coerce").astype("float64"),
            }
        )
        return out[out["client_id"].notna() & out["conn_id"].notna()].drop_duplicates(
            ["client_id", "conn_id"]
        )

    return ctx.cached("conn_flows", make)
