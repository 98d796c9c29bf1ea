"""First contact with a `--target URL`: initialize and tools/list before any load. The real
reference server passes and its negotiated revision lands in run.json; a target missing
contract tools, or one that negotiates a revision without sessions, is refused (exit 3)
with each reason named and nothing started.

The refused targets are tiny stubs written here on purpose (no real server lacks our tools
or speaks 2026-07-28 on this machine); they answer only initialize, the initialized
notification, tools/list and DELETE."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lab.run.preflight import CONTRACT_TOOLS, PreflightRefused, check_target
from lab.server.tools import TOOLS
from tests.livesrv import LAB, reference_server

pytestmark = pytest.mark.live
HERE = Path(__file__).resolve().parent


def test_the_contract_is_the_reference_servers_tools() -> None:
    assert set(CONTRACT_TOOLS) == set(TOOLS)


def stub(
    tools: list[str], revision: str, session: str | None = "stub-session-1"
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            msg = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if "id" not in msg:
                self.send_response(202)
                self.end_headers()
                return
            result: dict[str, object]
            if msg["method"] == "initialize":
                result = {
                    "protocolVersion": revision,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "stub"},
                }
            else:
                result = {"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in tools]}
            body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            if session:
                self.send_header("mcp-session-id", session)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self) -> None:
            self.send_response(200)
            self.end_headers()

    return Handler


@pytest.fixture
def serve_stub(request: pytest.FixtureRequest) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), stub(*request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_the_reference_server_passes_the_preflight(tmp_path: Path) -> None:
    with reference_server(tmp_path) as srv:
        facts = check_target(srv.url, protocol_version="2025-11-25")
    assert facts.protocol_version == "2025-11-25"
    assert set(CONTRACT_TOOLS) <= set(facts.tools)


@pytest.mark.parametrize("serve_stub", [(["echo", "clock"], "2025-11-25")], indirect=True)
def test_a_target_missing_tools_is_refused_naming_each(serve_stub: str, tmp_path: Path) -> None:
    with pytest.raises(
        PreflightRefused, match=r"lacks the tools ticker, ledger\.append of the target contract"
    ):
        check_target(serve_stub, protocol_version="2025-11-25")
    results = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", str(HERE / "url.toml"), "--target", serve_stub, "--out", str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 3
        and "ticker, ledger.append" in proc.stderr
        and "nothing was started" in proc.stderr
    )
    assert not results.exists() or list(results.iterdir()) == []


@pytest.mark.parametrize("serve_stub", [(list(CONTRACT_TOOLS), "2026-07-28")], indirect=True)
def test_a_target_without_sessions_is_refused_saying_why(serve_stub: str) -> None:
    with pytest.raises(PreflightRefused, match="session resumption does not exist there"):
        check_target(serve_stub, protocol_version="2025-11-25")


@pytest.mark.parametrize("serve_stub", [(list(CONTRACT_TOOLS), "2025-11-25", None)], indirect=True)
def test_a_target_that_gives_no_session_id_is_refused(serve_stub: str) -> None:
    with pytest.raises(PreflightRefused, match="gave no Mcp-Session-Id"):
        check_target(serve_stub, protocol_version="2025-11-25")


def test_a_run_against_a_url_target_records_the_negotiated_revision(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with reference_server(tmp_path) as srv:
        proc = subprocess.run(
            [
                LAB,
                "run",
                str(HERE / "url.toml"),
                "--target",
                srv.url,
                "--out",
                str(results),
                "--no-report",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = results.iterdir()
    target = json.loads((folder / "run.json").read_text())["target"]
    assert target["kind"] == "url" and target["url"] == srv.url
    assert target["protocol_version"] == "2025-11-25" and set(CONTRACT_TOOLS) <= set(target["tools"])
    # What it offers in each era: the reference server serves both.
    assert target["eras"]["handshake"] == "2025-11-25"
    assert target["eras"]["modern"]["versions"] == ["2026-07-28"]


def test_what_the_target_offers_in_each_era_is_probed_and_recorded(tmp_path: Path) -> None:
    with reference_server(tmp_path, ledger=False) as srv:
        both = check_target(srv.url, protocol_version="2025-11-25")
    assert both.modern is not None and both.modern.versions == ("2026-07-28",)
    assert "server/discover lists" in both.modern.answer
    with reference_server(tmp_path, "--protocol-versions", "2025-06-18,2025-11-25", ledger=False) as srv:
        handshake = check_target(srv.url, protocol_version="2025-11-25")
    assert handshake.modern is not None and handshake.modern.versions == ()
    assert "server/discover got HTTP 400" in handshake.modern.answer
    assert handshake.as_json()["eras"] == {
        "handshake": "2025-11-25",
        "modern": {"versions": [], "answer": handshake.modern.answer},
    }


@pytest.mark.parametrize("serve_stub", [(list(CONTRACT_TOOLS), "2025-11-25")], indirect=True)
def test_a_target_that_answers_discover_with_something_else_offers_no_modern_era(serve_stub: str) -> None:
    facts = check_target(serve_stub, protocol_version="2025-11-25")
    assert facts.modern is not None and facts.modern.versions == ()
    assert facts.modern.answer.startswith("server/discover was answered with")


def test_a_target_of_the_modern_era_only_is_refused_for_the_handshake_era_and_served_in_its_own(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    with reference_server(tmp_path, "--protocol-versions", "2026-07-28", ledger=False) as srv:
        with pytest.raises(PreflightRefused, match="serves the modern protocol era only"):
            check_target(srv.url, protocol_version="2025-11-25")
        for era in ("both", "handshake"):
            with pytest.raises(PreflightRefused, match="--era modern"):
                check_target(srv.url, protocol_version="2025-11-25", era=era)
        facts = check_target(srv.url, protocol_version="2025-11-25", era="modern")
        proc = subprocess.run(
            [LAB, "run", str(HERE / "url.toml"), "--target", srv.url, "--out", str(results)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert set(CONTRACT_TOOLS) <= set(facts.tools) and facts.protocol_version is None
    assert facts.as_json()["eras"]["modern"]["versions"] == ["2026-07-28"]
    assert proc.returncode == 3 and "modern protocol era only" in proc.stderr, proc.stderr
    assert (
        "--era modern" in proc.stderr
        and "docs/eras.md" in proc.stderr
        and "nothing was started" in proc.stderr
    )


def test_a_target_of_the_handshake_era_only_is_refused_for_the_modern_era(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with reference_server(tmp_path, "--protocol-versions", "2025-11-25", ledger=False) as srv:
        for era in ("modern", "both"):
            with pytest.raises(PreflightRefused, match="does not serve the modern protocol era"):
                check_target(srv.url, protocol_version="2025-11-25", era=era)
        proc = subprocess.run(
            [
                LAB,
                "run",
                str(HERE / "url.toml"),
                "--target",
                srv.url,
                "--era",
                "modern",
                "--out",
                str(results),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 3, proc.stderr
    assert "does not serve the modern protocol era" in proc.stderr and "--era handshake" in proc.stderr
    assert "nothing was started" in proc.stderr
