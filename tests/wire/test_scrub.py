"""Secrets in free text (lab.wire.redact.scrub, scrub_stderr): what a third party prints
about a request (gevent's hub, a traceback's repr) carries no bearer token, session ID,
authorization or cookie value, in any form a header is printed."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from lab.logscrub import ScrubbingStream
from lab.wire.redact import REDACTED, scrub
from tests.livesrv import ROOT

TOKEN = "tok-s3cret-0a1b2c"
SID = "c0ffee0123456789abcdef"


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {TOKEN}",
        f"[('authorization', 'Bearer {TOKEN}'), ('mcp-session-id', '{SID}')]",
        f"[(b'Authorization', b'Bearer {TOKEN}'), (b'Mcp-Session-Id', b'{SID}')]",
        f'{{"mcp-session-id": "{SID}", "cookie": "a={TOKEN}"}}',
        f"Mcp-Session-Id: {SID}\r\nSet-Cookie: sid={TOKEN}; HttpOnly",
        f"headers={{'Authorization': 'bearer {TOKEN}'}}",
        f"retrying with BeArEr {TOKEN} after 401",
    ],
)
def test_every_printed_form_of_a_secret_header_is_scrubbed(text: str) -> None:
    out = scrub(text)
    assert TOKEN not in out and SID not in out and REDACTED in out, out


def test_text_without_secrets_is_unchanged() -> None:
    text = "GET /mcp 200 (last-event-id 'e1.abc', session s_0123456789abcdef0123)"
    assert scrub(text) == text


def test_a_secret_split_over_two_writes_is_still_scrubbed() -> None:
    inner = io.StringIO()
    stream = ScrubbingStream(inner)
    stream.write("('authorization', 'Bea")
    stream.write(f"rer {TOKEN}')\nnext line")
    assert inner.getvalue() == f"('authorization', '{REDACTED}')\n"
    stream.flush()
    assert inner.getvalue().endswith("next line")


GREENLET_CRASH = f"""
import sys
from gevent import monkey; monkey.patch_all()
import gevent, greenlet
from lab.logscrub import scrub_stderr
if sys.argv[1] == "scrub":
    scrub_stderr()
def run(headers):
    raise UnicodeEncodeError("ascii", "x", 0, 1, "no")
# As the sync driver starts a connection: a raw greenlet, whose crash the hub prints
# with its arguments (the request's headers).
g = greenlet.greenlet(run, parent=gevent.get_hub())
gevent.get_hub().loop.run_callback(g.switch, [("authorization", "Bearer {TOKEN}"), ("mcp-session-id", "{SID}")])
gevent.sleep(0.1)
"""


@pytest.mark.parametrize("mode", ["scrub", "raw"])
def test_gevents_hub_printing_a_crashed_request_prints_no_secret(mode: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", GREENLET_CRASH, mode], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "UnicodeEncodeError" in out.stderr, out.stderr  # the hub did print the crash
    if mode == "scrub":
        assert TOKEN not in out.stderr and SID not in out.stderr, out.stderr
    else:  # the control: without the scrub, the hub prints both (what the worker's log held)
        assert TOKEN in out.stderr and SID in out.stderr, out.stderr
