"""fig-fault-outcomes.png: what each fault kind did, drawn from report.json's
`fault_outcomes` section (`lab.checker.truth.fault_outcomes`), so the picture and the
table can never disagree.

Left, per kind, four bars: fired, rejected by clients, recoveries caused, calls not ok on
its flows, on a symlog scale (a kind fires thousands of times and fails a handful of
calls: both must be readable; linear when every count is small), each bar labelled with
its count. Right, the resume
latency of the recoveries it caused: p99 as a bar, p50 as a tick, "never" in red when
the p99 lands on a recovery that never came back; the resume budget dashed. The legend
sits under the plots, never over the data. Only drawn when a fault fired
(`lab.report.figures.draw_all`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from lab.checker import Budgets, RunData

FILE = "fig-fault-outcomes.png"
TITLE = "What each fault did"

COUNTS: tuple[tuple[str, str, str], ...] = (
    ("fired", "fired", "#4c72b0"),
    ("rejected", "rejected by clients", "#dd8452"),
    ("recoveries", "recoveries caused", "#55a868"),
    ("errors", "calls not ok on its flows", "#c44e52"),
)
"""(key in a kind's record, legend label, colour) of each count bar."""
BAR = 0.8 / len(COUNTS)
NEVER_COLOR = "#c44e52"
P99_COLOR = "#8172b2"
LINEAR_UP_TO = 20
"""Counts up to this are drawn on a linear scale; beyond, symlog."""
ROW_IN = 0.55
"""Inches of height per kind (four bars and their labels)."""

type Kind = Mapping[str, Any]


def wanted(section: object) -> bool:
    """Whether the run has a figure to draw: a fault fired (or had an outcome)."""
    return isinstance(section, Mapping) and section.get("status") == "ok" and bool(section.get("kinds"))


def fault_outcomes_drawer(section: Mapping[str, Any]) -> Callable[[RunData, Budgets, Figure], None]:
    """The figure's draw function (FigureSpec.draw) for this `fault_outcomes` section."""

    def draw(data: RunData, budgets: Budgets, fig: Figure) -> None:
        kinds = [k for k in section.get("kinds") or [] if isinstance(k, Mapping)]
        fig.set_size_inches(fig.get_figwidth(), max(fig.get_figheight(), 1.8 + ROW_IN * len(kinds)))
        counts, latency = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
        y = np.arange(len(kinds), dtype="float64")
        _count_bars(counts, kinds, y)
        _latency_bars(latency, kinds, y, budgets.resume_p99_s)
        counts.set_yticks(y, labels=[str(k["fault"]) for k in kinds])
        counts.invert_yaxis()  # the first kind (by name) on top, as in the table
        handles, labels = counts.get_legend_handles_labels()
        more, more_labels = latency.get_legend_handles_labels()
        p99 = Patch(color=P99_COLOR)  # the p99 bars differ per kind (never, none): one entry for them
        fig.legend(
            [*handles, p99, *more],
            [*labels, "resume p99", *more_labels],
            loc="outside lower center",
            ncols=4,
            fontsize=8,
        )

    return draw


def _count_bars(ax: Axes, kinds: Sequence[Kind], y: np.ndarray) -> None:
    top = 1.0
    for i, (key, label, color) in enumerate(COUNTS):
        at = y - 0.4 + BAR * (i + 0.5)
        values = [k.get(key) for k in kinds]
        known = [v is not None for v in values]
        width = np.array([float(v) if v is not None else 0.0 for v in values])
        ax.barh(at[known], width[known], height=BAR, color=color, label=label)
        for yy, v in zip(at, values, strict=True):
            # Every count is written out: a bar of 3 next to one of 3,000 is hard to read.
            ax.text(max(float(v or 0), 0.0), yy, f" {v if v is not None else 'n/a'}", va="center", fontsize=7)
        top = max(top, float(width.max(initial=0.0)))
    if top > LINEAR_UP_TO:
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, top * 4)  # room for the labels right of the longest bar
        ax.set_xlabel("count (symlog scale)")
    else:
        ax.set_xlim(0, top * 1.15 + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.5 of a call
        ax.set_xlabel("count")
    ax.set_title("Per fault kind")


def _latency_bars(ax: Axes, kinds: Sequence[Kind], y: np.ndarray, budget: float) -> None:
    p99 = [_seconds(k, "p99") for k in kinds]
    finite = [v for v in p99 if v is not None and math.isfinite(v)]
    right = max([budget, *finite]) * 1.25
    for yy, k, v in zip(y, kinds, p99, strict=True):
        if v is None:
            ax.text(0.0, yy, " no recoveries", va="center", fontsize=7, color="#777")
        elif math.isinf(v):
            ax.barh(yy, right, height=0.5, color=NEVER_COLOR, alpha=0.35, hatch="//")
            ax.text(
                right / 2,
                yy,
                "never",
                va="center",
                ha="center",
                fontsize=8,
                fontweight="bold",
                color=NEVER_COLOR,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0},  # readable over the hatch
            )
        else:
            ax.barh(yy, v, height=0.5, color=P99_COLOR)
            ax.text(v, yy, f" {v:.2f} s", va="center", fontsize=7)
        p50 = _seconds(k, "p50")
        if p50 is not None and math.isfinite(p50):
            ax.plot([p50, p50], [yy - 0.3, yy + 0.3], color="#222", lw=2)
    ax.plot([], [], color="#222", lw=2, label="resume p50")
    ax.axvline(budget, color="#c44e52", linestyle="--", lw=1.5, label=f"budget {budget:g} s")
    ax.set_xlim(0, right)
    ax.set_xlabel("resume latency of the recoveries it caused (s)")
    ax.set_title("Resume latency")


def _seconds(k: Kind, which: str) -> float | None:
    """A percentile in seconds: inf when it never recovered, None when nothing to measure."""
    if k.get(f"resume_{which}_unbounded"):
        return math.inf
    value = k.get(f"resume_{which}_s")
    return float(value) if isinstance(value, int | float) else None
