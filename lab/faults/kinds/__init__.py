"""The registry of fault kinds: one plug-in per kind, grouped by family in this package.

    from lab.faults.kinds import REGISTRY, kind_of

    kind_of("storm").unit          # Unit.FLOW
    [k.name for k in REGISTRY.values() if k.breaks_streams]

Adding a kind: write its class in the family module it belongs to (or a new one) as a
subclass of `lab.faults.kinds.base.FaultKind`, list an instance in that module's
`KINDS`, and regenerate docs/faults.md (`python -m lab.faults.docs --write`). The plan
and scenario validators, the addon, the checker's accounting and the docs all read it
from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lab.faults.kinds import headers, losses, sessions, storms, streams
from lab.faults.kinds.base import Evidence, FaultKind, Need, Unit

__all__ = ["NAMES", "REGISTRY", "Evidence", "FaultKind", "Need", "Unit", "kind_of"]

REGISTRY: Final[Mapping[str, FaultKind[Any]]] = {
    k.name: k
    for k in sorted(
        (*streams.KINDS, *headers.KINDS, *storms.KINDS, *losses.KINDS, *sessions.KINDS),
        key=lambda k: k.number,
    )
}
"""Every kind by name, in the order of their numbers."""

NAMES: Final = tuple(REGISTRY)


def kind_of(name: str) -> FaultKind[Any]:
    """The kind called `name` (KeyError if there is none)."""
    return REGISTRY[name]
