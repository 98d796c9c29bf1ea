"""Client check 7 — a resumption carries the last event ID seen on *that* stream.

From the wire alone (lab.checker.truth.client_wire), for a client under test:
- `cursor_not_last_seen`: a GET with Last-Event-ID whose cursor is not the last event ID
  the proxy forwarded to the client on the stream it resumes (the intended stream: the
  one that carried that ID to it) before the GET — an older event's ID, which makes the
  server replay what the client already had;
- `cursor_never_seen`: a GET with a Last-Event-ID the client was never sent;
- `resume_without_cursor`: a GET without Last-Event-ID sent to get a stream back while
  the session's standalone stream was still open (so it re-opens nothing but resumes a
  stream without its cursor), or re-opening a standalone stream on which the client had
  been sent event IDs (whose events it thereby gives up).

Attribution: client. Evidence: at least one resumption or re-opened stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, present, row_of, short
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import HANDSHAKE_ONLY, Rule
from lab.checker.truth import client_wire

TRUTH_FROM = "the wire (the proxy's record): the IDs forwarded to each client and the Last-Event-ID it sent"


def findings(ctx: Context) -> pd.DataFrame:
    flows = client_wire.flows(ctx)
    fwd = ctx.data.tap_records("forwarded")
    fwd = fwd[fwd["event_id"].notna()]
    stream_of = dict(zip(flows["flow"].tolist(), flows["stream_flow"].tolist(), strict=True))
    seen = pd.DataFrame(
        {
            "stream_flow": fwd["flow"].map(stream_of),
            "t": fwd["t"].astype("float64"),
            "event_id": fwd["event_id"].astype("object"),
        }
    ).dropna(subset=["stream_flow"])
    seen = seen.sort_values("t", kind="stable")
    by_stream = {s: g for s, g in seen.groupby("stream_flow", sort=False)}
    rows: list[dict[str, Any]] = []
    for r in client_wire.records(flows[flows["method"] == "GET"]):
        if present(r["cursor"]):
            if r["stream_flow"] == r["flow"]:
                rows.append(_row(r, "cursor_never_seen", None))
                continue
            got = by_stream.get(r["stream_flow"])
            before = got[got["t"] < r["t_req"]] if got is not None else None
            last = before["event_id"].iloc[-1] if before is not None and len(before) else None
            if last is not None and last != r["cursor"]:
                rows.append(_row(r, "cursor_not_last_seen", last))
    for a in client_wire.records(client_wire.attempts(ctx)):
        if a["kind"] != "reopen":
            continue
        mine = flows[flows["flow"] == a["flow"]].iloc[0]
        prev = flows[flows["flow"] == a["previous"]].iloc[0]
        if not present(prev["end_t"]) or prev["end_t"] > mine["t_req"]:
            rows.append(
                _row(mine, "resume_without_cursor", None, "the session's standalone stream was still open")
            )
        elif len(by_stream.get(prev["stream_flow"], ())):
            rows.append(
                _row(
                    mine,
                    "resume_without_cursor",
                    None,
                    "it had been sent event IDs on the stream it re-opens",
                )
            )
    return pd.DataFrame(
        rows, columns=["check", "flow", "client_id", "t_req", "cursor", "last_seen", "why", "tap_line"]
    )


def _row(r: Mapping[str, Any] | pd.Series, check: str, last: object, why: str = "") -> dict[str, Any]:
    get = r.get
    return {
        "check": check,
        "flow": get("flow"),
        "client_id": get("client_id"),
        "t_req": get("t_req"),
        "cursor": get("cursor"),
        "last_seen": last,
        "why": why,
        "tap_line": get("tap_line"),
    }


def check(ctx: Context) -> GateResult:
    bad = findings(ctx)
    att = client_wire.attempts(ctx)
    tried = int(att["kind"].isin(("resume", "reopen")).sum())
    evidence = [Evidence("resumptions", 1, tried, tried >= 1, "GETs that get a stream back, on the wire")]
    by_check = {str(k): int(v) for k, v in bad["check"].value_counts().items()}
    return GateResult(
        verdict=decide(len(bad) > 0, evidence),
        summary=f"{len(bad)} of {tried} resumptions without the last event ID seen on that stream",
        budget={"violations_max": 0},
        measured={"resumptions": tried, **by_check},
        evidence=tuple(evidence),
        violations=len(bad),
        witnesses=tuple(_witness(r, ctx) for _, r in bad.head(ctx.witness_limit).iterrows()),
        attribution_counts={"client": len(bad)},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, ctx: Context) -> Witness:
    check = str(r["check"])
    when = at(r["t_req"], ctx.origin)
    if check == "cursor_not_last_seen":
        text = (
            f"client {r['client_id']} resumed {when} with Last-Event-ID {short(r['cursor'], 48)}, but the last "
            f"event it had been sent on that stream was {short(r['last_seen'], 48)}"
        )
    elif check == "cursor_never_seen":
        text = f"client {r['client_id']} resumed {when} with Last-Event-ID {short(r['cursor'], 48)}, an ID it was never sent"
    else:
        text = f"client {r['client_id']} sent a GET without Last-Event-ID {when} to get a stream back: {r['why']}"
    fields = row_of(r, ["client_id", "flow", "t_req", "cursor", "last_seen"])
    return Witness(check, text, Attribution.CLIENT, fields, tuple(client_wire.ref(r)))


RULE = Rule(
    id="client_resume_cursor",
    number=9,
    title="Resumption uses the last event ID of that stream",
    blames=(Attribution.CLIENT,),
    evidence="resumptions on the wire",
    check=None,
    check_under_test=check,
    eras=HANDSHAKE_ONLY,
    era_note="it has no SSE event IDs and no resumption (no Last-Event-ID)",
)
