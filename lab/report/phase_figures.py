"""Figures of a run's timeline: its phases shaded on every time series, the lab's own
processes (CPU and memory), and a capacity ramp's knee.

    shade_phases(ax, data, zero)   the phases as bands with their names (2+ phases)
    draw_processes                 fig-processes.png: CPU (cores) and RSS per process
    capacity_drawer(section)       fig-capacity.png: resume p99, events/s and reconnect
                                   QPS against clients, the knee marked (ramps only)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from lab.checker import SATURATED_CPU, Budgets, RunData, load_samples, phase_specs

PHASE_COLORS = ("#f2f2f2", "#e3ecf7")
KIND_COLORS = {"faults": "#fbe3d6", "recovery": "#e2f0d9", "ramp": "#fff2cc"}
MIB = 1024 * 1024


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def shade_phases(ax: Axes, data: RunData, zero: float) -> None:
    """The run's phases as background bands, named at the top (nothing for one phase)."""
    specs = [p for p in phase_specs(data.run) if p.reached]
    if len(specs) < 2:
        return
    for i, p in enumerate(specs):
        color = KIND_COLORS.get(p.kind, PHASE_COLORS[i % 2])
        ax.axvspan(p.start - zero, p.end - zero, color=color, alpha=0.6, zorder=-1, lw=0)
        ax.text(
            (p.start + p.end) / 2 - zero,
            0.98,
            p.name,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=8,
            color="#444",
            clip_on=True,
        )


def draw_processes(data: RunData, budgets: Budgets, fig: Figure) -> None:
    top, bottom = fig.subplots(2, 1, sharex=True)
    s = load_samples(data.run_dir)
    if not s.present:
        _empty(top, f"no process samples ({s.error or 'processes.jsonl ' + s.status})")
        _empty(bottom, "")
        return
    started = (data.run or {}).get("started_at")
    zero = float(started) if isinstance(started, int | float) else float(s.frame["t"].min())
    for part, g in s.frame.groupby("part", sort=True):
        x = g["t"].to_numpy(dtype="float64") - zero
        top.plot(x, g["cpu"].to_numpy(dtype="float64"), label=str(part), lw=1.2)
        bottom.plot(x, g["rss"].to_numpy(dtype="float64") / MIB, label=str(part), lw=1.2)
    top.axhline(
        SATURATED_CPU, color="#c44e52", linestyle="--", lw=1.5, label=f"{SATURATED_CPU:.0%} of a core"
    )
    top.set_ylabel("CPU (cores)")
    top.set_title(f"Lab processes: CPU and memory ({s.cpus} cores on this box)")
    top.set_ylim(top=max(1.0, float(s.frame["cpu"].max()) * 1.15))
    fig.legend(*top.get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    bottom.set_ylabel("RSS (MiB)")
    bottom.set_ylim(0, float(s.frame["rss"].max()) / MIB * 1.15)
    bottom.set_xlabel("time since the run started (s)")
    shade_phases(top, data, zero)
    shade_phases(bottom, data, zero)


def capacity_drawer(section: Mapping[str, Any]) -> Callable[[RunData, Budgets, Figure], None]:
    """fig-capacity.png from report.json's `capacity` section (the checker's steps)."""

    def draw(data: RunData, budgets: Budgets, fig: Figure) -> None:
        axes = fig.subplots(3, 1, sharex=True)
        steps = [s for s in section.get("steps") or [] if s.get("users") is not None]
        if not steps:
            _empty(axes[0], "no step of the ramp was reached")
            return
        users = np.array([s["users"] for s in steps], dtype="float64")
        p99 = np.array(
            [np.nan if s.get("resume_p99_s") is None else s["resume_p99_s"] for s in steps], dtype="float64"
        )
        never = [s.get("resume_p99_unbounded") for s in steps]
        rows: list[tuple[Axes, np.ndarray, str, str]] = [
            (axes[0], p99, "resume p99 (s)", "#4c72b0"),
            (
                axes[1],
                np.array([s.get("events_per_s") or 0 for s in steps], dtype="float64"),
                "events / s",
                "#55a868",
            ),
            (
                axes[2],
                np.array([s.get("reconnect_qps_peak") or 0 for s in steps], dtype="float64"),
                "reconnects / s (peak)",
                "#8172b2",
            ),
        ]
        for ax, y, label, color in rows:
            ax.plot(users, y, marker="o", color=color)
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
        for x, unbounded in zip(users, never, strict=True):
            if unbounded:
                axes[0].annotate(
                    "never", (x, 0), textcoords="offset points", xytext=(0, 8), ha="center", color="#c44e52"
                )
        budget = (section.get("budgets") or {}).get("resume_p99_s")
        if budget is not None:
            axes[0].axhline(budget, color="#c44e52", linestyle="--", lw=1.5, label=f"budget {budget:g} s")
        qps = (section.get("budgets") or {}).get("reconnect_qps")
        if qps is not None:
            axes[2].axhline(qps, color="#c44e52", linestyle="--", lw=1.5, label=f"budget {qps:g}/s")
        knee = section.get("knee_users")
        limited = section.get("limited_by") == "lab"
        if knee is not None:
            for ax in axes:
                ax.axvline(knee, color="#222" if not limited else "#ef6c00", lw=2, linestyle=":")
            label = f"knee {knee} clients" + (" (limited by the lab)" if limited else "")
            axes[0].plot([], [], color="#222" if not limited else "#ef6c00", linestyle=":", lw=2, label=label)
        for ax in axes:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="upper left", fontsize=8)
        for ax, y, bound in ((axes[0], p99, budget), (axes[2], rows[2][1], qps)):
            finite = y[np.isfinite(y)]
            top = max([*finite.tolist(), *([bound] if bound is not None else []), 0.1])
            ax.set_ylim(0, top * 1.15)
        axes[2].set_xlabel("clients (step)")
        lab = section.get("limited_by_lab")
        who = {
            "lab": f"limited by the lab ({', '.join(lab.get('processes', []))})"
            if isinstance(lab, Mapping)
            else "lab",
            "target": "limited by the target",
            "unclear": "no process was CPU-bound",
        }.get(str(section.get("limited_by")), "no knee passed")
        where = f"knee at {knee} clients" if knee is not None else "no step held"
        axes[0].set_title(f"Capacity: {where} — {who}")

    return draw
