"""The replay's scenario, from a recorded run: its clients scripted as they ran, its faults
pinned to the triggers they fired on.

Kept from the original file: the target, the tokens, the ticker, the reconnect policy, the
budgets, the seed the run used. Changed:
- `[load]`: the recorded clients as `[[load.clients]]` (each with its operations and their
  start times), one worker, no event target (the scripts end the run); the duration is
  the last start plus a margin; `client` the run's own (run.json `client`: a client under
  test is replayed as itself, whatever the file said before `lab run --client` overrode
  it). `[[phases]]` go (a scripted run has none);
- `[[faults]]`: one rule per original rule that fired, with its kind, ID, match and
  params, pinned (`at`) to the triggers chosen; rules that never fired go. A firing known
  by its time only (no lab client's request) cannot be pinned: it is counted, not
  replayed;
- `[[toxics]]` stay on their time windows (the fallback: a toxic touches no request),
  unless the chosen faults leave every toxic out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.faults.kinds import REGISTRY, Unit
from lab.load.settings import ClientScript
from lab.replay.recorded import Recorded, ReplayError
from lab.scenario.write import client_tables

TOXIC_PREFIX = "toxic:"
MARGIN_S = 30.0
"""After the last operation's start, the time a replay may still take (its calls, leaving)."""
NOT_REPLAYED_BY_SCRIPTS = ("users", "spawn_rate", "event_target", "wait_min", "wait_max", "mix", "until_knee")
"""`[load]` keys a scripted run does without."""


@dataclass
class Selection:
    """What a replay keeps of the run."""

    clients: list[str] = field(default_factory=list)
    triggers: list[dict[str, Any]] = field(default_factory=list)
    """The recorded firings chosen (pinned ones and toxics)."""
    pinned: int = 0
    by_time: int = 0
    """Firings known by their time only: toxics (kept on their windows) and the others (not replayed)."""
    not_replayed: int = 0
    rules: list[str] = field(default_factory=list)
    """The pinned rules' IDs."""
    toxics: bool = False


def rule_ids(faults: Sequence[dict[str, Any]]) -> list[str]:
    """Each `[[faults]]` table's rule ID, as the scenario reader gives it (`kind#index`
    when the table names none)."""
    return [str(t.get("id") or f"{t.get('kind')}#{i}") for i, t in enumerate(faults)]


def choose_triggers(triggers: Sequence[dict[str, Any]], faults: Iterable[str] | None) -> list[dict[str, Any]]:
    """The firings `faults` names: a fault kind (`cut_stream`, `toxic:latency`), a rule ID
    (`cut_stream#4`) or a firing's line in fault_triggers.jsonl (`7`); all when None."""
    if faults is None:
        return list(triggers)
    wanted = set(faults)
    chosen = []
    for line, t in enumerate(triggers, 1):
        names = {str(t.get("fault")), str(t.get("rule")), str(line)}
        if names & wanted:
            chosen.append(t)
    known = {str(t.get("fault")) for t in triggers} | {str(t.get("rule")) for t in triggers}
    unknown = sorted(
        w for w in wanted if w not in known and not (w.isdigit() and 1 <= int(w) <= len(triggers))
    )
    if unknown:
        raise ReplayError(
            f"--faults names what never fired in the run: {', '.join(unknown)} (it fired: "
            f"{', '.join(sorted(k for k in known if k != 'None')) or 'nothing'}; or give a line of fault_triggers.jsonl)"
        )
    return chosen


