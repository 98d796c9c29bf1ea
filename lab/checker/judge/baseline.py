"""Known failures: the gate and check IDs a run's client is known to fail (run.json
`client.expected_failures`, from `lab run --baseline FILE` or the scenario's
`[expected_failures]`), applied to the gates' verdicts.

A team adopts the lab before its client is perfect: a listed gate that fails is shown as
**known** and does not fail the run; a listed gate that passes is **fixed** — the run
then fails until the entry is removed (a baseline that says more than is true hides the
next regression), as the MCP conformance suite treats its baseline. A listed gate that
is inconclusive stays inconclusive (nothing is known either way). The gate's own verdict
is never changed: the report shows both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lab.checker.model import Expectation, GateResult, Verdict
from lab.checker.rules import REGISTRY


def unknown_ids(ids: Iterable[str]) -> list[str]:
    """The IDs that name no rule (read when asked: a rule registered later counts)."""
    known = REGISTRY.ids()
    return [i for i in ids if i not in known]


def expected_failures(run: dict[str, Any] | None) -> tuple[str, ...]:
    """run.json `client.expected_failures` (empty when absent or malformed)."""
    client = (run or {}).get("client")
    ids = client.get("expected_failures") if isinstance(client, dict) else None
    if not isinstance(ids, list):
        return ()
    return tuple(str(i) for i in ids if isinstance(i, str))


def apply(gates: Iterable[GateResult], expected: Iterable[str]) -> tuple[Expectation, ...]:
    """The status of each listed gate that the run judged."""
    listed = set(expected)
    out = []
    for g in gates:
        if g.gate not in listed:
            continue
        status = {Verdict.FAIL: "known", Verdict.PASS: "fixed"}.get(g.verdict, "unseen")
        out.append(Expectation(g.gate, status))
    return tuple(out)


def counted(gate: GateResult, expectations: Iterable[Expectation]) -> Verdict:
    """The gate's verdict as the run's verdict counts it: a known failure counts as a pass,
    a fixed one as a failure (the baseline must lose it)."""
    status = {e.gate: e.status for e in expectations}.get(gate.gate)
    if status == "known":
        return Verdict.PASS
    if status == "fixed":
        return Verdict.FAIL
    return gate.verdict
