"""Record a Toxiproxy API's answers to the steps of `api_steps.py`.

    .venv/bin/python -m tests.nemesis.record_toxiproxy_answers --real /path/to/toxiproxy-server \\
        --out tests/nemesis/fixtures/toxiproxy-api/answers.json
    .venv/bin/python -m tests.nemesis.record_toxiproxy_answers --embedded --compat --out /tmp/embedded.json

`--real` starts that `toxiproxy-server` on 127.0.0.1 (a free port), replays the steps, and
stops it by PID; `--embedded` does the same with `lab nemesis` (`--compat` for compat
mode). The binary is built outside this repository and never committed; only the answers
are (with the server's version). Every address is 127.0.0.1; the only traffic is the API's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.nemesis.client import ToxiproxyClient
from tests.livesrv import stop
from tests.nemesis.api_steps import STEPS, fill, normalise
from tests.nemesis.realserver import running_real_toxiproxy
from tests.nemesis.upstreams import TcpServer, echo

_ANNOUNCE = re.compile(r"^lab-nemesis api (http://127\.0\.0\.1:\d+)$")


def replay(url: str, up: int) -> list[dict[str, object]]:
    """Each step sent to the API at `url`, with its answer: status, and the body as JSON
    (`json`) or as text (`text`), normalised (`api_steps.normalise`)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    out: list[dict[str, object]] = []
    for step in STEPS:
        path = fill(step.path, up=up, api_port=int(port))
        body = None if step.body is None else fill(step.body, up=up, api_port=int(port)).encode()
        conn = http.client.HTTPConnection(host, int(port), timeout=15)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(step.method, path, body=body, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        answer: dict[str, object] = {
            "id": step.id,
            "method": step.method,
            "path": step.path,
            "status": response.status,
        }
        if step.body is not None:
            answer["body"] = step.body
        text = raw.decode("utf-8", "replace").replace(f"127.0.0.1:{port}", "127.0.0.1:<api_port>")
        try:
            answer["json"] = normalise(json.loads(text), up=up) if text.strip() else None
        except ValueError:
            answer["text"] = text
        out.append(answer)
    return out


@contextmanager
def running_embedded(compat: bool, folder: Path) -> Iterator[str]:
    """`lab nemesis` on a free port (its API URL), stopped by PID at the end."""
    lab = str(Path(sys.executable).with_name("lab"))
    argv = [lab, "nemesis", "--api-port", "0", "--log", str(folder / "nemesis.jsonl"), "--seed", "1"]
    proc = subprocess.Popen([*argv, "--compat"] if compat else argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        match = _ANNOUNCE.match(line)
        if match is None:
            raise RuntimeError(f"lab nemesis said {line!r}")
        yield match.group(1)
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--real", type=Path, help="a toxiproxy-server binary")
    which.add_argument("--embedded", action="store_true", help="the embedded nemesis (lab nemesis)")
    p.add_argument("--compat", action="store_true", help="with --embedded: lab nemesis --compat")
    p.add_argument("--out", type=Path, required=True, help="where to write the answers (JSON)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, TcpServer(echo) as up:
        if args.real is not None:
            with running_real_toxiproxy(args.real, Path(tmp) / "toxiproxy.log") as url:
                version = ToxiproxyClient(url).version()
                steps = replay(url, up.port)
            server = f"toxiproxy-server {version}"
        else:
            with running_embedded(args.compat, Path(tmp)) as url:
                version = ToxiproxyClient(url).version()
                steps = replay(url, up.port)
            server = f"{version}{' --compat' if args.compat else ''}"
    document = {
        "server": server,
        "recorded_by": "tests/nemesis/record_toxiproxy_answers.py",
        "note": (
            "answers normalised: bound ports are <port>, the upstream's port <up>, the API's own "
            "port <api_port>, versions <version>"
        ),
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"{len(steps)} answers of {server} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
