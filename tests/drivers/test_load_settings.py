"""The load settings: every choice comes from the seed, and the locustfile runs without `lab run`."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lab.load.settings import LoadSettings, client_revision, rng_for, stable_index, token_for
from lab.wire.revisions import era_of_client

ROOT = Path(__file__).resolve().parents[2]

ASSIGN = """
import json, sys
from lab.load.settings import LoadSettings, token_for
s = LoadSettings(url="u", run_dir="r", seed=int(sys.argv[1]), tokens=tuple((f"t{i}", f"s{i}") for i in range(5)))
ids = [f"w0-u{n}" for n in range(1, 41)]
print(json.dumps({"lab": [token_for(s, c)[0] for c in ids], "hash": [hash(c) % 5 for c in ids]}))
"""


def assign(seed: int, hashseed: str) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    out = subprocess.run(
        [sys.executable, "-c", ASSIGN, str(seed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, list[str]] = json.loads(out.stdout)
    return result


def test_token_assignment_is_the_same_in_every_process_for_one_seed() -> None:
    a, b = assign(1, "1"), assign(1, "2")
    assert a["lab"] == b["lab"]
    assert len(set(a["lab"])) > 1  # the clients are spread over the tokens
    # What the old assignment (hash of the client ID) did: two processes disagree.
    assert a["hash"] != b["hash"]
    # Another seed is another (equally reproducible) assignment.
    assert assign(2, "1")["lab"] != a["lab"]


def test_stable_index_is_a_function_of_seed_and_name_only() -> None:
    assert stable_index(7, "x", 10) == stable_index(7, "x", 10)
    assert {stable_index(7, f"n{i}", 3) for i in range(50)} == {0, 1, 2}
    with pytest.raises(ValueError):
        stable_index(7, "x", 0)


def test_no_tokens_means_no_authentication() -> None:
    assert token_for(LoadSettings(url="u", run_dir="r"), "w0-u1") == (None, None)


def test_the_locustfile_imports_without_lab_run(tmp_path: Path) -> None:
    # Locust patches the process with gevent on import: only ever in a child process.
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_LOCUST_SETTINGS", "LAB_LEDGER_KEY")}
    code = (
        "import lab.load.locustfile as f\n"
        "print(f.SETTINGS.url, f.SETTINGS.run_dir, f.SETTINGS.by_hand, f.LabUser.__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["http://127.0.0.1:8000/mcp", "results/locust", "True", "LabUser"]


def test_a_settings_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "settings.json"
    bad.write_text("{not json", encoding="utf-8")
    code = "from lab.load.settings import LoadSettings\nLoadSettings.from_env()\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "LAB_LOCUST_SETTINGS": str(bad)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and f"LAB_LOCUST_SETTINGS={bad}" in out.stderr


def test_a_clients_jitter_is_seeded_by_the_run_and_its_id_and_made_on_first_draw() -> None:
    s = LoadSettings(url="u", run_dir="r", seed=7)
    rng = rng_for(s, "w0-u3")
    assert rng._rng is None  # an idle client never draws: no generator state held for it
    same = random.Random("7/w0-u3")  # what each client was given before: the same draws
    assert [rng.random() for _ in range(5)] == [same.random() for _ in range(5)]
    assert rng_for(s, "w0-u4").random() != random.Random("7/w0-u3").random()
    assert (
        rng_for(LoadSettings(url="u", run_dir="r", seed=8), "w0-u3").random()
        != random.Random("7/w0-u3").random()
    )


def test_a_locust_process_started_before_its_settings_waits_for_them(tmp_path: Path) -> None:
    # lab run starts Locust while the chain starts, and writes the settings once the
    # chain's address is known: the process reads them then, whole (write_secret).
    from lab.runfolder import write_secret

    path = tmp_path / ".secrets" / "locust-settings.json"
    code = "from lab.load.settings import LoadSettings\nprint(LoadSettings.from_env().url)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "LAB_LOCUST_SETTINGS": str(path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.0)  # still waiting: the file is not there
        settings = LoadSettings(url="http://127.0.0.1:9/mcp", run_dir=str(tmp_path))
        assert write_secret(tmp_path, "locust-settings.json", settings.to_json()) == path
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.split() == ["http://127.0.0.1:9/mcp"]
    assert oct(path.stat().st_mode & 0o777) == "0o600" and not path.with_name(f"{path.name}.tmp").exists()


def test_settings_that_never_come_are_named_once_the_wait_is_over(tmp_path: Path) -> None:
    missing = tmp_path / "never.json"
    code = "from lab.load.settings import LoadSettings\nLoadSettings.from_env(wait_s=0.3)\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "LAB_LOCUST_SETTINGS": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and f"LAB_LOCUST_SETTINGS={missing}" in out.stderr


def test_each_client_speaks_the_era_the_run_tests() -> None:
    ids = [f"w0-u{n}" for n in range(1, 401)]
    hs = LoadSettings(url="u", run_dir="r", protocol_version="2025-06-18")
    assert {client_revision(hs, c) for c in ids} == {"2025-06-18"}
    modern = LoadSettings(url="u", run_dir="r", era="modern")
    assert {client_revision(modern, c) for c in ids} == {"2026-07-28"}
    both = LoadSettings(url="u", run_dir="r", protocol_version="2025-06-18", era="both")
    revisions = [client_revision(both, c) for c in ids]
    # Both eras, about half each, and each client's era is a function of its ID alone
    # (the checker tells a client's era from its ID).
    assert 150 < revisions.count("2026-07-28") < 250 and revisions.count(
        "2025-06-18"
    ) == 400 - revisions.count("2026-07-28")
    assert all(
        (r == "2026-07-28") == (era_of_client(c) == "modern") for c, r in zip(ids, revisions, strict=True)
    )
