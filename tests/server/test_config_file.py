"""`lab serve --config FILE`: structured settings, so that no text can inject an option or a
token (issue 11), and bad files refused with the file, the key and what was expected."""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lab.exitcodes import ExitCode
from lab.server.cli import config_from_args, register
from lab.server.config import ServerConfig, read_config_file
from tests.livesrv import LAB, ROOT, reference_server
from tests.server.mcp_http import Mcp, messages


def _write(tmp: Path, obj: Any, name: str = "serve.json") -> Path:
    p = tmp / name
    p.write_text(json.dumps(obj), encoding="utf-8")
    return p


@pytest.mark.live
def test_a_subject_with_a_comma_and_an_origin_like_an_option_arrive_intact(tmp_path: Path) -> None:
    cfg = _write(
        tmp_path,
        {"tokens": {"t1": "alice,evil=mallory"}, "allowed_origins": ["--rollback"], "session_ttl": 60},
    )
    with reference_server(tmp_path, "--config", str(cfg)) as srv:
        assert Mcp(srv.url, token="evil").initialize().status_code == 401  # no token `evil` was made
        m = Mcp(srv.url, token="t1", origin="--rollback")  # the Origin is allowed, not an option
        assert m.initialize().status_code == 200
        r, events = m.call("echo", {"text": "hi"})
        assert r.status_code == 200
        assert events[0].is_priming and events[0].id  # resumable: the server is not in rollback
        assert messages(events)[-1]["result"]["content"][0]["text"] == "hi"
        assert Mcp(srv.url, token="t1", origin="http://127.0.0.1:1").initialize().status_code == 403
        time.sleep(0.3)
        db = sqlite3.connect(tmp_path / "ledger.sqlite")
        subjects = {r[0] for r in db.execute("SELECT auth_subject FROM sessions")}
        db.close()
        assert subjects == {"alice,evil=mallory"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"sesion_ttl": 60}, "unknown key 'sesion_ttl'"),
        ({"session_ttl": "60"}, "key 'session_ttl': expected a number"),
        ({"tokens": "t1=alice"}, "key 'tokens': expected an object"),
        ({"allowed_origins": "http://x"}, "key 'allowed_origins': expected a list of strings"),
        ({"rollback": 1}, "key 'rollback': expected true or false"),
        ({"max_sessions": 2.5}, "key 'max_sessions': expected an integer"),
        ({"defects": ["no-such-defect"]}, "unknown defect 'no-such-defect'"),
        ({"event_ids": "ulid"}, "event_ids must be one of e1, seq, uuid"),
        ({"tokens": {"t": "\ud800"}}, "key 'tokens': "),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_a_bad_config_file_is_refused_with_exit_3_naming_the_key(
    tmp_path: Path, content: Any, expected: str
) -> None:
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(content), encoding="utf-8")
    done = subprocess.run(
        [LAB, "serve", "--port", "0", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == ExitCode.CANNOT_RUN, done.stderr
    assert expected in done.stderr
    if isinstance(content, dict) and "defects" not in content and "event_ids" not in content:
        assert str(cfg) in done.stderr


def test_a_file_that_is_not_json_or_missing_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x\.json: not JSON"):
        read_config_file(bad)
    with pytest.raises(ValueError, match=r"nope\.json: cannot read"):
        read_config_file(tmp_path / "nope.json")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    return p.parse_args(["serve", *argv])


def test_flags_given_override_the_file_and_the_rest_comes_from_it(tmp_path: Path) -> None:
    cfg = _write(
        tmp_path,
        {
            "session_ttl": 5,
            "max_sessions": 7,
            "tokens": {"a": "x,y"},
            "defects": ["no-priming"],
            "event_id_key": "ab" * 16,
        },
    )
    c: ServerConfig = config_from_args(
        _args("--config", str(cfg), "--session-ttl", "9", "--event-ids", "seq")
    )
    assert (c.session_ttl, c.max_sessions, c.tokens, c.defects) == (9.0, 7, {"a": "x,y"}, ("no-priming",))
    assert c.event_ids == "seq" and c.event_id_key == bytes.fromhex("ab" * 16)
    assert c.port == 8000 and c.allowed_origins == ServerConfig().allowed_origins
    plain: ServerConfig = config_from_args(
        _args("--tokens", "t=alice", "--defect", "any-origin", "--defect", "no-priming")
    )
    assert plain.tokens == {"t": "alice"} and plain.defects == ("any-origin", "no-priming")
