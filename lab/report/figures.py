"""The report's figures, drawn with matplotlib's Agg canvas into PNG files.

Figures are built with the object API (`matplotlib.figure.Figure` on a `FigureCanvasAgg`)
rather than pyplot: no global figure state, no GUI backend, safe to call from any
process. Their look (sizes, colours, fonts) is the style sheet `figures.mplstyle` of the
`dashboards` package, applied while each figure is drawn. Each function reads a loaded
results folder (`RunData`) and the budgets, and always draws something: a figure without data says so, so the report's layout never
depends on what a run happened to record.

Files (in the run folder):
    fig-resume-latency.png   resume latency histogram, p99 and budget marked
    fig-reconnects.png       reconnect attempts per second, budget line, fault windows shaded
    fig-events-clients.png   events per second and active clients over time
    fig-faults.png           faults fired per kind (configured-but-never-fired in red)
    fig-processes.png        the lab's processes: CPU (cores) and RSS over time
    fig-capacity.png         a stepped ramp only: resume p99, events/s and reconnect QPS
                             against clients, the knee marked
    fig-fault-outcomes.png   a run where a fault fired only: per kind, fired, rejected,
                             recoveries caused, calls not ok, resume p50/p99
                             (lab.report.fault_figure)
Every time series has the run's phases shaded and named (when it has two or more).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.style
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dashboards import asset_path
from lab.checker import (
    PERCENTILE,
    Budgets,
    RunData,
    client_ends,
    configured_faults,
    count_faults,
    latencies,
    nearest_rank,
    parse_budgets,
    restart_records,
)
from lab.report import fault_figure, series
from lab.report.phase_figures import capacity_drawer, draw_processes, shade_phases

WIDTH_IN, HEIGHT_IN = 10.0, 4.2
WINDOW_COLORS = (
    "#e66101",
    "#5e3c99",
    "#1b7837",
    "#b2182b",
    "#2166ac",
    "#8c510a",
    "#c51b7d",
    "#01665e",
)
LANES_SHARE = 0.25
"""At most this share of a plot's height holds the fault lanes, one lane per fault kind
along its bottom edge: seven translucent bands across the whole height blended into one
wash and hid the data."""


@dataclass(frozen=True, slots=True)
class FigureSpec:
    name: str
    file: str
    title: str
    draw: Callable[[RunData, Budgets, Figure], None]


def _new_figure(height: float = HEIGHT_IN) -> Figure:
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def _shade_windows(ax: Axes, data: RunData, zero: float) -> None:
    """Each fault kind's windows in a lane of its own along the bottom of the plot (a
    solid bar where the kind was on), labelled in the legend; the data stays readable."""
    stopped = (data.run or {}).get("stopped_at")
    until = float(stopped) if isinstance(stopped, int | float) else math.inf
    # A window planned past the run's end (a run stopped by its event target) ends with it.
    windows = [(f, start, min(end, until)) for f, start, end in configured_faults(data.run) if start < until]
    kinds = list(dict.fromkeys(fault for fault, _, _ in windows))
    if not kinds:
        return
    lane = min(0.05, LANES_SHARE / len(kinds))
    labelled: set[str] = set()  # one legend entry per fault kind
    for fault, start, end in windows:
        i = kinds.index(fault)
        ax.axvspan(
            start - zero,
            end - zero,
            ymin=i * lane,
            ymax=(i + 0.8) * lane,
            color=WINDOW_COLORS[i % len(WINDOW_COLORS)],
            alpha=0.9,
            lw=0,
            zorder=4,
            label=None if fault in labelled else f"fault: {fault}",
        )
        labelled.add(fault)


def _mark_restarts(ax: Axes, data: RunData, zero: float) -> None:
    """Each restart of the target (restarts.jsonl): a band from the stop to the server's
    return, as lab run timed them (the report's restart section has the wire's view)."""
    recs, _ = restart_records(data.run_dir)
    labelled = False
    for r in recs:
        stop, ready = r.get("stop_sent"), r.get("ready")
        if not isinstance(stop, int | float):
            continue
        end = float(ready) if isinstance(ready, int | float) else float(stop) + 1.0
        ax.axvspan(
            float(stop) - zero,
            end - zero,
            color="#c44e52",
            alpha=0.25,
            lw=0,
            zorder=3,
            label=None if labelled else "restart: target down",
        )
        labelled = True


def _legend_outside(ax: Axes) -> None:
    """The legend beside the plot, never over its data (constrained layout makes room)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0.0)


