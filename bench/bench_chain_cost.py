"""CPU per SSE event of each part of the chain, on the release gate's own traffic, with its
faults and without them, in one run of the bench.

    python bench/bench_chain_cost.py [--scenario scenarios/gate-100k.toml] [--rounds 1]
                                     [--only faults|clean] [--before REV] [--keep]
    python bench/bench_chain_cost.py RUN_DIR [RUN_DIR ...]   # figures of finished runs

For each round it runs `lab run` twice, alternating: on the scenario as it is ("faults":
every fault family, storms, TCP toxics) and on the same scenario with its `[[faults]]` and
`[[toxics]]` taken out ("clean": the same users, mix, ticker, pacing and event target).
From each run folder it reads every process's CPU samples (processes.jsonl, 1 s apart,
each the cores the process used since the sample before) over the load phase (from
load-started.json to the last sample of a Locust worker), sums them into CPU seconds per
part, and divides by the events the tap counted (report.json `event_count`): the CPU
each part spends per event, in µs. Parts are grouped as the report groups them: the
lab's clients (the Locust workers and master), mitmdump (the addon and the tap), the
nemesis, `lab run` itself, and the target (the reference server).

With `--before REV`, every run is made twice, alternated: by this tree and by REV's
`lab/`, `dashboards/` and `addons/` (taken out with `git archive` into a temporary
folder, the addons as the `lab_addons` data package, and put first on the run's
PYTHONPATH: every part it
starts, mitmdump's addon and the Locust processes included, runs REV's code), on the
same scenario file: the code's cost on one traffic, side by side in one sitting. With
`--rev-scenario` as well, REV's runs use REV's own copy of the scenario file (`git show`):
the release gate as it was (its code and its traffic) against the gate as it is.

With `--before`, it also prints each round's ratio (now / REV) of the lab's and the
chain's figure, and their median: the box's speed drifts between rounds for both trees,
and one round has given 0.56 where three gave 0.67-0.72.

Given run folders instead, it prints the same table for each, side by side. Prints
figures only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _labrun import ROOT, export_lab, run_in_tree

GROUPS = (
    ("clients", ("worker-", "master")),
    ("mitmdump", ("mitmproxy",)),
    ("nemesis", ("nemesis",)),
    ("lab run", ("lab-run",)),
    ("target", ("server",)),
)
"""Row -> the process-name prefixes it sums (processes.jsonl `part`)."""

LAB_ROWS = ("clients", "mitmdump", "nemesis", "lab run")


def without_faults(text: str) -> str:
    """The scenario with every `[[faults]]` and `[[toxics]]` table removed (a table runs to
    the next header), and its fault-count budgets dropped: the same load, nothing injected."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        header = re.match(r"^\s*\[\[?([A-Za-z0-9_.]+)\]\]?\s*$", line)
        if header:
            skipping = line.strip() in ("[[faults]]", "[[toxics]]")
        if skipping:
            continue
        if re.match(r"^\s*(min_recoveries|min_404|min_illegal_origin)\s*=", line):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def part_group(part: str) -> str | None:
    for row, prefixes in GROUPS:
        if any(part.startswith(p) for p in prefixes):
            return row
    return None


def figures(folder: Path) -> dict[str, float]:
    """Row -> µs of CPU per event over the load phase, plus `events`, `load_s`,
    `events_per_s`, `lab`, `chain` and, from report.json, `lab_cpu_mean` (the cores the
    lab's processes used on average over the run, as the report's process table says)."""
    report = json.loads((folder / "report.json").read_text())
    events = int(report.get("event_count") or 0)
    started = json.loads((folder / "load-started.json").read_text())["at"]
    samples: list[dict[str, object]] = []
    with (folder / "processes.jsonl").open() as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "sample":
                samples.append(rec)
    interval = 1.0
    worker_times = [float(str(s["t"])) for s in samples if str(s["part"]).startswith("worker-")]
    ended = max(worker_times) if worker_times else started
    cpu: dict[str, float] = defaultdict(float)
    last: dict[int, float] = {}
    for s in samples:
        t = float(str(s["t"]))
        pid = int(str(s["pid"]))
        # Each sample is the cores used since this process's previous one: weigh it by that gap.
        gap = t - last.get(pid, t - interval)
        last[pid] = t
        if t < started or t > ended + interval:
            continue
        row = part_group(str(s["part"]))
        if row is not None:
            cpu[row] += float(str(s["cpu"])) * gap
    load_s = max(ended - started, 1e-9)
    out: dict[str, float] = {"events": events, "load_s": load_s, "events_per_s": events / load_s}
    for row, _ in GROUPS:
        out[row] = cpu[row] / events * 1e6 if events else float("nan")
    out["lab"] = sum(out[r] for r in LAB_ROWS)
    out["chain"] = out["lab"] + out["target"]
    parts = (report.get("processes") or {}).get("parts") or []
    out["lab_cpu_mean"] = sum(float(p.get("cpu_mean") or 0) for p in parts if p.get("role") == "lab")
    out["verdict"] = report.get("exit_code", -1)
    return out


