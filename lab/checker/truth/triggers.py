"""Every fault that fired, by the logical trigger the next run can meet again.

A run decides each fault from its seed and the flow's key (the client's `x-lab-conn`),
not from the clock; what a later run can meet again is therefore the request, not the
moment. So each firing is named by:
- the client whose request it hit (the `x-lab-conn` before its last `:`), the request's
  kind (`POST tools/call ticker`, `POST initialize`, `GET`, `GET resume` (a GET with a
  `Last-Event-ID`), `DELETE`) and its ordinal among that client's requests of that kind,
  in the order the proxy saw them (`t_request`, else `t`, then the tap's line), a re-send
  of a call (its idempotency key seen before) being its call's next attempt, not a new
  ordinal (lab.faults.pins: the proxy counts the same way);
- for an event fault (a `forwarded` or `dropped` record), the event's index in the
  stream the client was sent (`index`): "cut_stream at event 3 of the 2nd
  `POST tools/call ticker` of client w0-u4";
- the phase it fired in and its time since the run started.

`by` says which: `event`, `request`, or `time` — a nemesis toxic (it touches no request:
it sits in front of every connection) and a firing on a request of no lab client (no
`x-lab-conn`) are known by their time only, the fallback, marked as such.

One row per firing, as the fault counts count them (lab.checker.truth.faults): a flow's
`faults` entry, the first `forwarded`/`dropped` record of each decision, a `fault` record
(a session race names the flow it raced), a `toxic_added`. `lab report` writes them to
`fault_triggers.jsonl` (schema `mcpLabTriggers.v1`, docs/report.md) and sums them up in
report.json `fault_triggers`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from lab.checker.context import Context, split_conn
from lab.checker.explain import present
from lab.checker.inputs.jsonl import LINE
from lab.checker.inputs.load import RunData
from lab.checker.inputs.phase_specs import PhaseSpec, number, phase_specs
from lab.checker.model import JsonValue
from lab.checker.truth.faults import TOXIC_PREFIX, firings
from lab.faults.pins import Ordinals, request_kind

SCHEMA = "mcpLabTriggers.v1"
FILE = "fault_triggers.jsonl"
EXAMPLES = 5
"""Sentences report.json shows (the file has every row)."""


@dataclass(frozen=True, slots=True)
class Trigger:
    fault: str
    rule: str | None
    decision: str | None
    by: str
    """`event`, `request` or `time` (module docstring)."""
    client: str | None
    request: str | None
    """The request's kind (module docstring)."""
    ordinal: int | None
    """1-based, among the client's requests of that kind."""
    attempt: int | None
    """1 for a call's first send, 2 for its first re-send..."""
    conn: str | None
    """The `x-lab-conn` the decision was keyed on."""
    event_index: int | None
    phase: str | None
    at_s: float | None
    """Seconds since the run started."""
    source: str
    """Where it was read: `tap` or `nemesis`."""
    line: int | None
    """The line of that file (1-based)."""

    def sentence(self) -> str:
        at = "" if self.at_s is None else f"{self.at_s:.1f} s into the run"
        phase = f" (phase {self.phase})" if self.phase else ""
        if self.by == "time":
            what = "added" if self.fault.startswith(TOXIC_PREFIX) else "fired"
            return f"{self.fault} {what} {at or 'at an unknown time'}{phase}, by time only"
        request = f"the {_nth(self.ordinal)} `{self.request}` of client {self.client}"
        if self.attempt and self.attempt > 1:
            request += f" (its {_nth(self.attempt)} attempt)"
        if self.by == "event":
            return f"{self.fault} at event {self.event_index} of {request}"
        return f"{self.fault} on {request}"


def triggers(ctx: Context) -> list[Trigger]:
    """Every firing of the run (module docstring), in time order; once per judging."""
    return ctx.cached("fault_triggers", lambda: _triggers(ctx))


def _triggers(ctx: Context) -> list[Trigger]:
    data = ctx.data
    run = data.run or {}
    started = number(run.get("started_at"))
    phases = phase_specs(run)
    rows: list[tuple[float, Trigger]] = []
    if data.tap is not None:
        requests = _requests(data.tap["flow"])
        rows += _tap_firings(data.tap, requests, started, phases)
    if data.nemesis is not None and len(data.nemesis):
        added = data.nemesis[data.nemesis["type"] == "toxic_added"]
        for t, kind, line in zip(added["t"], added["kind"], _lines(added), strict=True):
            at = _since(t, started)
            rows.append(
                (
                    number(t) or float("inf"),
                    Trigger(
                        f"{TOXIC_PREFIX}{kind}", None, None, "time", None, None, None, None, None, None,
                        _phase(t, phases), at, "nemesis", _int(line),
                    ),
                )
            )  # fmt: skip
    rows.sort(key=lambda r: (r[0], r[1].source, r[1].line or 0))
    return [t for _, t in rows]


