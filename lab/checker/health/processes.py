"""The lab's own processes over a run: CPU and memory per process, and when one of them
(or the whole box) was saturated — read from `processes.jsonl` (`mcpLabProcesses.v1`,
written by `lab run`'s process monitor, docs/ledgers.md) and from Locust's own CPU
warnings in the parts' logs.

A lab process running flat out measures itself: a knee, or a latency gate that fails,
while a Locust worker or mitmdump uses >= 90 % of a core most of the time, is a limit of
the lab, not of the target (`lab.checker.health.lab_limits` says so in the verdict). So is one
that runs out of file descriptors: at its soft RLIMIT_NOFILE (the sample's `fd_limit`) a
process can neither accept nor open a connection, and the requests it should carry go
unanswered. The reference server is the *target*, not the lab: its saturation is the
target's.

    samples(ctx) -> ProcessSamples        the file, loaded once per check (cached)
    summary(s, start, end) -> rows        per process: CPU mean/p95/max, RSS, fds, threads
    saturated(s, start, end) -> list      lab processes (or the box) saturated in [start, end):
                                          by CPU, or with open fds near their limit
    cpu_peaks(s, start, end) -> dict      part -> highest CPU in [start, end)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.inputs.jsonl import LedgerError, read_jsonl
from lab.checker.model import JsonValue

FILE = "processes.jsonl"
SCHEMA = "mcpLabProcesses.v1"
RECORDS: dict[str, tuple[str, ...]] = {
    "monitor": ("t", "interval_s", "cpus"),
    "sample": ("t", "part", "pid", "cpu", "rss"),
    "host": ("t", "cpu"),
}
SATURATED_CPU = 0.9
"""A process using at least this many cores in a sample is saturated then (Locust warns at 90 %)."""
SATURATED_SHARE = 0.5
"""Saturated over a stretch of time: in at least this share of its samples there ("most of it")."""
FDS_NEAR_LIMIT = 0.8
"""A process whose open fds reached this share of its soft limit in any sample of a stretch
ran out of them there: sampled once a second, a peak between two samples is not seen, and
a process at its limit refuses connections at once (accept fails with EMFILE)."""
CPU = "cpu"
FDS = "fds"
"""Why a process is saturated (`Saturation.reason`)."""
TARGET_PARTS = ("server",)
"""Parts that are the target, not the lab (the reference server and its descendants)."""
BOX = "box"
"""The pseudo-process of the whole machine: every program on it (the monitor's `host`
records), else every process of the run together."""
LOCUST_WARNINGS = (
    re.compile(r"CPU usage above \d+%"),
    re.compile(r"CPU usage was too high"),
    re.compile(r"[Ww]orker .* exceeded cpu threshold"),
)
"""What Locust logs when one of its processes passes its 90 % CPU threshold."""


@dataclass(frozen=True, slots=True)
class LocustWarning:
    part: str
    count: int
    first: str
    """The first such line, as logged."""


@dataclass(frozen=True, slots=True)
class Saturation:
    part: str
    """A lab part (`worker-0`, `mitmproxy`, ...) or `box` (all processes on `cpus` cores)."""
    share: float
    """The share of its samples in the stretch at or above the threshold."""
    cpu_mean: float
    """Its mean CPU in the stretch (cores; for the box: all processes together)."""
    reason: str = CPU
    """`cpu` (>= SATURATED_CPU of a core most of the time) or `fds` (open fds reached
    FDS_NEAR_LIMIT of its soft limit)."""
    fds: int | None = None
    """For `fds`: the most open fds in a sample of the stretch."""
    fd_limit: int | None = None
    """For `fds`: the soft RLIMIT_NOFILE in force at that sample."""

    def short(self, cpus: int | None) -> str:
        """`nemesis: 19,870 of 20,000 file descriptors`, `mitmproxy: CPU 0.98 core`."""
        if self.reason == FDS:
            return f"{self.part}: {self.fds or 0:,} of {self.fd_limit or 0:,} file descriptors"
        if self.part == BOX:
            return f"box: {self.cpu_mean:.2f} of {cpus} cores busy ({self.share:.0%} of samples >= {SATURATED_CPU:.0%})"
        return (
            f"{self.part}: CPU {self.cpu_mean:.2f} core ({self.share:.0%} of samples >= {SATURATED_CPU:.0%})"
        )


@dataclass(frozen=True, slots=True)
class ProcessSamples:
    status: str
    """ok | missing | error"""
    frame: pd.DataFrame
    """t, part, pid, cpu, rss, fds, fd_limit, threads (one row per process per sample;
    fd_limit NaN where the file does not say)."""
    cpus: int | None = None
    interval_s: float | None = None
    error: str | None = None
    warnings: tuple[LocustWarning, ...] = ()
    notes: tuple[str, ...] = field(default=())
    host: pd.DataFrame | None = None
    """t, cpu (cores busy on the whole machine), load1: the monitor's `host` records."""

    @property
    def present(self) -> bool:
        return self.status == "ok" and len(self.frame) > 0


