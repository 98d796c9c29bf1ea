"""The report's time series and figures: the isolation of figure failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from lab.checker import fault_outcomes_of
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
    # Every run's figures, and what each fault did (its section computed in the child).
    expected = draw_all(data, here, sections={"fault_outcomes": fault_outcomes_of(data)})
    assert "fig-fault-outcomes.png" in [f["file"] for f in expected[0]]
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


def test_seven_fault_kinds_get_a_lane_each_and_the_legend_stays_off_the_data(tmp_path: Path) -> None:
    from itertools import pairwise

    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    from lab.checker.context import parse_budgets
    from lab.report.figures import WINDOW_COLORS, _new_figure, draw_reconnects

    run = clean_run()
    kinds = [f"kind{i}" for i in range(7)]
    # Overlapping windows of seven kinds (two for the first): they used to blend into one wash.
    run.sim.fault_windows = [
        {"fault": k, "start": T0 + 0.01 * i, "end": T0 + 0.01 * i + 0.05} for i, k in enumerate(kinds)
    ]
    run.sim.fault_windows.append({"fault": "kind0", "start": T0 + 0.08, "end": T0 + 0.09})
    # Planned far past the run's end (a run stopped by its event target): drawn to the end only.
    run.sim.fault_windows.append({"fault": "kind6", "start": T0 + 0.1, "end": T0 + 10_000.0})
    data = load_run(run.sim.write(tmp_path / "run"))
    fig = _new_figure()
    draw_reconnects(data, parse_budgets(data.run), fig)
    fig.canvas.draw()
    (ax,) = fig.axes
    lane_colours = {to_rgb(c): n for n, c in enumerate(WINDOW_COLORS)}
    lanes: dict[int, set[tuple[float, float]]] = {}
    for patch in ax.patches:
        n = lane_colours.get(to_rgb(patch.get_facecolor()))
        if n is not None and isinstance(patch, Rectangle):  # a fault window: y in the plot's height (0..1)
            lanes.setdefault(n, set()).add(
                (round(patch.get_y(), 6), round(patch.get_y() + patch.get_height(), 6))
            )
    assert sorted(lanes) == list(range(7)) and all(len(ys) == 1 for ys in lanes.values()), lanes
    bands = sorted(next(iter(ys)) for ys in lanes.values())
    assert all(a[1] <= b[0] for a, b in pairwise(bands)), bands  # apart
    assert bands[-1][1] <= 0.25  # the lanes keep to the bottom quarter
    assert ax.get_xlim()[1] < 1000  # the 10,000 s window did not stretch the time axis
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert sorted(x for x in labels if x.startswith("fault: ")) == [f"fault: {k}" for k in kinds]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # beside