def _per_second_steps(ax: Axes, x: np.ndarray, y: np.ndarray, color: str) -> None:
    """A value per 1 s bin [x, x+1) as a filled step line (the last bin drawn to its end)."""
    edges = np.append(x, x[-1] + 1.0)
    values = np.append(y, y[-1])
    ax.fill_between(edges, values, step="post", color=color, alpha=0.35)
    ax.step(edges, values, where="post", color=color)
    ax.set_ylim(bottom=0)


def draw_resume_latency(data: RunData, budgets: Budgets, fig: Figure) -> None:
    ax = fig.subplots()
    budget = budgets.resume_p99_s
    if data.client is None or "recoveries" in data.client_tables_absent or not len(data.client["recoveries"]):
        _empty(ax, "no recoveries recorded")
        return
    stopped = (data.run or {}).get("stopped_at")
    lat = latencies(
        data.client["recoveries"],
        budget,
        float(stopped) if isinstance(stopped, int | float) else None,
        client_ends(data),
    )
    counted = lat[~lat["censored"]]["latency"].to_numpy(dtype="float64")
    finite = counted[np.isfinite(counted)]
    never = int(np.isinf(counted).sum())
    p99 = nearest_rank(counted, PERCENTILE)
    if len(finite):
        top = max(float(finite.max()), budget) * 1.05
        ax.hist(finite, bins=50, range=(0.0, top), color="#4c72b0")
    ax.axvline(budget, color="#c44e52", linestyle="--", linewidth=2, label=f"budget {budget:g} s")
    if math.isfinite(p99):
        ax.axvline(p99, color="#222", linewidth=2, label=f"p99 {p99:.3f} s")
    elif not math.isnan(p99):
        ax.text(
            0.98,
            0.9,
            "p99 = never (over 1% never recovered)",
            ha="right",
            transform=ax.transAxes,
            color="#c44e52",
        )
    ax.set_xlabel("resume latency: loss detected -> recovered (s)")
    ax.set_ylabel("recoveries")
    ax.set_title(f"Resume latency — {len(counted)} recoveries, {never} never recovered")
    ax.legend(loc="upper right" if math.isfinite(p99) or math.isnan(p99) else "center right")


def draw_reconnects(data: RunData, budgets: Budgets, fig: Figure) -> None:
    ax = fig.subplots()
    counts = series.reconnects_per_second(data)
    zero = series.origin(data) or (float(counts.index.min()) if len(counts) else 0.0)
    if not len(counts):
        _empty(ax, "no reconnect attempts recorded")
        return
    x = counts.index.to_numpy(dtype="float64") - zero
    ax.bar(
        x,
        counts.to_numpy(),
        width=1.0,
        align="edge",
        color="#4c72b0",
        zorder=2,
        label="reconnects per second",
    )
    if budgets.reconnect_qps is not None:
        ax.axhline(
            budgets.reconnect_qps,
            color="#c44e52",
            linestyle="--",
            linewidth=2,
            label=f"budget {budgets.reconnect_qps:g}/s",
        )
    _shade_windows(ax, data, zero)
    shade_phases(ax, data, zero)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("reconnect attempts / s")
    ax.set_title(f"Reconnect attempts per second (all workers) — peak {int(counts.max())}/s")
    _legend_outside(ax)


def draw_events_clients(data: RunData, budgets: Budgets, fig: Figure) -> None:
    top, bottom = fig.subplots(2, 1, sharex=True)
    events, what = series.events_per_second(data)
    clients = series.active_clients(data)
    zero = series.origin(data) or 0.0
    if len(events):
        _per_second_steps(top, events.index.to_numpy(dtype="float64") - zero, events.to_numpy(), "#4c72b0")
        top.set_ylabel("events / s")
        top.set_title(f"{what.capitalize()} per second, and active clients")
        _shade_windows(top, data, zero)
        shade_phases(top, data, zero)
        _mark_restarts(top, data, zero)
        _legend_outside(top)
    else:
        _empty(top, "no events recorded")
    if len(clients):
        _per_second_steps(
            bottom, clients.index.to_numpy(dtype="float64") - zero, clients.to_numpy(), "#55a868"
        )
        shade_phases(bottom, data, zero)
        bottom.set_ylabel("active clients")
        bottom.set_xlabel("time since the run started (s)")
    else:
        _empty(bottom, "no client exchanges recorded")


