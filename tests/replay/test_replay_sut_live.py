"""`lab replay` of a run whose clients were a client under test (`lab run --client
python-sdk`), with every real part: the run fails a gate; its replay runs the same client
(run.json and the replay's scenario say so), each of its clients scripted from the tool
calls the proxy tap saw, its fault firings pinned to their triggers, and fails the same
gate with the same culprit.

Two failures, one per culprit:
- the server's: `lab serve --defect any-origin` serves the requests whose Origin the proxy
  rewrote (`rewrite_origin` on echo): gate 4, `illegal_origin`, culprit server. (The brief's
  `--defect unknown-session-400` cannot fail with a client under test: gate 3 judges only
  the client then, from the wire, lab.checker.rules.rehandshake_sut; the run is
  inconclusive, with no 404 at all.)
- the client's: the reference server without a defect, sessions killed (`kill_session` on
  echo): the Python SDK keeps the dead session ID after the 404 and never sends a new
  `initialize` (docs/clients.md, "What the gates found"): gate 3, `missing_rehandshake`,
  culprit client.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB, ROOT, reference_server
from tests.sut.live import adapter_or_skip

pytestmark = pytest.mark.live
SCENARIO = ROOT / "tests" / "replay" / "sut-replayable.toml"


def lab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def only_run(root: Path) -> Path:
    (folder,) = sorted(p for p in root.iterdir() if p.is_dir() and (p / "run.json").exists())
    return folder


def verdict(run: Path, rule: str) -> tuple[str, str | None]:
    r = json.loads((run / "report.json").read_text())["rules"][rule]
    counts = {k: v for k, v in (r.get("attribution_counts") or {}).items() if v}
    return r["verdict"], max(sorted(counts), key=lambda k: counts[k]) if counts else None


def call_keys(run: Path) -> set[str]:
    """The idempotency keys of the run's tool calls, as the proxy saw them."""
    keys = set()
    for line in (run / "proxy" / "tap.jsonl").read_text().splitlines():
        if '"tools/call"' in line:
            rec = json.loads(line)
            if rec.get("type") == "flow" and rec.get("idempotency_key"):
                keys.add(str(rec["idempotency_key"]))
    return keys


@pytest.mark.parametrize(
    ("defect", "fault", "rule", "culprit"),
    [
        ("any-origin", "rewrite_origin", "illegal_origin", "server"),
        (None, "kill_session", "missing_rehandshake", "client"),
    ],
)
def test_a_client_under_test_replayed_fails_the_same_rule_with_the_same_culprit(
    tmp_path: Path, defect: str | None, fault: str, rule: str, culprit: str
) -> None:
    adapter_or_skip("python-sdk")
    scenario = tmp_path / "sut-replayable.toml"
    scenario.write_text(
        SCENARIO.read_text() + f'\n[[faults]]\nkind = "{fault}"\nrate = 0.2\nmatch = {{ tools = ["echo"] }}\n'
    )
    with reference_server(tmp_path, *(("--defect", defect) if defect else ()), ledger=False) as server:
        for attempt in range(2):  # the run itself may not meet the fault's case (its timing is the box's)
            runs = tmp_path / f"runs-{attempt}"
            first = lab("run", str(scenario), "--target", server.url, "--out", str(runs), "--quiet",
                        "--no-figures")  # fmt: skip
            original = only_run(runs)
            if verdict(original, rule)[0] == "fail":
                break
        assert verdict(original, rule) == ("fail", culprit), first.stdout[-3000:] + first.stderr[-3000:]
        assert first.returncode == 1
        assert json.loads((original / "run.json").read_text())["client"]["kind"] == "python-sdk"
        assert not list((original / "clients").glob("*.sqlite"))  # its operations: from the tap alone
        again = lab("replay", str(original), "--out", str(tmp_path / "replays"), "--quiet")
    said = again.stdout + again.stderr
    assert again.returncode == 1, said[-3000:]  # the replay's own verdict: a gate failed
    replay = only_run(tmp_path / "replays")
    doc = json.loads((replay / "replay.json").read_text())
    (same,) = [r for r in doc["rules"] if r["rule"] == rule]
    assert same["same"] and same["replay"] == {"verdict": "fail", "culprit": culprit}, doc["rules"]
    # The rule this test is about must come back; a second rule the original failed by its
    # timing may not (seen in CI: the original also failed client_reconnect_after_gone, a GET
    # the SDK sent with the dead session after the 404; its replay did not send one), and the
    # summary then says "partly reproduced".
    assert rule in doc["reproduced_rules"], said[-3000:]
    triggers = doc["triggers"]
    print(
        f"{rule} ({culprit}): {triggers['fired_again']} of {triggers['recorded']} triggers fired again "
        f"({triggers['share_fired_again']:.0%}), {len(doc['clients'])} clients"
    )
    assert triggers["recorded"] == triggers["pinned"] > 0 and triggers["share_fired_again"] >= 0.8, triggers
    assert (
        "replay: reproduced" in said or f"replay: partly reproduced: {rule} came back" in said
    ) and "fired again" in said
    # The same client ran the replay, its scripts to their end, under the original's client IDs.
    run = json.loads((replay / "run.json").read_text())
    assert run["client"]["kind"] == "python-sdk" and run["client"]["implementation"]["name"] == "mcp"
    assert run["end_reason"] == "scripts_done", run["end_reason"]
    written = Path(doc["scenario_file"]).read_text()
    assert 'client = "python-sdk"' in written and "[[load.clients]]" in written
    # Every call ID (the idempotency key) carries its run's own tag: the server, which lived
    # on, never took a call of the replay for a retry of the original's.
    before, after = call_keys(original), call_keys(replay)
    assert before and after and not before & after
    assert {k.split("/")[0] for k in after} <= {k.split("/")[0] for k in before}  # the same clients
