"""A replay beside the run it replays: do the same rules fail, with the same culprit, and
how many of the recorded triggers fired again.

"The same failure" is a rule that failed in the original and fails in the replay, with
the same culprit: the attribution most of the original's violations carry (`server`,
`client`, ...; report.json `attribution_counts`), among the replay's. Timing is never
the same on a shared box, so a trigger "fired again" when the replay has a firing of the
same fault on the same client's same request (kind, ordinal and attempt) at the same event; a
toxic (known by its time only) when the replay added one of the same kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA = "mcpLabReplay.v1"
FILE = "replay.json"


@dataclass(frozen=True, slots=True)
class RuleOutcome:
    rule: str
    verdict: str
    culprit: str | None


def outcomes(report: dict[str, Any] | None) -> dict[str, RuleOutcome]:
    """Each rule of a report.json: its verdict and its culprit."""
    rules = (report or {}).get("rules") or {}
    out = {}
    for rule_id, r in rules.items():
        if isinstance(r, dict):
            out[str(rule_id)] = RuleOutcome(str(rule_id), str(r.get("verdict")), culprit(r))
    return out


def culprit(rule: dict[str, Any]) -> str | None:
    """The attribution most of a rule's violations carry (None without any)."""
    counts = {
        str(k): int(v)
        for k, v in (rule.get("attribution_counts") or {}).items()
        if isinstance(v, int) and v > 0
    }
    if not counts:
        return None
    return max(sorted(counts), key=lambda k: counts[k])


def failing(report: dict[str, Any] | None) -> list[RuleOutcome]:
    return [o for o in outcomes(report).values() if o.verdict == "fail"]


def same_failure(original: RuleOutcome, replay: RuleOutcome | None) -> bool:
    return replay is not None and replay.verdict == "fail" and replay.culprit == original.culprit


def trigger_key(t: dict[str, Any]) -> tuple[Any, ...]:
    fault = str(t.get("fault"))
    if t.get("by") == "time" or t.get("client") is None:
        return (fault,)
    return (
        fault, t.get("client"), t.get("request"), t.get("ordinal"), t.get("attempt") or 1, t.get("event_index")
    )  # fmt: skip


def refired(recorded: Sequence[dict[str, Any]], replayed: Sequence[dict[str, Any]]) -> int:
    """How many of `recorded` the replay met again (each replay firing counts once)."""
    left = Counter(trigger_key(t) for t in replayed)
    n = 0
    for t in recorded:
        k = trigger_key(t)
        if left[k] > 0:
            left[k] -= 1
            n += 1
    return n


def replay_json(
    original_id: str,
    replay_id: str,
    original: dict[str, Any] | None,
    replay: dict[str, Any] | None,
    recorded: Sequence[dict[str, Any]],
    replayed: Sequence[dict[str, Any]],
    *,
    clients: Sequence[str],
    pinned: int,
    by_time: int,
    not_replayed: int,
) -> dict[str, Any]:
    """replay.json: the comparison, in the replay's run folder."""
    now = outcomes(replay)
    rules = []
    for o in failing(original):
        r = now.get(o.rule)
        rules.append(
            {
                "rule": o.rule,
                "original": {"verdict": o.verdict, "culprit": o.culprit},
                "replay": None if r is None else {"verdict": r.verdict, "culprit": r.culprit},
                "same": same_failure(o, r),
            }
        )
    newly = [o.rule for o in failing(replay) if o.rule not in {x["rule"] for x in rules}]
    again = refired(recorded, replayed)
    return {
        "schema": SCHEMA,
        "original": original_id,
        "replay": replay_id,
        "clients": list(clients),
        "triggers": {
            "recorded": len(recorded),
            "pinned": pinned,
            "by_time": by_time,
            "not_replayed": not_replayed,
            "fired_again": again,
            "share_fired_again": round(again / len(recorded), 4) if recorded else None,
            "fired_in_replay": len(replayed),
        },
        "rules": rules,
        "new_failures": newly,
        "reproduced": bool(rules) and all(x["same"] for x in rules),
        # A run often fails a headline rule and, by timing, a second one; the replay may bring
        # back the first alone. Which ones came back is the answer a reader wants then.
        "reproduced_rules": [x["rule"] for x in rules if x["same"]],
        "timing": "the replay meets the same requests and events, not the same moments: a shared box "
        "never times two runs alike, so a failure that depends on timing may not come back",
    }


def reproduced_words(doc: dict[str, Any]) -> str:
    """ "reproduced", "partly reproduced: ... came back; ... did not" or "not reproduced"."""
    if doc["reproduced"]:
        return "reproduced"
    back = doc.get("reproduced_rules") or []
    if not back:
        return "not reproduced"
    gone = [r["rule"] for r in doc["rules"] if not r["same"]]
    return f"partly reproduced: {', '.join(back)} came back; {', '.join(gone)} did not"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """What `lab replay` prints."""
    t = doc["triggers"]
    share = "" if t["share_fired_again"] is None else f" ({100 * t['share_fired_again']:.1f} %)"
    lines = [
        f"clients: {len(doc['clients'])}; triggers recorded: {t['recorded']} ({t['pinned']} pinned, "
        f"{t['by_time']} by time only, {t['not_replayed']} of them not replayable); fired again: "
        f"{t['fired_again']}{share}; firings in the replay: {t['fired_in_replay']}",
    ]
    if not doc["rules"]:
        lines.append("the original run failed no rule: nothing to reproduce")
    for r in doc["rules"]:
        o, n = r["original"], r["replay"]
        now = "not judged" if n is None else f"{n['verdict']}, culprit {n['culprit'] or 'none'}"
        lines.append(
            f"{r['rule']}: {'same failure' if r['same'] else 'NOT the same'} (original: fail, culprit "
            f"{o['culprit'] or 'none'}; replay: {now})"
        )
    if doc["new_failures"]:
        lines.append(f"failing in the replay only: {', '.join(doc['new_failures'])}")
    lines.append(f"{reproduced_words(doc)} ({doc['timing']})")
    return lines
