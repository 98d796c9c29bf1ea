"""A worker's spawn message builds Locust's argument parser once per process, not once
per option (lab.load.locust_spawn). Locust is imported in a process of its own
(tests/helpers/locust_spawn.py): it monkey-patches the whole process for gevent."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.livesrv import ROOT


def spawn_costs() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.helpers.locust_spawn"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_spawn_message_builds_one_parser_per_process_not_one_per_option() -> None:
    r = spawn_costs()
    # Locust still does it: if this turns false, the cache is moot and can go.
    assert r["locust_calls_it_per_message"]
    # Without the cache every option of the message builds the whole parser (~90)...
    assert r["options"] > 50
    assert r["builds_without_cache"] == r["options"]
    # ... with it, three messages build it once, and keep the same options.
    assert r["applied"]
    assert r["builds_with_cache_3_messages"] == 1
    assert r["same_kept"]
    assert r["kept"] == ["exclude_tags", "expect_workers", "lab_custom", "tags"]
    assert not r["change_leaked"]
