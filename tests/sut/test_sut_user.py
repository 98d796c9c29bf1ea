"""The Locust users of a client under test on their own (lab.load.sut_user, lab.load.scripted):
every call ID, also the call's idempotency key, carries the run's own tag
(`<client>/<run tag>/c<n>`), and a scripted client under test plays its script under its
own ID, waits for its times, leaves once and stops itself. The checks run in a process of
their own (tests/helpers/sut_users.py): Locust monkey-patches the whole process for gevent."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from lab.load.settings import run_tag
from tests.livesrv import ROOT


def test_the_run_tag_is_the_one_the_lab_clients_write_keys_carry() -> None:
    key = bytes.fromhex("cd" * 32)
    assert run_tag(key) == hashlib.blake2b(key, digest_size=4, person=b"mcp-lab/writes").hexdigest()
    assert run_tag(key) != run_tag(bytes(32)) and len(run_tag(key)) == 8


def test_the_users_of_a_client_under_test() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.sut_users"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    assert proc.stdout.count("ok check_") == 5, said[-4000:]  # every check of the helper ran
