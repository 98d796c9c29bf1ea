"""Witnesses of a gate failing on several checks: one of each check before a second of any."""

from __future__ import annotations

import pandas as pd

from lab.checker.explain import spread_head


def test_every_check_gets_a_witness_before_any_gets_a_second() -> None:
    checks = ["event_after_response"] * 8 + ["sent_off_home"] * 3 + ["replayed_before_cursor"]
    frame = pd.DataFrame({"check": checks, "t": range(len(checks))})
    picked = spread_head(frame, 5)
    assert set(picked["check"]) == {"event_after_response", "sent_off_home", "replayed_before_cursor"}
    assert list(picked["t"]) == sorted(picked["t"])  # still in the frame's order
    assert len(picked) == 5
    # A plain head would have shown one check only: the case this guards against.
    assert set(frame.head(5)["check"]) == {"event_after_response"}


def test_a_short_frame_or_one_without_checks_is_the_plain_head() -> None:
    frame = pd.DataFrame({"check": ["a", "a", "b"], "t": [1, 2, 3]})
    assert spread_head(frame, 5).equals(frame)
    plain = pd.DataFrame({"t": range(10)})
    assert spread_head(plain, 3).equals(plain.head(3))