def _requests(flows: pd.DataFrame) -> dict[object, Request]:
    """Per tap flow: its client, conn, request kind, ordinal and attempt."""
    client, _ = split_conn(flows["conn"])
    asked = flows["t_request"] if "t_request" in flows.columns else flows["t"]
    when = pd.to_numeric(asked, errors="coerce").fillna(pd.to_numeric(flows["t"], errors="coerce"))
    none = pd.Series([None] * len(flows), index=flows.index)
    tools = flows["tool"] if "tool" in flows.columns else none
    keys = flows["idempotency_key"] if "idempotency_key" in flows.columns else none
    out = pd.DataFrame(
        {
            "flow": flows["flow"].to_numpy(dtype=object),
            "client": client.to_numpy(dtype=object),
            "conn": flows["conn"].to_numpy(dtype=object),
            "request": [
                _kind(m, rpc, tool, cursor)
                for m, rpc, tool, cursor in zip(
                    flows["method"], flows["jsonrpc_method"], tools, flows["last_event_id_in"], strict=True
                )
            ],
            "key": keys.to_numpy(dtype=object),
            "when": when.to_numpy(dtype="float64"),
            "line": flows[LINE].to_numpy() if LINE in flows.columns else np.arange(1, len(flows) + 1),
        }
    )
    out = out[out["client"].notna()].sort_values(["when", "line"], kind="stable")
    counted = Ordinals()
    found: dict[object, Request] = {}
    for flow, c, conn, request, key in zip(
        out["flow"], out["client"], out["conn"], out["request"], out["key"], strict=True
    ):
        if flow not in found:
            ordinal, attempt = counted.count(str(c), str(request), str(key) if present(key) else None)
            found[flow] = (str(c), str(conn), str(request), ordinal, attempt)
    # A flow of no lab client (no `x-lab-conn`) is known by its time only.
    return found


def _kind(method: object, rpc: object, tool: object, cursor: object) -> str:
    """The request kind a pinned fault names (lab.faults.pins), from the tap's columns."""
    return request_kind(
        str(method) if present(method) else None,
        str(rpc) if present(rpc) else None,
        str(tool) if present(tool) else None,
        present(cursor),
    )


Request = tuple[str | None, str | None, str | None, int | None, int | None]
"""(client, conn, request kind, ordinal, attempt) of a tap flow."""


def _tap_firings(
    tap: dict[str, pd.DataFrame],
    requests: dict[object, Request],
    started: float | None,
    phases: list[PhaseSpec],
) -> list[tuple[float, Trigger]]:
    rows: list[tuple[float, Trigger]] = []

    def add(
        t: object, fault: object, rule: object, decision: object, flow: object, index: object, line: object
    ) -> None:
        client, conn, request, ordinal, attempt = requests.get(flow, (None, None, None, None, None))
        by = ("event" if present(index) else "request") if client is not None else "time"
        trigger = Trigger(
            str(fault),
            _text(rule),
            _text(decision),
            by,
            client,
            request if client is not None else None,
            ordinal if client is not None else None,
            attempt if client is not None else None,
            conn,
            _int(index),
            _phase(t, phases),
            _since(t, started),
            "tap",
            _int(line),
        )
        rows.append((number(t) or float("inf"), trigger))

    flows = tap["flow"]
    for flow, t, faults, line in zip(flows["flow"], flows["t"], flows["faults"], _lines(flows), strict=True):
        for f in faults if isinstance(faults, list) else ():
            if isinstance(f, dict) and present(f.get("fault")):
                add(t, f.get("fault"), f.get("rule"), f.get("decision"), flow, None, line)
    for kind in ("forwarded", "dropped"):
        hit = firings(tap[kind])
        for t, fault, rule, decision, flow, index, line in zip(
            hit["t"], hit["fault"], hit["rule"], hit["decision"], hit["flow"], hit["index"], _lines(hit),
            strict=True,
        ):  # fmt: skip
            add(t, fault, rule, decision, flow, index, line)
    races = tap["fault"]
    for t, fault, rule, decision, flow, line in zip(
        races["t"],
        races["fault"],
        races["rule"],
        races["decision"],
        races["flow"],
        _lines(races),
        strict=True,
    ):
        add(t, fault, rule, decision, flow, None, line)
    return rows


def _lines(frame: pd.DataFrame) -> list[object]:
    return frame[LINE].tolist() if LINE in frame.columns else [None] * len(frame)


def _phase(t: object, phases: list[PhaseSpec]) -> str | None:
    value = number(t)
    if value is None:
        return None
    for p in phases:
        if p.start <= value < p.end or (p is phases[-1] and value >= p.start):
            return p.name
    return None


def _since(t: object, started: float | None) -> float | None:
    value = number(t)
    return None if value is None or started is None else round(value - started, 3)


def _int(value: object) -> int | None:
    number_ = number(value)
    return None if number_ is None else int(number_)


def _text(value: object) -> str | None:
    return str(value) if present(value) else None


def _nth(n: int | None) -> str:
    if n is None:
        return "?"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# ---------------------------------------------------------------------------- outputs


def row_json(t: Trigger) -> dict[str, JsonValue]:
    row: dict[str, JsonValue] = {"schema": SCHEMA, **asdict(t)}
    row["sentence"] = t.sentence()
    return row


def jsonl(rows: list[Trigger]) -> str:
    """`fault_triggers.jsonl`: one line per firing."""
    return "".join(json.dumps(row_json(t), allow_nan=False) + "\n" for t in rows)


def jsonl_of(data: RunData) -> str:
    """`jsonl` of loaded ledgers, without a judging's Context (for `lab report`'s writer)."""
    from lab.checker.context import parse_budgets

    return jsonl(triggers(Context(data, parse_budgets(data.run), 0)))


def section(ctx: Context) -> dict[str, JsonValue]:
    """report.json `fault_triggers`: how many firings, by what they are known, a few in
    words; every row is in `fault_triggers.jsonl`."""
    rows = triggers(ctx)
    by = Counter(t.by for t in rows)
    return {
        "file": FILE,
        "schema": SCHEMA,
        "firings": len(rows),
        "by": {k: by.get(k, 0) for k in ("event", "request", "time")},
        "examples": [t.sentence() for t in rows[:EXAMPLES]],
    }
