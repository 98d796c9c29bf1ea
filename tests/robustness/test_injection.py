"""Scenario data reaches `lab serve` as data: a token subject with a comma does not add a
token, an origin "--rollback" is an origin and not an option. The settings travel in a
0600 JSON file (`lab serve --config`); a `lab serve` without that flag gets flags, and a
value flags cannot carry intact is refused before anything starts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from lab.run.options import RunOptions
from lab.run.orchestrator import Run
from lab.run.serverconf import (
    UnsafeSetting,
    serve_accepts_config,
    server_config_file,
    server_settings,
    settings_as_flags,
)
from lab.scenario import load_scenario
from tests.livesrv import LAB, LEDGER_KEY, stop, wait_for_line

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "comma.toml"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def test_the_settings_file_holds_the_values_as_they_are(tmp_path: Path) -> None:
    settings = server_settings(load_scenario(SCENARIO).target, admin_token="adm-secret-123")
    path = server_config_file(tmp_path, settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["tokens"] == {"tok-a": "alice,evil=mallory"}
    assert doc["allowed_origins"] == ["http://127.0.0.1:*", "--rollback"]
    assert doc["admin_token"] == "adm-secret-123"


def test_flags_refuse_what_they_cannot_carry() -> None:
    settings = server_settings(load_scenario(SCENARIO).target, admin_token=None)
    with pytest.raises(UnsafeSetting, match=r"alice,evil=mallory.*holds ','"):
        settings_as_flags(settings)
    plain = {
        **settings,
        "tokens": {"tok-a": "alice"},
        "allowed_origins": ["http://127.0.0.1:*", "--rollback"],
    }
    flags = settings_as_flags(plain)
    assert "--allowed-origins=http://127.0.0.1:*,--rollback" in flags and "--tokens=tok-a=alice" in flags


@pytest.mark.live
@pytest.mark.skipif(serve_accepts_config(), reason="this lab serve has --config: the refusal is not needed")
def test_without_serve_config_the_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", str(SCENARIO), "--out", str(results)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert "alice,evil=mallory" in proc.stderr and "lab serve --config" in proc.stderr
    assert not results.exists() or list(results.iterdir()) == []


@pytest.mark.live
@pytest.mark.skipif(
    not serve_accepts_config(), reason="lab serve --config (the server's side) is not here yet"
)
def test_a_subject_with_a_comma_and_an_option_like_origin_arrive_intact(tmp_path: Path) -> None:
    run = Run(RunOptions(scenario=load_scenario(SCENARIO)))
    run.check()  # not refused
    options = run._serve_options(tmp_path)
    assert options[0] == "--config" and "mallory" not in " ".join(options)
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [LAB, "serve", "--port", "0", *options],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LAB_LEDGER_KEY": LEDGER_KEY},
        )
    try:
        url = wait_for_line(proc, log, "lab-serve listening on ")
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        with httpx.Client(timeout=10, headers=headers) as http:
            ok = http.post(url, json=INIT, headers={"authorization": "Bearer tok-a", "origin": "--rollback"})
            assert ok.status_code == 200, ok.text  # the token is there, the origin is a listed origin
            evil = http.post(url, json=INIT, headers={"authorization": "Bearer evil"})
            assert evil.status_code == 401, "a comma in a subject must not add a token"
            other = http.post(
                url, json=INIT, headers={"authorization": "Bearer tok-a", "origin": "http://x.example"}
            )
            assert other.status_code == 403
    finally:
        stop(proc)
