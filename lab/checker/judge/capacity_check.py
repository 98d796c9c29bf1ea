"""A capacity check: a scenario that says `check = "capacity"` (docs/scenarios.md) asks
whether the target held the load, and injects no faults by design. It is judged on the
capacity rule (`lab.checker.rules.capacity`, rule 16); the rules that draw their
evidence from faults are then not applicable, and say why, instead of inconclusive
("0 of 0 404s": the run was never meant to make any).

`waive` applies that to one rule's verdict. Only an inconclusive verdict changes, and
only when every evidence minimum it lacked is one that faults make (`Evidence.from_faults`):
- a rule that judges without them (`Rule.judged_without_faults`, gate 1: every event the
  server sent and the clients accepted) and found no violation passes, with a note naming
  the evidence that was not required;
- any other is not applicable.
A violation found is a failure in a capacity check as in any run, and evidence that
faults do not make (the run's events, a client ledger, the lab not saturated) is still
required: its absence stays inconclusive.
"""

from __future__ import annotations

from dataclasses import replace

from lab.checker.inputs.phase_specs import capacity_check as declared
from lab.checker.model import GateResult, Verdict
from lab.checker.rules.base import Rule

__all__ = ["declared", "waive"]


def waive(result: GateResult, rule: Rule) -> GateResult:
    """`result` as a capacity check takes it (module docstring)."""
    if result.verdict is not Verdict.INCONCLUSIVE or result.error is not None:
        return result
    lacking = [e for e in result.evidence if not e.ok]
    if not lacking or not all(e.from_faults for e in lacking):
        return result
    names = ", ".join(e.name for e in lacking)
    if rule.judged_without_faults and result.violations == 0:
        note = f"a capacity check injects no faults by design: not required here ({names})"
        return replace(result, verdict=Verdict.PASS, notes=(*result.notes, note))
    return replace(
        result,
        verdict=Verdict.NOT_APPLICABLE,
        summary=(
            f"not applicable: a capacity check injects no faults by design, and this rule's evidence "
            f"comes from them ({names}: none); {result.summary}"
        ),
    )
