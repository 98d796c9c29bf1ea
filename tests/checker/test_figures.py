"""The report's time series and figures: the isolation of figure failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from lab.checker.context import Budgets
from lab.checker.inputs.load import RunData, load_run
from lab.report.figures import FIGURES, FigureSpec, draw_all
from lab.report.series import active_clients, events_per_second
from tests.checker.builders import T0, clean_run


def _exchanges(rows: list[tuple[str, float, float]]) -> RunData:
    frame = pd.DataFrame(rows, columns=["client_id", "started_at", "ended_at"])
    return RunData(run_dir=Path("."), client={"http_exchanges": frame})


def test_active_clients_counts_each_client_once_per_second_it_touches() -> None:
    data = _exchanges(
        [
            ("a", T0 + 0.2, T0 + 2.5),  # a long stream...
            ("a", T0 + 1.1, T0 + 1.2),  # ...and a call inside it: still one client
            ("b", T0 + 2.9, T0 + 3.1),
            ("c", T0 + 5.4, T0 + 5.41),  # a 10 ms request counts for its second
        ]
    )
    counts = active_clients(data)
    assert counts.to_dict() == {
        int(T0): 1,
        int(T0) + 1: 1,
        int(T0) + 2: 2,
        int(T0) + 3: 1,
        int(T0) + 4: 0,
        int(T0) + 5: 1,
    }


def test_events_per_second_come_from_the_tap(tmp_path: Path) -> None:
    data = load_run(clean_run().sim.write(tmp_path / "run"))
    events, what = events_per_second(data)
    assert what == "events sent (tap)" and int(events.sum()) == 15


def test_a_figure_that_fails_does_not_stop_the_others(tmp_path: Path) -> None:
    data = load_run(clean_run().sim.write(tmp_path / "run"))

    def broken(data: RunData, budgets: Budgets, fig: Figure) -> None:
        raise ValueError("no axes for you")

    specs = (FigureSpec("broken", "fig-broken.png", "Broken", broken), *FIGURES)
    written, errors, unwritten = draw_all(data, tmp_path, specs)
    assert errors == ["figure fig-broken.png: ValueError: no axes for you"] and unwritten == []
    assert [f["file"] for f in written] == [s.file for s in FIGURES]
    assert not (tmp_path / "fig-broken.png").exists()
    assert all((tmp_path / s.file).stat().st_size > 1000 for s in FIGURES)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # forks on purpose
def test_figures_drawn_beside_the_judging_are_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked child draws them (lab.report.aside); the parent gets what it wrote."""
    from lab.report.aside import draw_beside

    data = load_run(clean_run().sim.write(tmp_path / "run"))
    forks: list[int] = []
    real_fork = os.fork

    def counted_fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    # The test runner has threads of its own, which keep `lab report` from forking: seen
    # from the drawer, this process is single-threaded, as `lab report` is under `lab run`.
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(os, "fork", counted_fork)
    here, aside_dir = tmp_path / "here", tmp_path / "aside"
    here.mkdir()
    aside_dir.mkdir()
    expected = draw_all(data, here)
    assert draw_beside(data, aside_dir)() == expected
    assert len(forks) == 1, "drawn by a child"
    assert sorted(p.name for p in aside_dir.iterdir()) == sorted(p.name for p in here.iterdir())


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # forks on purpose
def test_a_child_that_does_not_answer_in_time_is_stopped_and_the_parent_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lab.report.aside as aside

    data = load_run(clean_run().sim.write(tmp_path / "run"))
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # as under `lab run`
    monkeypatch.setattr(aside, "WAIT_S", 0.0)  # no child can answer that fast: it is killed
    written, errors, unwritten = aside.draw_beside(data, tmp_path)()
    assert [f["file"] for f in written] == [s.file for s in FIGURES] and errors == unwritten == []
    # Without fork (another platform): drawn here, the same.
    monkeypatch.delattr(os, "fork")
    assert aside.draw_beside(data, tmp_path)() == (written, errors, unwritten)
