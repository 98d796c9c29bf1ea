"""What the benches that drive a whole `lab run` share: starting it on a scenario they
wrote, finding the run folder it makes, and the port each part of the chain listens on.

The chain a run builds is clients -> nemesis -> mitmdump (the addon) -> reference server;
every part listens on a port the OS picked (port 0), so a bench learns them from the run
folder once the parts say they are up: the server's and mitmdump's ready lines in their
logs, the nemesis's `proxy_created` record in nemesis.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))

HOPS = ("nemesis", "mitmproxy", "server")
"""The chain's listening parts, nearest the clients first."""

READY_LINES = (
    ("server", "logs/server.log", "lab-serve listening on "),
    ("mitmproxy", "logs/mitmproxy.log", " listening on "),
)


def start_run(
    scenario: Path, out: Path, *, env: Mapping[str, str] | None = None, report: bool = True
) -> subprocess.Popen[bytes]:
    """`lab run SCENARIO --out OUT --quiet` (and `--no-report` unless `report`), from the
    repository's root; the caller waits for it (and may watch the run folder meanwhile)."""
    argv = [LAB, "run", str(scenario), "--out", str(out), "--quiet"]
    if not report:
        argv.append("--no-report")
    return subprocess.Popen(argv, cwd=ROOT, env=None if env is None else dict(env))


def export_tree(rev: str, into: Path, *paths: str) -> Path:
    """`paths` (folders of the repository) as they are at commit `rev`, as files under
    `into` (made if needed), by `git archive`: nothing in the work tree changes."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *paths], cwd=ROOT, capture_output=True, check=True
    ).stdout
    (into / "tree.tar").write_bytes(archive)
    with tarfile.open(into / "tree.tar") as t:
        t.extractall(into, filter="data")
    return into


def export_lab(rev: str, into: Path) -> Path:
    """REV's lab/, dashboards/ (its report's template: REV's report code with this tree's
    template failed) and addons/ (as the data package `lab_addons`) under `into`: put
    first on a run's PYTHONPATH, every part the run starts runs REV's code."""
    export_tree(rev, into, "lab", "dashboards", "addons")
    (into / "addons").rename(into / "lab_addons")
    return into


def run_in_tree(scenario: Path, out: Path, tree: Path | None = None) -> tuple[Path, float, float]:
    """`lab run SCENARIO --out OUT` to its end, by this tree or, given `tree`
    (`export_lab`), by that tree's code (first on every part's PYTHONPATH): the run
    folder, and when the run was launched and when it ended (epoch seconds). SystemExit
    if it wrote no report."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    launched = time.time()
    code = start_run(scenario, out, env=env).wait()
    ended = time.time()
    folder = run_folder(out)
    if folder is None or not (folder / "report.json").is_file():
        raise SystemExit(f"lab run exited {code} without a report under {out}")
    return folder, launched, ended


def run_folder(out: Path) -> Path | None:
    """The run folder `lab run --out OUT` made (the first, by name), None before it exists."""
    if not out.is_dir():
        return None
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    return folders[0] if folders else None


def listening(folder: Path) -> dict[str, tuple[str, int]]:
    """part -> (host, port) of each part of the chain that has said it listens (so far)."""
    found: dict[str, tuple[str, int]] = {}
    for part, log, marker in READY_LINES:
        path = folder / log
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if marker in line and "http://" in line:
                hostport = _hostport(line.split("http://", 1)[1].split("/", 1)[0])
                if hostport is not None:
                    found[part] = hostport
                break
    try:
        lines = (folder / "nemesis.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line still being written
        if (
            isinstance(rec, dict)
            and rec.get("type") == "proxy_created"
            and isinstance(rec.get("listen"), str)
        ):
            hostport = _hostport(rec["listen"])
            if hostport is not None:
                found["nemesis"] = hostport
            break
    return found


def _hostport(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    return (host, int(port)) if port.isdigit() else None
