"""Faults the target made impossible to apply, said plainly rather than counted as fired.

- `kill_session`: the proxy ends a session by sending a real `DELETE` with its ID. A
  target that answers 405 does not let clients end sessions (405 is not a
  deletion receipt), so no session was ended: the fault is not applicable, and gate 3
  has no 404 it could have caused (it is then inconclusive for that reason).
  Evidence: tap `fault` records `{"fault": "kill_session", "detail": {"delete_status": 405, …}}`.
"""

from __future__ import annotations

from collections import Counter

from lab.checker.inputs.load import RunData
from lab.checker.model import NotApplicable

KILL_SESSION = "kill_session"


def _status(detail: object, key: str) -> int | None:
    value = detail.get(key) if isinstance(detail, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def not_applicable(data: RunData) -> list[NotApplicable]:
    if data.tap is None:
        return []
    faults = data.tap["fault"]
    kills = faults[faults["fault"] == KILL_SESSION]
    statuses = Counter(_status(d, "delete_status") for d in kills["detail"].tolist())
    out = []
    refused = statuses.get(405, 0)
    if refused:
        applied = sum(n for s, n in statuses.items() if s is not None and 200 <= s < 300)
        what = "every" if applied == 0 else f"{refused} of {len(kills)}"
        out.append(
            NotApplicable(
                KILL_SESSION,
                f"the target answered 405 to {what} DELETE the proxy sent to end a session: it does not "
                "let clients terminate sessions, so this fault could not end any"
                + ("" if applied == 0 else f" of those ({applied} other DELETEs were accepted)"),
                refused,
            )
        )
    return out


def kill_session_refused(data: RunData) -> tuple[int, int]:
    """(kill_session DELETEs answered 405, kill_session DELETEs accepted with 2xx)."""
    if data.tap is None:
        return 0, 0
    faults = data.tap["fault"]
    statuses = [_status(d, "delete_status") for d in faults.loc[faults["fault"] == KILL_SESSION, "detail"]]
    refused = sum(1 for s in statuses if s == 405)
    accepted = sum(1 for s in statuses if s is not None and 200 <= s < 300)
    return refused, accepted