def replay_scenario(
    rec: Recorded, clients: Iterable[str] | None = None, faults: Iterable[str] | None = None
) -> tuple[dict[str, Any], Selection]:
    """The replay's scenario (TOML data) and what it kept."""
    scripts = list(rec.scripts)
    if clients is not None:
        wanted = list(dict.fromkeys(clients))
        have = {s.id for s in scripts}
        missing = [c for c in wanted if c not in have]
        if missing:
            raise ReplayError(
                f"--clients names clients that did nothing in the run: {', '.join(missing)} "
                f"(its clients: {_some(sorted(have))})"
            )
        scripts = [s for s in scripts if s.id in set(wanted)]
    if not scripts:
        raise ReplayError(f"{rec.run_dir}: no client of the run performed an operation: nothing to replay")
    kept = {s.id for s in scripts}
    chosen = [
        t for t in choose_triggers(rec.triggers, faults)
        if t.get("client") is None or t.get("client") in kept
    ]  # fmt: skip
    return scenario_for(rec, scripts, chosen)


def scenario_for(
    rec: Recorded, scripts: Sequence[ClientScript], chosen: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], Selection]:
    """The scenario of exactly these scripted clients and these recorded firings (what
    `lab shrink` tries), and what it kept."""
    doc = copy.deepcopy(rec.scenario)
    sel = Selection(clients=[s.id for s in scripts])
    doc["seed"] = int(rec.run.get("seed", doc.get("seed", 0)) or 0)
    doc.pop("phases", None)
    doc["load"] = _scripted_load(doc.get("load") or {}, scripts, rec.client)
    doc["faults"] = _pinned_faults(list(doc.get("faults") or []), chosen, sel)
    if not doc["faults"]:
        doc.pop("faults")
    sel.toxics = any(is_toxic(t) for t in chosen)
    if not sel.toxics:
        doc.pop("toxics", None)
    sel.triggers = [t for t in chosen if t.get("by") != "time" or (sel.toxics and is_toxic(t))]
    return doc, sel


def _scripted_load(load: dict[str, Any], scripts: Sequence[ClientScript], client: str) -> dict[str, Any]:
    out = {k: v for k, v in load.items() if k not in NOT_REPLAYED_BY_SCRIPTS}
    if client == "lab":
        out.pop("client", None)  # the default: the lab's own clients
    else:
        out["client"] = client
    out["workers"] = 1
    last = max((s.at[-1] for s in scripts if s.at), default=0.0)
    out["duration"] = f"{int(last + MARGIN_S) + 1}s"
    out["hard_timeout"] = f"{2 * (int(last + MARGIN_S) + 1) + 60}s"
    out["clients"] = client_tables(scripts)
    return out


def _pinned_faults(
    tables: list[dict[str, Any]], chosen: Sequence[dict[str, Any]], sel: Selection
) -> list[dict[str, Any]]:
    ids = rule_ids(tables)
    pins: dict[str, list[dict[str, Any]]] = {}
    for t in chosen:
        if is_toxic(t):
            sel.by_time += 1
            continue
        if t.get("by") == "time" or t.get("client") is None or t.get("rule") not in ids:
            sel.by_time += 1
            sel.not_replayed += 1
            continue
        pin: dict[str, Any] = {"client": t["client"], "request": t["request"], "ordinal": int(t["ordinal"])}
        if int(t.get("attempt") or 1) > 1:
            pin["attempt"] = int(t["attempt"])
        kind = REGISTRY.get(str(t.get("fault")))
        # (A flow-level kind acting on an event is pinned to its request.)
        if t.get("event_index") is not None and kind is not None and kind.unit is Unit.EVENT:
            pin["event"] = int(t["event_index"])
        at = pins.setdefault(str(t["rule"]), [])
        if pin not in at:
            at.append(pin)
        sel.pinned += 1
    out = []
    for rid, table in zip(ids, tables, strict=True):
        if rid not in pins:
            continue
        rule = {k: v for k, v in table.items() if k not in ("rate", "window", "phase")}
        rule["id"] = rid
        rule["at"] = pins[rid]
        out.append(rule)
        sel.rules.append(rid)
    return out


def is_toxic(t: dict[str, Any]) -> bool:
    """A firing of a TCP toxic (known by its time only; kept on its window)."""
    return str(t.get("fault", "")).startswith(TOXIC_PREFIX)


def _some(names: Sequence[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
