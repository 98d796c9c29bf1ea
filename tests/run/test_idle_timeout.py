"""A proxy's idle timeout in front of the reference server (the nemesis's `idle_timeout`
toxic), with every real part: against a server that sends no keepalive, the proxy cuts
the quiet standalone streams and the lab's clients resume them (PASS, with recoveries);
the same run against a server whose keepalive comments come more often than the timeout
has nothing cut (no recovery: the resume gate has no evidence). The toxic is what makes
the difference.

The profile's 60 s preset is `scenarios/proxy-profiles.toml`; here the timeout is 1.5 s
so that the runs stay short."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live

SCENARIO = """
description = "idle timeout 1.5 s, server keepalive {keepalive}"
seed = 27

[target]
kind = "reference"
keepalive = "{keepalive}"

[load]
users = 3
spawn_rate = 3
duration = "7s"
hard_timeout = "40s"
wait_min = "300ms"
wait_max = "600ms"

[load.mix]
read = 1

[reconnect]
read_timeout = "30s"   # the client's own read timeout must not come first

[[toxics]]
kind = "idle_timeout"
attributes = {{ timeout = 1500 }}
"""


def run(tmp_path: Path, keepalive: str) -> subprocess.Popen[str]:
    path = tmp_path / f"idle-{keepalive}.toml"
    path.write_text(SCENARIO.format(keepalive=keepalive))
    out = tmp_path / f"results-{keepalive}"
    argv = [LAB, "run", str(path), "--out", str(out), "--quiet", "--no-figures"]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def report(tmp_path: Path, keepalive: str) -> dict[str, object]:
    (path,) = (tmp_path / f"results-{keepalive}").glob("*/report.json")
    doc: dict[str, object] = json.loads(path.read_text())
    return doc


def test_quiet_streams_are_cut_by_the_proxy_and_resumed_and_kept_alive_ones_are_not(tmp_path: Path) -> None:
    quiet, kept = run(tmp_path, "0s"), run(tmp_path, "500ms")
    said = {k: p.communicate(timeout=120)[0] for k, p in (("quiet", quiet), ("kept", kept))}
    # (Gates without a fault of their family here, 3 and 4, are inconclusive: exit 2.)
    assert quiet.returncode in (0, 2), said["quiet"][-3000:]
    rules = report(tmp_path, "0s")["rules"]
    assert isinstance(rules, dict)
    assert not [k for k, r in rules.items() if r["verdict"] == "fail"], said["quiet"][-3000:]
    assert rules["resume_p99"]["verdict"] == "pass", rules["resume_p99"]
    resumed = rules["resume_p99"]["measured"]["recoveries"]
    assert resumed >= 3, resumed  # every client's standalone stream, at least once
    # Kept alive: no stream falls quiet for 1.5 s, so the proxy cuts nothing.
    kept_rules = report(tmp_path, "500ms")["rules"]
    assert isinstance(kept_rules, dict)
    assert kept_rules["resume_p99"]["measured"]["recoveries"] == 0, said["kept"][-2000:]
    assert kept_rules["resume_p99"]["verdict"] == "inconclusive"
