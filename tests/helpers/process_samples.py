"""A run folder's `processes.jsonl` (mcpLabProcesses.v1) written by hand, for tests of what
is read from it: the checker's lab limits, and a stall's end reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_samples(run_dir: Path, samples: list[dict[str, Any]]) -> None:
    head = {
        "type": "monitor",
        "t": samples[0]["t"],
        "schema": "mcpLabProcesses.v1",
        "interval_s": 1.0,
        "cpus": 2,
    }
    lines = [head, *samples]
    (run_dir / "processes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")


def samples(start: float, end: float, **parts: tuple[float, int, int | None]) -> list[dict[str, Any]]:
    """Once a second over [start, end): per part (cpu, fds, fd_limit)."""
    out = []
    for sec in range(int(end - start)):
        for n, (part, (cpu, fds, limit)) in enumerate(parts.items()):
            out.append(
                {
                    "type": "sample",
                    "t": start + sec + 0.5,
                    "part": part,
                    "pid": 100 + n,
                    "cpu": cpu,
                    "rss": 50_000_000,
                    "fds": fds,
                    "fd_limit": limit,
                    "threads": 2,
                }
            )
    return out