COLUMNS = ["t", "part", "pid", "cpu", "rss", "fds", "fd_limit", "threads"]


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object" if c == "part" else "float64") for c in COLUMNS})


def samples(ctx: Context) -> ProcessSamples:
    return ctx.cached("process_samples", lambda: load_samples(ctx.data.run_dir))


def load_samples(run_dir: Path) -> ProcessSamples:
    """The monitor's file and Locust's CPU warnings of a run folder; never raises."""
    warnings = tuple(locust_warnings(run_dir))
    path = run_dir / FILE
    if not path.is_file():
        return ProcessSamples("missing", empty_frame(), warnings=warnings)
    try:
        frames = read_jsonl(path, FILE, RECORDS, SCHEMA)
    except LedgerError as e:
        return ProcessSamples("error", empty_frame(), error=e.message, warnings=warnings)
    rows = frames.frames["sample"]
    frame = empty_frame() if not len(rows) else rows.reindex(columns=COLUMNS)
    for name in ("t", "cpu", "rss", "fds", "fd_limit", "threads", "pid"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    frame["part"] = frame["part"].astype("object")
    host = frames.frames["host"]
    host_frame = None
    if len(host):
        host_frame = pd.DataFrame(
            {
                "t": pd.to_numeric(host["t"], errors="coerce").astype("float64"),
                "cpu": pd.to_numeric(host["cpu"], errors="coerce").astype("float64"),
                "load1": pd.to_numeric(host["load1"], errors="coerce").astype("float64")
                if "load1" in host.columns
                else math.nan,
            }
        )
    head = frames.frames["monitor"]
    cpus = interval = None
    if len(head):
        first = head.iloc[0]
        cpus = int(first["cpus"]) if _number(first["cpus"]) else None
        interval = float(first["interval_s"]) if _number(first["interval_s"]) else None
    return ProcessSamples(
        "ok",
        frame.reset_index(drop=True),
        cpus,
        interval,
        warnings=warnings,
        notes=tuple(frames.notes),
        host=host_frame,
    )


def _number(value: object) -> bool:
    if isinstance(value, np.generic):
        value = value.item()
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def locust_warnings(run_dir: Path) -> list[LocustWarning]:
    """Locust's own "CPU usage above 90%" warnings in the parts' logs (logs/<part>.log)."""
    out = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        try:
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        hits = [line for line in lines if any(p.search(line) for p in LOCUST_WARNINGS)]
        if hits:
            out.append(LocustWarning(log.stem, len(hits), hits[0].strip()[:300]))
    return out


_RESTARTED = re.compile(r"(-\d+)?(-r\d+)?$")
"""A replica of a part is `<part>-<k>`, and a part started again by a restart fault
`<part>-r<n>` (lab.run.orchestrator, lab.run.restarts)."""


def is_lab(part: str) -> bool:
    """A process of the lab (not the target): anything but the reference server (its
    replicas too, and one a restart started again)."""
    return _RESTARTED.sub("", part.split("/", 1)[0]) not in TARGET_PARTS


def window(s: ProcessSamples, start: float | None, end: float | None) -> pd.DataFrame:
    f = s.frame
    mask = np.ones(len(f), dtype=bool)
    if start is not None:
        mask &= (f["t"] >= start).to_numpy()
    if end is not None:
        mask &= (f["t"] < end).to_numpy()
    return f[mask]


def summary(
    s: ProcessSamples, start: float | None = None, end: float | None = None
) -> list[dict[str, JsonValue]]:
    """Per process (part) in [start, end): samples, CPU mean/p95/max (cores), the share
    of samples saturated, peak RSS (bytes), fds (and the soft limit at that peak) and
    threads; lab processes first by name."""
    f = window(s, start, end)
    rows: list[dict[str, JsonValue]] = []
    for part, g in f.groupby("part", sort=True):
        cpu = g["cpu"].dropna().to_numpy(dtype="float64")
        rows.append(
            {
                "part": str(part),
                "role": "lab" if is_lab(str(part)) else "target",
                "pids": [int(p) for p in sorted(set(g["pid"].dropna()))],
                "samples": len(g),
                "cpu_mean": _round(float(cpu.mean())) if len(cpu) else None,
                "cpu_p95": _round(float(np.quantile(cpu, 0.95))) if len(cpu) else None,
                "cpu_max": _round(float(cpu.max())) if len(cpu) else None,
                "saturated_share": _round(float((cpu >= SATURATED_CPU).mean())) if len(cpu) else None,
                "rss_max": _int(g["rss"].max()),
                "fds_max": _int(g["fds"].max()),
                "fd_limit": _fd_limit_at_peak(g),
                "threads_max": _int(g["threads"].max()),
            }
        )
    return rows


def _fd_limit_at_peak(g: pd.DataFrame) -> int | None:
    """The soft fd limit of the sample with the most open fds (None when not recorded)."""
    known = g[g["fds"].notna() & g["fd_limit"].notna()]
    if not len(known):
        return None
    at_peak = known["fd_limit"].to_numpy(dtype="float64")[
        int(np.argmax(known["fds"].to_numpy(dtype="float64")))
    ]
    return _int(float(at_peak))


def _round(value: float) -> float:
    return round(value, 3)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else None


def saturated(
    s: ProcessSamples,
    start: float | None,
    end: float | None,
    *,
    threshold: float = SATURATED_CPU,
    share: float = SATURATED_SHARE,
) -> list[Saturation]:
    """The lab processes (not the target) that used >= `threshold` cores in at least
    `share` of their samples in [start, end), most saturated first; and `box` when all
    processes together used >= `threshold` of every core that often (the lab and the
    target then compete for the machine); then the lab processes whose open fds reached
    FDS_NEAR_LIMIT of their soft limit in a sample there (reason `fds`)."""
    f = window(s, start, end)
    out: list[Saturation] = []
    near: list[Saturation] = []
    for part, g in f.groupby("part", sort=True):
        if not is_lab(str(part)):
            continue
        cpu = g["cpu"].dropna().to_numpy(dtype="float64")
        hit = float((cpu >= threshold).mean()) if len(cpu) else 0.0
        if len(cpu) and hit >= share:
            out.append(Saturation(str(part), hit, float(cpu.mean())))
        fd = fd_pressure(g)
        if fd is not None:
            near.append(fd)
    per_tick = box_cpu(s, start, end)
    if s.cpus and len(per_tick):
        hit = float((per_tick >= threshold * s.cpus).mean())
        if hit >= share:
            out.append(Saturation(BOX, hit, float(per_tick.mean())))
    return sorted(out, key=lambda x: (-x.share, x.part)) + sorted(near, key=lambda x: x.part)


def fd_pressure(g: pd.DataFrame) -> Saturation | None:
    """One process's samples: `fds` saturation when its open fds reached FDS_NEAR_LIMIT of
    the soft limit in force (None if never, or the limit was not recorded)."""
    known = g[g["fds"].notna() & (g["fd_limit"] > 0)]
    if not len(known):
        return None
    ratio = known["fds"].to_numpy(dtype="float64") / known["fd_limit"].to_numpy(dtype="float64")
    near = ratio >= FDS_NEAR_LIMIT
    if not near.any():
        return None
    peak = known.iloc[int(np.argmax(ratio))]
    cpu = g["cpu"].dropna().to_numpy(dtype="float64")
    return Saturation(
        str(peak["part"]),
        float(near.mean()),
        float(cpu.mean()) if len(cpu) else 0.0,
        FDS,
        int(peak["fds"]),
        int(peak["fd_limit"]),
    )


def box_cpu(s: ProcessSamples, start: float | None, end: float | None) -> np.ndarray:
    """The machine's busy cores per sample in [start, end): the `host` records (every
    program on it), else the sum of the run's processes per tick."""
    if s.host is not None and len(s.host):
        h = s.host
        mask = np.ones(len(h), dtype=bool)
        if start is not None:
            mask &= (h["t"] >= start).to_numpy()
        if end is not None:
            mask &= (h["t"] < end).to_numpy()
        return h.loc[mask, "cpu"].dropna().to_numpy(dtype="float64")
    f = window(s, start, end)
    if not len(f):
        return np.array([], dtype="float64")
    return f.groupby("t")["cpu"].sum().to_numpy(dtype="float64")  # one tick: one time for all


def cpu_peaks(s: ProcessSamples, start: float | None, end: float | None) -> dict[str, float]:
    """part -> its highest CPU (cores) in [start, end)."""
    f = window(s, start, end)
    if not len(f):
        return {}
    peaks = f.groupby("part", sort=True)["cpu"].max()
    return {str(k): _round(float(v)) for k, v in peaks.items() if math.isfinite(float(v))}


def describe(sat: Saturation, cpus: int | None) -> str:
    if sat.reason == FDS:
        return (
            f"{sat.part} had {sat.fds or 0:,} file descriptors open of its limit of {sat.fd_limit or 0:,} "
            f"(>= {FDS_NEAR_LIMIT:.0%} in {sat.share:.0%} of its samples): it could not accept or open "
            "connections"
        )
    if sat.part == BOX:
        return (
            f"the box ({cpus} cores, shared by the run's processes and any other work on it) was busy "
            f">= {SATURATED_CPU:.0%} in {sat.share:.0%} of the samples (mean {sat.cpu_mean:.2f} cores)"
        )
    return (
        f"{sat.part} used >= {SATURATED_CPU:.0%} of a core in {sat.share:.0%} of its samples "
        f"(mean {sat.cpu_mean:.2f} cores)"
    )


def section(s: ProcessSamples) -> dict[str, JsonValue]:
    """report.json `processes`."""
    whole = saturated(s, None, None)
    box = box_cpu(s, None, None)
    return {
        "source": FILE,
        "status": s.status,
        "error": s.error,
        "cpus": s.cpus,
        "interval_s": s.interval_s,
        "parts": list(summary(s)),
        "box": None
        if not len(box)
        else {
            "source": "host" if s.host is not None and len(s.host) else "processes",
            "cpu_mean": _round(float(box.mean())),
            "cpu_p95": _round(float(np.quantile(box, 0.95))),
            "cpu_max": _round(float(box.max())),
            "load1_max": None
            if s.host is None or not len(s.host) or s.host["load1"].isna().all()
            else _round(float(s.host["load1"].max())),
        },
        "saturated": [saturation_json(x) for x in whole],
        "locust_cpu_warnings": [{"part": w.part, "count": w.count, "first": w.first} for w in s.warnings],
        "notes": list(s.notes),
    }


def saturation_json(x: Saturation) -> dict[str, JsonValue]:
    """report.json's form of one saturated process: part, reason, share, cpu_mean, and for
    `fds` the peak open fds and the limit."""
    out: dict[str, JsonValue] = {
        "part": x.part,
        "reason": x.reason,
        "share": _round(x.share),
        "cpu_mean": _round(x.cpu_mean),
    }
    if x.reason == FDS:
        out |= {"fds": x.fds, "fd_limit": x.fd_limit}
    return out


def saturation_phrases(run_dir: Path, start: float, end: float) -> list[str]:
    """The lab's processes (and the box) saturated in [start, end), one phrase each, from
    the run's `processes.jsonl`; [] without the file or when nothing was. Never raises on
    a damaged file (it is then "error", not present)."""
    samples = load_samples(run_dir)
    if not samples.present:
        return []
    return [describe(x, samples.cpus) for x in saturated(samples, start, end)]