def draw_faults(data: RunData, budgets: Budgets, fig: Figure) -> None:
    ax = fig.subplots()
    counts, never = count_faults(data)
    if not counts:
        _empty(ax, "no faults fired or configured")
        return
    names = [c.fault for c in counts]
    totals = [c.total for c in counts]
    colors = ["#c44e52" if c.fault in never else "#4c72b0" for c in counts]
    y = np.arange(len(names))
    ax.barh(y, totals, color=colors)
    ax.set_yticks(y, labels=[f"{n} (never fired)" if n in never else n for n in names])
    ax.invert_yaxis()
    for i, total in enumerate(totals):
        ax.text(total, i, f" {total}", va="center")
    ax.set_xlabel("times fired (tap + nemesis)")
    ax.set_title("Faults fired per kind")


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "resume_latency", "fig-resume-latency.png", "Resume latency distribution", draw_resume_latency
    ),
    FigureSpec("reconnects", "fig-reconnects.png", "Reconnect attempts per second", draw_reconnects),
    FigureSpec(
        "events_clients",
        "fig-events-clients.png",
        "Events per second and active clients",
        draw_events_clients,
    ),
    FigureSpec("faults", "fig-faults.png", "Faults fired per kind", draw_faults),
    FigureSpec("processes", "fig-processes.png", "Lab processes: CPU and memory", draw_processes),
)
TALL = frozenset({"events_clients", "processes", "capacity"})


def draw_all(
    data: RunData,
    out_dir: Path,
    specs: Sequence[FigureSpec] = FIGURES,
    sections: Mapping[str, object] | None = None,
) -> tuple[list[dict[str, str]], list[str], list[str]]:
    """Draw every figure into `out_dir`. Returns (figures written as {name, file, title},
    figures that failed to draw, figures that could not be written to disk), the last two
    as text: one figure failing does not stop the others. With the checker's `sections`,
    a run with a capacity ramp gets its knee figure too, and a run where a fault fired the
    figure of what each fault did (none at all for a run without faults)."""
    capacity = (sections or {}).get("capacity")
    if isinstance(capacity, Mapping):
        specs = (
            *specs,
            FigureSpec("capacity", "fig-capacity.png", "Capacity: the knee", capacity_drawer(capacity)),
        )
    outcomes = (sections or {}).get("fault_outcomes")
    if isinstance(outcomes, Mapping) and fault_figure.wanted(outcomes):
        drawer = fault_figure.fault_outcomes_drawer(outcomes)
        specs = (*specs, FigureSpec("fault_outcomes", fault_figure.FILE, fault_figure.TITLE, drawer))
    budgets = parse_budgets(data.run)
    incomplete = (data.run or {}).get("complete") is not True
    written: list[dict[str, str]] = []
    errors: list[str] = []
    unwritten: list[str] = []
    with asset_path("figures.mplstyle") as style, matplotlib.style.context(style):
        for spec in specs:
            height = HEIGHT_IN * (1.9 if spec.name == "capacity" else 1.5) if spec.name in TALL else HEIGHT_IN
            fig = _new_figure(height)
            try:
                spec.draw(data, budgets, fig)
                if incomplete:
                    # A figure travels alone (pasted into a chat, a slide): it says so itself.
                    fig.suptitle("INCOMPLETE RUN: the ledgers stop early", color="#c44e52", fontweight="bold")
            except Exception as e:
                errors.append(f"figure {spec.file}: {type(e).__name__}: {e}")
                continue
            try:
                fig.savefig(out_dir / spec.file, format="png")
            except OSError as e:
                unwritten.append(f"{spec.file}: {e.strerror or e}")
                continue
            written.append({"name": spec.name, "file": spec.file, "title": spec.title})
    return written, errors, unwritten
