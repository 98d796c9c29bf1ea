"""What a short `lab run` costs around its load: the time to start the chain and Locust,
to notice the end, to stop the parts and to write the report.

    python bench/bench_run_overhead.py [--rounds 3] [--before REV]

Every `lab replay`, every candidate of `lab shrink`, every live test and every
`lab selftest` case is a short run, where these fixed costs are most of the wall time.
The bench runs one scripted client for about 2 s (six calls, no fault) against the
reference server, `--rounds` times, and splits each run's wall time by what its run
folder says:

- **start**: `lab run` launched -> the load started (load-started.json): imports, the
  preflight, the server, mitmdump and the nemesis, the Locust master and its worker;
- **load**: the load started -> `lab run` asked the parts to stop (the mtime of
  `stop-requested`): the script itself, plus the time to notice it had ended;
- **stop**: -> the run was recorded as stopped (run.json `stopped_at`);
- **report**: -> `lab run` exited (the checker and the report's files).

With `--before REV`, each round also runs REV's `lab/`, `dashboards/` and `addons/`
(first on the run's PYTHONPATH, as bench_chain_cost.py does), alternated with this tree,
both trees compiled to bytecode first: the two side by side on one box in one sitting.
Prints figures only (medians over the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _labrun import ROOT, export_lab, run_in_tree

SCENARIO = """\
description = "bench_run_overhead: one scripted client, six calls over about 2 s"
seed = 7

[target]
kind = "reference"

[load]
duration = "30s"
hard_timeout = "60s"
workers = 1

[[load.clients]]
id = "c1"
ops = ["read", "stream", "write", "read", "stream", "write"]
at = [0.0, 0.4, 0.8, 1.2, 1.6, 2.0]
"""

PHASES = ("start", "load", "stop", "report", "wall")


def phases(folder: Path, launched: float, ended: float) -> dict[str, float]:
    """The run's wall time split as the module docstring says (epoch seconds in, s out)."""
    load_at = float(json.loads((folder / "load-started.json").read_text())["at"])
    stop_asked = (folder / "stop-requested").stat().st_mtime
    stopped = float(json.loads((folder / "run.json").read_text())["stopped_at"])
    return {
        "start": load_at - launched,
        "load": stop_asked - load_at,
        "stop": stopped - stop_asked,
        "report": ended - stopped,
        "wall": ended - launched,
    }


def run_once(scenario: Path, out: Path, tree: Path | None) -> dict[str, float]:
    return phases(*run_in_tree(scenario, out, tree))


def compile_tree(*folders: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *map(str, folders)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--before", metavar="REV", help="also run REV's lab/, dashboards/ and addons/, alternated"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        scenario = tmp / "short.toml"
        scenario.write_text(SCENARIO, encoding="utf-8")
        trees: list[tuple[str, Path | None]] = [("now", None)]
        if args.before:
            trees.insert(0, (args.before[:7], export_lab(args.before, tmp / "before")))
        compile_tree(*(t for _, t in trees if t is not None), ROOT / "lab", ROOT / "addons")
        figures: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            for name, tree in trees:
                got = run_once(scenario, tmp / f"out-{name}-{r}", tree)
                figures[name].append(got)
                print(f"round {r + 1} {name:>8}: " + "  ".join(f"{k} {got[k]:5.2f} s" for k in PHASES))
        print(f"\nmedian of {args.rounds} round(s), seconds:")
        print(f"{'tree':>8} " + " ".join(f"{k:>7}" for k in PHASES))
        medians = {
            n: {k: statistics.median(f[k] for f in figs) for k in PHASES} for n, figs in figures.items()
        }
        for name, m in medians.items():
            print(f"{name:>8} " + " ".join(f"{m[k]:7.2f}" for k in PHASES))
        if args.before:
            old, new = medians[trees[0][0]], medians["now"]
            print(
                f"{'now/then':>8} "
                + " ".join(f"{new[k] / old[k]:7.2f}" if old[k] else "      -" for k in PHASES)
            )


if __name__ == "__main__":
    main()
