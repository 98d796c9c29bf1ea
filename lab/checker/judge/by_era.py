"""Every rule judged again on one protocol era's part of a run of both (report.json
`eras.gates`).

A run of both eras judges every client, whatever its era, as one population: that is the
run's verdict. A server whose modern path breaks its handshake path (or the reverse)
shows there as one failure among many rows; here it shows as one era's verdict going
wrong while the other's holds. Each era's part of the run is the run's ledgers cut to the
clients that spoke it (`lab.checker.truth.eras.client_eras`), and each rule of that era
judges it as it judges a whole run:

- the client ledger: the rows of those clients (`client_id`);
- the proxy tap: the flows of those clients (`x-lab-conn` names the client; a flow of no
  lab client goes by its `MCP-Protocol-Version`), and every record of those flows;
- the server ledger: the rows of those clients' connections (`conn`), else of their
  sessions (a row with neither is in both parts);
- run.json says that one era; the nemesis log and everything else are the run's own.

These verdicts are figures: they never change the run's verdict or exit code. The
evidence minima are the run's, so an era's part may be too thin to judge (inconclusive)
where the whole run was not. A cross-era leak (an event of a handshake client's stream
accepted by a modern client) is the whole run's rule to find: each part sees one era.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.inputs.load import RunData
from lab.checker.model import GateResult, JsonValue
from lab.checker.rules.base import Rule
from lab.checker.truth.eras import ERAS, client_eras
from lab.wire.revisions import MODERN_REVISIONS

Judge = Callable[[Rule, Context], GateResult]


def era_data(data: RunData, era: str, era_of: dict[str, str]) -> RunData:
    """The run's ledgers cut to the part `era`'s clients made (module docstring)."""
    flow_era: dict[str, str] = {}
    session_era: dict[str, str] = {}
    tap = None
    if data.tap is not None and "flow" in data.tap:
        flows = data.tap["flow"]
        versions = flows["protocol_version_in"] if "protocol_version_in" in flows.columns else None
        by_version = (
            versions.astype("object").isin(MODERN_REVISIONS)
            if versions is not None
            else pd.Series(False, index=flows.index)
        )
        clients = split_conn(flows["conn"])[0].tolist()
        by_wire = ["modern" if modern else "handshake" for modern in by_version.tolist()]
        eras = [
            era_of.get(c, wire) if isinstance(c, str) else wire
            for c, wire in zip(clients, by_wire, strict=True)
        ]
        flow_era = dict(zip(flows["flow"].astype(str).tolist(), eras, strict=True))
        for column in ("session", "session_out"):
            if column not in flows.columns:
                continue
            for s, e in zip(flows[column].tolist(), eras, strict=True):
                if isinstance(s, str):
                    session_era.setdefault(s, e)
        tap = {kind: _of_flows(frame, era, flow_era) for kind, frame in data.tap.items()}
    client = None
    if data.client is not None:
        sessions = data.client.get("sessions")
        if sessions is not None and {"session", "client_id"} <= set(sessions.columns):
            for s, c in zip(sessions["session"].tolist(), sessions["client_id"].tolist(), strict=True):
                if isinstance(s, str) and str(c) in era_of:
                    session_era.setdefault(s, era_of[str(c)])
        client = {
            name: frame[frame["client_id"].astype(str).map(era_of).eq(era)]
            if "client_id" in frame.columns
            else frame
            for name, frame in data.client.items()
        }
    server = None
    if data.server is not None:
        server = {name: _of_server(frame, era, era_of, session_era) for name, frame in data.server.items()}
    run = dict(data.run or {})
    target = run.get("target")
    run["target"] = {**(target if isinstance(target, dict) else {}), "era": era}
    return dataclasses.replace(data, client=client, tap=tap, server=server, run=run)


def _of_flows(frame: pd.DataFrame, era: str, flow_era: dict[str, str]) -> pd.DataFrame:
    """A tap frame's rows of `era`'s flows; rows of no flow (the plan, a fault without
    one) are in every part."""
    if "flow" not in frame.columns or not len(frame):
        return frame
    owner = frame["flow"].map(lambda f: flow_era.get(str(f)) if isinstance(f, str) else None)
    return frame[owner.isna() | owner.eq(era)]


MODERN_SESSION = "modern"
"""The server ledger's `session` of a modern-era row (that era has none: docs/ledgers.md)."""


def _of_server(
    frame: pd.DataFrame, era: str, era_of: dict[str, str], session_era: dict[str, str]
) -> pd.DataFrame:
    if not len(frame):
        return frame
    owner = pd.Series([None] * len(frame), index=frame.index, dtype="object")
    if "session" in frame.columns:
        owner = frame["session"].map(
            lambda s: (
                ("modern" if s == MODERN_SESSION else session_era.get(s)) if isinstance(s, str) else None
            )
        )
    if "conn" in frame.columns:
        by_conn = split_conn(frame["conn"])[0].map(lambda c: era_of.get(c) if isinstance(c, str) else None)
        owner = by_conn.where(by_conn.notna(), owner)
    return frame[owner.isna() | owner.eq(era)]


def gates(ctx: Context, rules: Sequence[Rule], judge: Judge) -> list[JsonValue]:
    """Per rule of the run, its verdict in each era's part (None where the rule is not of
    that era): `{gate, number, title, by_era: {era: {verdict, violations, server, client,
    summary}}}`."""
    era_of = client_eras(ctx)
    spoken = set(era_of.values())
    parts = {
        era: Context(era_data(ctx.data, era, era_of), ctx.budgets, ctx.witness_limit)
        for era in ERAS
        if era in spoken
    }
    out: list[JsonValue] = []
    for rule in rules:
        by_era: dict[str, JsonValue] = {}
        for era in ERAS:
            part = parts.get(era)
            if part is None or era not in rule.eras:
                by_era[era] = None
                continue
            r = judge(rule, part)
            counts = r.attribution_counts or {}
            by_era[era] = {
                "verdict": str(r.verdict),
                "violations": r.violations,
                "server": int(counts.get("server", 0)),
                "client": int(counts.get("client", 0)),
                "summary": r.summary,
            }
        out.append({"gate": rule.id, "number": rule.number, "title": rule.title, "by_era": by_era})
    return out
