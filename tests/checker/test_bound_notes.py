"""What a target sent past the lab's bounds is said in the report's notes (the target's
doing): connections the clients closed on a message over their bound, streams the proxy
gave up on an event over its own. A run that hit neither says nothing of them."""

from __future__ import annotations

from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from tests.checker.builders import clean_run


def test_a_clean_run_has_no_bound_note(tmp_path: Path) -> None:
    _, report = judge_dir(clean_run().sim.write(tmp_path / "run"))
    assert not [n for n in report.notes if "bound" in n]


def test_messages_over_the_bounds_are_noted_with_their_counts(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.exchange("a", 90, "call", "POST", "post:9", 200)
    sim.client_rows["http_exchanges"][-1]["error"] = "message_too_large"
    oversize = {"type": "oversize", "flow": "f-big", "t": sim.t, "index": 3, "chars": 33554500}
    sim.tap.append({**oversize, "limit": 33554432})
    _, report = judge_dir(sim.write(tmp_path / "run"))
    notes = [n for n in report.notes if "bound" in n]
    assert len(notes) == 2, report.notes
    assert "closed 1 connection(s)" in notes[0] and "message_too_large" in notes[0]
    assert "gave up 1 stream(s)" in notes[1] and "33,554,432 characters" in notes[1]
