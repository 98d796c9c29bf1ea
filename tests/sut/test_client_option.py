"""Choosing the client of a run: `[load] client`, `[expected_failures]`, `--baseline FILE`
and `--client`, each refused with the file, the key and what was expected; an adapter that
cannot run here is refused before anything starts (exit 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.checker import REGISTRY
from lab.checker.judge.baseline import apply, counted
from lab.checker.model import GateResult, Verdict
from lab.run.sut import ClientRefused, ClientUnderTest, check_era, resolve
from lab.scenario import ScenarioError, load_baseline, load_scenario
from tests.livesrv import LAB, ROOT

MINIMAL = 'seed = 1\n[load]\nusers = 2\nduration = "5s"\n'


def scenario(tmp_path: Path, extra: str, name: str = "s") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(MINIMAL + extra)
    return path


def test_the_load_client_key_takes_the_known_clients(tmp_path: Path) -> None:
    for value in ("lab", "python-sdk", "typescript-sdk", "cmd:python my_adapter.py"):
        sc = load_scenario(scenario(tmp_path, f'client = "{value}"\n'))
        assert sc.load.client == value
        assert sc.load_settings("http://127.0.0.1:1/mcp", "/tmp/x").client == value
    assert load_scenario(scenario(tmp_path, "")).load.client == "lab"


def test_a_bad_client_is_refused_with_file_and_key(tmp_path: Path) -> None:
    path = scenario(tmp_path, 'client = "rust-sdk"\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    text = str(e.value)
    assert str(path) in text and "load.client" in text and "'python-sdk'" in text


def test_expected_failures_are_read_per_client_kind(tmp_path: Path) -> None:
    extra = (
        '[expected_failures]\npython-sdk = ["missing_rehandshake", "client_resend"]\ncmd = ["cross_stream"]\n'
    )
    sc = load_scenario(scenario(tmp_path, extra))
    assert sc.expected_failures == {
        "python-sdk": ("missing_rehandshake", "client_resend"),
        "cmd": ("cross_stream",),
    }
    assert sc.to_dict()["expected_failures"]["python-sdk"] == ["missing_rehandshake", "client_resend"]


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('[expected_failures]\nrust-sdk = ["cross_stream"]\n', "expected_failures.rust-sdk"),
        ('[expected_failures]\npython-sdk = "cross_stream"\n', "expected_failures.python-sdk"),
        ('[expected_failures]\npython-sdk = ["Cross Stream"]\n', "expected_failures.python-sdk[0]"),
    ],
)
def test_bad_expected_failures_are_refused_with_the_key(tmp_path: Path, table: str, key: str) -> None:
    path = scenario(tmp_path, table)
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert key in str(e.value) and str(path) in str(e.value)


def test_a_baseline_file_and_ids_that_name_no_gate(tmp_path: Path) -> None:
    sc = load_scenario(scenario(tmp_path, '[expected_failures]\npython-sdk = ["resume_p99"]\n'))
    base = tmp_path / "baseline.toml"
    base.write_text('[expected_failures]\npython-sdk = ["missing_rehandshake", "reconnect_qps"]\n')
    assert load_baseline(base) == {"python-sdk": ("missing_rehandshake", "reconnect_qps")}
    chosen = resolve("python-sdk", sc, base)
    assert chosen.expected_failures == ("missing_rehandshake", "reconnect_qps") and chosen.baseline == str(
        base
    )
    from_scenario = resolve("python-sdk", sc, None)
    assert from_scenario.expected_failures == ("resume_p99",) and from_scenario.baseline == "scenario"
    assert resolve("lab", sc, None).expected_failures == ()  # the scenario lists none for `lab`
    base.write_text('[expected_failures]\npython-sdk = ["no_such_gate"]\n')
    with pytest.raises(ClientRefused, match=r"no_such_gate.*name no gate or check"):
        resolve("python-sdk", sc, base)
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(ScenarioError, match="expected_failures"):
        load_baseline(tmp_path / "empty.toml")


def _gate(gate: str, verdict: Verdict) -> GateResult:
    return GateResult(number=1, gate=gate, title=gate, verdict=verdict, summary="", budget={}, measured={})


def test_known_failures_count_as_passes_and_fixed_ones_as_failures() -> None:
    gates = [
        _gate("cross_stream", Verdict.FAIL),
        _gate("missing_rehandshake", Verdict.PASS),
        _gate("resume_p99", Verdict.INCONCLUSIVE),
        _gate("reconnect_qps", Verdict.FAIL),
    ]
    expectations = apply(gates, ["cross_stream", "missing_rehandshake", "resume_p99"])
    assert {e.gate: e.status for e in expectations} == {
        "cross_stream": "known",
        "missing_rehandshake": "fixed",
        "resume_p99": "unseen",
    }
    assert [counted(g, expectations) for g in gates] == [
        Verdict.PASS,
        Verdict.FAIL,
        Verdict.INCONCLUSIVE,
        Verdict.FAIL,  # not in the baseline: its own verdict
    ]
    assert set(REGISTRY.ids()) >= {g.gate for g in gates}


def _lab_run(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LAB, "run", "smoke", "--out", str(tmp_path / "results"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_typescript_sdk_without_node_is_refused_at_once(tmp_path: Path) -> None:
    proc = _lab_run(tmp_path, "--client", "typescript-sdk", env={"PATH": str(tmp_path / "no-bin")})
    assert proc.returncode == 3, proc.stderr
    assert "needs Node.js" in proc.stderr and "make node-adapter" in proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_typescript_sdk_without_the_installed_sdk_is_refused_at_once(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("no Node.js on this machine: the refusal for a missing Node.js is tested above")
    proc = _lab_run(tmp_path, "--client", "typescript-sdk", env={"LAB_NODE_DIR": str(tmp_path / "empty")})
    assert proc.returncode == 3, proc.stderr
    assert "@modelcontextprotocol/sdk" in proc.stderr and "make node-adapter" in proc.stderr


def test_an_unknown_client_and_a_bad_baseline_are_refused(tmp_path: Path) -> None:
    proc = _lab_run(tmp_path, "--client", "rust-sdk")
    assert proc.returncode == 3 and "--client must be one of" in proc.stderr
    base = tmp_path / "b.toml"
    base.write_text('[expected_failures]\nlab = ["gate_seven"]\n')
    proc = _lab_run(tmp_path, "--baseline", str(base))
    assert proc.returncode == 3 and "gate_seven" in proc.stderr and str(base) in proc.stderr


def test_a_client_is_refused_an_era_its_adapter_does_not_speak() -> None:
    ts, py, lab = (ClientUnderTest(spec, None) for spec in ("typescript-sdk", "python-sdk", "lab"))
    for era in ("modern", "both"):
        with pytest.raises(ClientRefused, match=r"speaks the handshake era only.*--era handshake"):
            check_era(ts, era)
        check_era(py, era)
        check_era(lab, era)
    check_era(ts, "handshake")
    check_era(ClientUnderTest("cmd:my-adapter", None), "modern")  # the user's adapter: theirs to say
