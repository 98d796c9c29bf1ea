"""What every `lab` command's exit code means: one table for `lab run`, `lab report`,
`lab selftest` and `lab serve`, so CI can tell a failed gate from a broken tool.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    PASS = 0
    """Every gate passed (and the run was complete)."""
    GATE_FAILED = 1
    """At least one gate failed: the target (or client under test) broke a rule."""
    INCONCLUSIVE = 2
    """Too little evidence to say, or the run was incomplete (interrupted, a part died,
    evidence unreadable). Never a pass."""
    CANNOT_RUN = 3
    """The run could not be made: a bad scenario or option, a part that did not start."""
    LAB_FAILED = 4
    """The lab itself failed: a crash, an output that could not be written, a ledger
    writer lost. Never blamed on the target."""