def print_table(named: list[tuple[str, dict[str, float]]]) -> None:
    width = max(12, *(len(n) for n, _ in named))
    print("µs of CPU per event (load phase)".ljust(28) + "".join(n.rjust(width + 2) for n, _ in named))
    rows = [r for r, _ in GROUPS] + ["lab", "chain"]
    for row in rows:
        line = f"  {row}".ljust(28)
        line += "".join(f"{f[row]:.0f}".rjust(width + 2) for _, f in named)
        print(line)
    for key, fmt in (
        ("events", "{:.0f}"),
        ("load_s", "{:.1f}"),
        ("events_per_s", "{:.0f}"),
        ("lab_cpu_mean", "{:.2f}"),
        ("wall_s", "{:.1f}"),
        ("verdict", "{:.0f}"),
    ):
        label = {"lab_cpu_mean": "lab cores (report mean)", "verdict": "lab run exit code"}.get(key, key)
        cells = (fmt.format(f.get(key, float("nan"))).rjust(width + 2) for _, f in named)
        print(f"  {label}".ljust(28) + "".join(cells))


def ratios(named: list[tuple[str, dict[str, float]]], before: str, kind: str, row: str) -> list[float]:
    """`row`'s now/before ratio in each round of `kind` (runs named `<before>:<kind>-<n>`
    and `now:<kind>-<n>`, as main names them), in round order."""
    by_name = dict(named)
    out = []
    for name, f in named:
        if name.startswith(f"now:{kind}-"):
            then = by_name.get(f"{before}:{kind}-{name.rsplit('-', 1)[1]}")
            if then is not None and then[row] > 0:
                out.append(f[row] / then[row])
    return out


def print_ratios(named: list[tuple[str, dict[str, float]]], before: str) -> None:
    """Each round's ratio and their median: one round is not enough to tell a ratio (the
    box's speed drifts between rounds, for both trees)."""
    for kind in ("clean", "faults"):
        for row in ("lab", "chain"):
            got = ratios(named, before, kind, row)
            if got:
                cells = " ".join(f"{r:.2f}" for r in got)
                print(f"{row} now/{before}, {kind}: {cells} (median {statistics.median(got):.2f})")


def write_variants(text: str, tmp: Path, prefix: str) -> dict[str, Path]:
    """The scenario as it is ("faults") and without its faults and toxics ("clean")."""
    variants = {"faults": tmp / f"{prefix}faults.toml", "clean": tmp / f"{prefix}clean.toml"}
    variants["faults"].write_text(text, encoding="utf-8")
    variants["clean"].write_text(without_faults(text), encoding="utf-8")
    return variants


def run_one(scenario: Path, tmp: Path, name: str, tree: Path | None = None) -> tuple[Path, float]:
    folder, launched, ended = run_in_tree(scenario, tmp / f"results-{name}", tree)
    return folder, ended - launched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="finished run folders to read instead")
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "gate-100k.toml")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", choices=("faults", "clean"))
    ap.add_argument(
        "--before", metavar="REV", help="also run REV's lab/, dashboards/ and addons/, alternated"
    )
    ap.add_argument(
        "--rev-scenario",
        action="store_true",
        help="with --before: REV's runs use REV's own copy of the scenario (the release gate as it"
        " was, code and traffic), this tree's its own",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run folders (their paths are printed)")
    args = ap.parse_args()
    if args.runs:
        print_table([(p.name[:24], figures(p)) for p in args.runs])
        return
    if args.rev_scenario and not args.before:
        raise SystemExit("--rev-scenario needs --before REV")
    tmp = Path(tempfile.mkdtemp(prefix="bench-chain-cost-"))
    variants = write_variants(args.scenario.read_text(encoding="utf-8"), tmp, "")
    trees: list[tuple[str, Path | None]] = [("", None)]
    if args.before:
        trees = [(f"{args.before[:7]}:", export_lab(args.before, tmp / "before")), ("now:", None)]
    before_variants = variants
    if args.rev_scenario:
        rel = args.scenario.resolve().relative_to(ROOT).as_posix()
        old = subprocess.run(
            ["git", "show", f"{args.before}:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        before_variants = write_variants(old, tmp, "before-")
    named: list[tuple[str, dict[str, float]]] = []
    for rnd in range(args.rounds):
        for kind in ("clean", "faults"):
            if args.only and kind != args.only:
                continue
            for label, tree in trees:
                scenario = (before_variants if tree is not None else variants)[kind]
                folder, wall = run_one(scenario, tmp, f"{label.rstrip(':')}{kind}-{rnd}", tree)
                f = figures(folder)
                f["wall_s"] = wall
                print(f"{label}{kind} round {rnd + 1}: {folder} (wall {wall:.1f} s)", flush=True)
                named.append((f"{label}{kind}-{rnd + 1}", f))
    print_table(named)
    if args.before:
        print_ratios(named, args.before[:7])
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
