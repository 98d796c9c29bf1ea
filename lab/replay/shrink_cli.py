"""`lab shrink RUN_DIR [--rule ID] [--k 2 --n 3] [--budget-s 300]`: the smallest scenario that
still fails the run's rule the same way (lab.replay.shrink), written as a scenario file with
a short report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from lab.cliargs import whole
from lab.exitcodes import ExitCode

_count = whole(1, 9, "runs")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, got {text!r}") from None
    if not 10 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"10..86400 seconds, got {value:g}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "shrink",
        help="the smallest scenario that still fails a failing run's rule the same way",
        description=(
            "From a failing run: replays ever smaller parts of it (its fault firings pinned to their "
            "triggers, its clients, their operations; delta debugging) and keeps a smaller one only if it "
            "fails the same rule with the same culprit in K of N runs. Writes the smallest as a scenario "
            "file (`lab run shrunk.toml --target ...` fails the rule) with shrink.md and shrink.json. "
            "Exit code: 1 a failing reproducer was written, 2 the failure could not be reproduced, 3 "
            "cannot shrink (a passing run, bad input), 4 the lab failed."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a failing run folder of `lab run`")
    p.add_argument(
        "--rule",
        help="the rule to keep failing (an ID of report.json `rules`; default: the first that failed)",
    )
    p.add_argument(
        "--k", type=_count, default=2, help="runs of a candidate that must fail the rule (default 2)"
    )
    p.add_argument("--n", type=_count, default=3, help="runs a candidate gets at most (default 3)")
    p.add_argument("--budget-s", type=_seconds, default=300.0, help="seconds to spend at most (default 300)")
    p.add_argument("--target", help="'reference' or an MCP endpoint URL (default: the run's target)")
    p.add_argument("--out", type=Path, default=Path("results"), help="results root (default: ./results)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=shrink_command)


def shrink_command(args: argparse.Namespace) -> int:
    from lab.replay.recorded import ReplayError

    try:
        return _shrink(args)
    except ReplayError as e:
        print(f"lab shrink: cannot shrink, nothing was started: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN


def _shrink(args: argparse.Namespace) -> int:
    from lab import topology
    from lab.replay.compare import failing
    from lab.replay.recorded import ReplayError, read_recorded
    from lab.replay.shrink import Oracle, shrink
    from lab.runfolder import replace_file

    if args.k > args.n:
        raise ReplayError(
            f"--k {args.k} is more than --n {args.n}: a candidate cannot fail in more runs than it gets"
        )
    rec = read_recorded(args.run_dir)
    if rec.report is None:
        raise ReplayError(f"{args.run_dir}: no report.json: run `lab report {args.run_dir}` first")
    failed = sorted(failing(rec.report), key=lambda o: _number(rec.report, o.rule))
    if not failed:
        raise ReplayError(
            f"{args.run_dir}: the run failed no rule (verdict {rec.report.get('verdict')}): there is no failure to shrink"
        )
    chosen = next((o for o in failed if o.rule == args.rule), None) if args.rule else failed[0]
    if chosen is None:
        raise ReplayError(
            f"--rule {args.rule}: not a rule the run failed (it failed: {', '.join(o.rule for o in failed)})"
        )
    client = rec.client  # every candidate runs the run's own client
    target = args.target or rec.target
    if not target:
        raise ReplayError(f"{args.run_dir}: run.json names no target: give --target")
    folder = args.out / "shrinks" / f"{rec.run_id}-{time.strftime('%Y%m%dT%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    say = (lambda _: None) if args.quiet else (lambda line: print(f"shrink: {line}", flush=True))
    began = time.monotonic()
    oracle = Oracle(
        rec, chosen.rule, chosen.culprit, target=str(target), folder=folder, k=args.k, n=args.n,
        deadline=began + args.budget_s, lab=topology.LOCAL.program("lab"), say=say, client=client,
    )  # fmt: skip
    result = shrink(rec, chosen.rule, oracle, say)
    took = time.monotonic() - began
    counted = rec.report.get("event_count")
    doc = _shrink_json(
        rec.run_id, result, oracle, took, target=str(target), k=args.k, n=args.n,
        events=counted if isinstance(counted, int) else None,
    )  # fmt: skip
    doc["client"] = "cmd" if client.startswith("cmd:") else client  # as run.json says it: no command
    if result.best is not None:
        oracle.write(result.best, folder / "shrunk.toml")
        doc["scenario_file"] = str(folder / "shrunk.toml")
    replace_file(folder / "shrink.json", json.dumps(doc, indent=2) + "\n")
    replace_file(folder / "shrink.md", _shrink_md(doc))
    for line in _summary(doc):
        print(f"shrink: {line}")
    if result.best is not None:
        print(f"shrink: scenario {folder / 'shrunk.toml'}")
    print(f"shrink: report {folder / 'shrink.md'}")
    return ExitCode.GATE_FAILED if result.best is not None else ExitCode.INCONCLUSIVE


def _number(report: dict[str, Any] | None, rule: str) -> int:
    value = ((report or {}).get("rules") or {}).get(rule, {}).get("number")
    return value if isinstance(value, int) else 1_000


def _size(c: Any, events: int | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "clients": [s.id for s in c.scripts],
        "triggers": [t.get("sentence") or f"{t.get('fault')} on {t.get('client')}" for t in c.triggers],
        "operations": c.ops,
        "events": events,
    }


def _events_of_smallest(oracle: Any) -> int | None:
    """The event count of the smallest candidate's runs (the last accepted: the one kept),
    their median; None when no run of it reported one."""
    accepted = [t for t in oracle.trials if t.accepted]
    counts = sorted(accepted[-1].events) if accepted else []
    return counts[len(counts) // 2] if counts else None


def _shrink_json(
    run_id: str, result: Any, oracle: Any, took: float, *, target: str, k: int, n: int, events: int | None
) -> dict[str, Any]:
    return {
        "schema": "mcpLabShrink.v1",
        "original": run_id,
        "rule": result.rule,
        "culprit": result.culprit,
        "target": target,
        "k_of_n": [k, n],
        "stopped": result.stopped if result.best is not None else "not_reproduced",
        "seconds": round(took, 1),
        "runs": oracle.runs,
        "from": _size(result.original, events),
        "started_at": _size(result.start, None),
        "shrunk": _size(result.best, _events_of_smallest(oracle)),
        "candidates": [
            {
                "number": t.number,
                "size": t.size,
                "outcomes": t.outcomes,
                "accepted": t.accepted,
                "seconds": t.seconds,
                "events": t.events,
                "pinned": t.pinned,
                "fired_again": t.fired_again,
            }
            for t in oracle.trials
        ],
    }


def _summary(doc: dict[str, Any]) -> list[str]:
    before, after = doc["from"], doc["shrunk"]
    lines = [
        f"rule {doc['rule']} (culprit {doc['culprit']}), {len(doc['candidates'])} candidates, {doc['runs']} runs, "
        f"{doc['seconds']:.0f} s"
    ]
    if after is None:
        lines.append(
            f"not reproduced: the replay of the run did not fail {doc['rule']} in {doc['k_of_n'][0]} of {doc['k_of_n'][1]} runs; nothing written"
        )
        return lines
    lines.append(
        f"{len(before['clients'])} -> {len(after['clients'])} clients, {len(before['triggers'])} -> "
        f"{len(after['triggers'])} fault triggers, {before['operations']} -> {after['operations']} operations, "
        f"{_n(before['events'])} -> {_n(after['events'])} events"
        + (" (the budget ran out: the best so far)" if doc["stopped"] == "budget" else "")
    )
    return lines


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _shrink_md(doc: dict[str, Any]) -> str:
    out = [f"# Shrink of {doc['original']}: rule {doc['rule']}", ""]
    out += [f"- {line}" for line in _summary(doc)]
    after = doc["shrunk"]
    if after is not None:
        out += ["", "## The smallest failing scenario", ""]
        out += [f"- clients: {', '.join(after['clients'])}", f"- operations: {after['operations']}"]
        out += ["- fault triggers:"] + [f"  - {t}" for t in after["triggers"] or ["none"]]
        out += ["", f"Run it: `lab run {doc.get('scenario_file')} --target {doc['target']}`"]
    out += [
        "",
        "## Candidates",
        "",
        "| # | size | runs (verdict/culprit) | kept | s |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for c in doc["candidates"]:
        out.append(
            f"| {c['number']} | {c['size']} | {', '.join(c['outcomes'])} | {'yes' if c['accepted'] else 'no'} | {c['seconds']:.0f} |"
        )
    return "\n".join(out) + "\n"
