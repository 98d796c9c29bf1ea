"""What `lab report` writes and how it exits: report.json (documented, strict JSON),
report.md, junit.xml, figures, a self-contained report.html that renders in headless
Chromium, exit codes 0/1/2 through the real command."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from lab.report.document import rules_of
from lab.report.outputs import report_run
from tests.checker.builders import T0, clean_run

ROOT = Path(__file__).resolve().parents[2]
LAB = Path(sys.executable).with_name("lab")
CHROMIUM = Path("/usr/bin/chromium")


def _failing_incomplete_run(run_dir: Path) -> Path:
    run = clean_run()
    sim = run.sim
    sim.complete = False
    sim.dispatch("b", "op-<b>&7", 4, "performed")  # markup in a ledger value: must be escaped
    sim.dispatch("b", "op-<b>&7", 5, "performed")
    sim.recovered(run.get_a, T0 + 0.05, None, path="abandoned")
    sim.tick(20.0)
    return sim.write(run_dir)


def _report(run_dir: Path, *, figures: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = report_run(run_dir, witness_limit=5, figures=figures, quiet=False, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _strict_json(path: Path) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{path.name} holds {name}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_report_json_is_strict_and_every_field_is_documented(tmp_path: Path) -> None:
    run_dir = _failing_incomplete_run(tmp_path / "run")
    code, _, _ = _report(run_dir)
    assert code == 1
    doc = _strict_json(run_dir / "report.json")
    assert doc["schema"] == "mcpLabReport.v2" and doc["verdict"] == "fail" and doc["exit_code"] == 1
    assert doc["incomplete"] is True
    assert [g["gate"] for g in rules_of(doc)] == [
        "cross_stream",
        "duplicate_dispatch",
        "missing_rehandshake",
        "illegal_origin",
        "resume_p99",
        "reconnect_qps",
    ]
    resume = rules_of(doc)[4]
    assert resume["measured"]["p99_s"] is None and resume["measured"]["p99_unbounded"] is True
    names: set[str] = set(doc) | set(doc["run"]) | set(doc["faults"]) | set(doc["checker"])
    names |= set(doc["inputs"][0]) | set(doc["faults"]["counts"][0]) | set(doc["budgets"])
    for g in rules_of(doc):
        names |= set(g) | set(g["measured"])
        names |= {k for e in g["evidence"] for k in e} | {k for w in g["witnesses"] for k in w}
    documented = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in documented)
    assert not missing, f"docs/report.md does not document {missing}"


def test_markdown_junit_and_html_say_the_same_thing(tmp_path: Path) -> None:
    run_dir = _failing_incomplete_run(tmp_path / "run")
    code, stdout, _ = _report(run_dir, figures=True)
    assert code == 1 and "verdict: FAIL (exit 1)" in stdout and stdout.startswith("INCOMPLETE RUN")

    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "**INCOMPLETE RUN (end_reason: interrupted)" in md
    assert "| 2 | Writes done more than once (duplicate dispatches) | **FAIL** |" in md
    counted = f"{_strict_json(run_dir / 'report.json')['event_count']:,} events (counted by the proxy)"
    assert counted in md  # who counted the events, in words (report.json: `event_count_source` tap)
    assert "[server] the server performed tool ledger.append 2 times for idempotency key op-<b>&7" in md

    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == [
        "1 cross_stream",
        "2 duplicate_dispatch",
        "3 missing_rehandshake",
        "4 illegal_origin",
        "5 resume_p99",
        "6 reconnect_qps",
        "run complete",
    ]
    assert cases["run complete"].find("error") is not None
    assert cases["2 duplicate_dispatch"].find("failure") is not None
    assert cases["5 resume_p99"].find("failure") is not None
    assert cases["1 cross_stream"].find("failure") is None and cases["1 cross_stream"].find("error") is None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["complete"] == "False" and props["verdict"] == "fail"

    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert counted in page
    assert 'id="incomplete"' in page
    assert "op-&lt;b&gt;&amp;7" in page and "op-<b>&7" not in page
    # The four of the gates, the lab's processes, and what each fault did (the run has faults).
    assert page.count('src="data:image/png;base64,') == 6
    external = re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', page)
    assert external == [], "report.html must not load anything"
    for name in ("fig-resume-latency.png", "fig-reconnects.png", "fig-events-clients.png", "fig-faults.png"):
        assert (run_dir / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name


def _lab_report(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LAB), "report", str(run_dir), "--no-figures", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_exit_codes_through_the_real_command(tmp_path: Path) -> None:
    passing = clean_run().sim.write(tmp_path / "pass")
    done = _lab_report(passing)
    assert done.returncode == 0, done.stderr
    assert "verdict: PASS (exit 0)" in done.stdout

    failing = _failing_incomplete_run(tmp_path / "fail")
    done = _lab_report(failing, "-q")
    assert done.returncode == 1, done.stderr
    assert done.stdout.strip() == f"FAIL {failing}"

    broken = clean_run().sim.write(tmp_path / "inconclusive")
    (broken / "proxy" / "tap.jsonl").write_text('{"type": "flow"\n', encoding="utf-8")
    done = _lab_report(broken)
    assert done.returncode == 2
    assert "lab report: evidence unreadable: proxy/tap.jsonl: line 1 is not JSON" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert json.loads((broken / "report.json").read_text(encoding="utf-8"))["verdict"] == "inconclusive"

    done = _lab_report(tmp_path / "no-such-run")
    assert done.returncode == 3 and "is not a folder" in done.stderr


def test_a_folder_without_run_json_is_not_a_run_and_nothing_is_written_into_it(tmp_path: Path) -> None:
    # A mistyped path in CI (a parent folder, a ledger folder of a run) is refused with 3,
    # and the folder is left as it was: no report, no junit.xml, no figures.
    for folder in (tmp_path / "results", clean_run().sim.write(tmp_path / "results" / "run") / "clients"):
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        done = _lab_report(folder)
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"lab report: {folder} is not a run folder: it has no run.json" in done.stderr
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def _edit_run_json(run_dir: Path, **fields: Any) -> None:
    path = run_dir / "run.json"
    run = json.loads(path.read_text(encoding="utf-8"))
    run.update(fields)
    path.write_text(json.dumps(run), encoding="utf-8")


@pytest.mark.parametrize(
    "fields",
    [
        {"complete": False, "end_reason": "interrupted"},
        {"complete": False, "end_reason": "running"},
        {"complete": False, "end_reason": "abandoned"},
        {"complete": True, "end_reason": "abandoned"},  # marked abandoned by a later run
    ],
)
def test_an_unfinished_run_is_incomplete_never_pass_in_lab_report(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    # The same ledgers pass when the run finished: only completeness differs.
    run_dir = clean_run().sim.write(tmp_path / "run")
    assert _report(run_dir)[0] == 0
    _edit_run_json(run_dir, **fields)
    code, stdout, _ = _report(run_dir)
    assert code == 2, stdout
    assert "verdict: INCOMPLETE (exit 2)" in stdout and stdout.startswith("INCOMPLETE RUN")
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    assert doc["verdict"] == "incomplete" and doc["exit_code"] == 2 and doc["incomplete"] is True
    assert all(g["verdict"] == "pass" for g in rules_of(doc))


def test_lab_report_on_an_interrupted_run_says_incomplete_and_exits_2(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    _edit_run_json(run_dir, complete=False, end_reason="interrupted")
    done = _lab_report(run_dir, "-q")
    assert done.returncode == 2 and done.stdout.strip() == f"INCOMPLETE {run_dir}"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"complete": "yes"}, "field 'complete' is 'yes' (expected true or false)"),
        ({"started_at": "noon"}, "field 'started_at' is 'noon' (expected epoch seconds)"),
        (
            {"budgets": {"resume_p99_s": "5s"}},
            "field 'budgets.resume_p99_s' is '5s' (expected a number >= 0)",
        ),
        ({"fault_windows": [{"fault": 3}]}, "field 'fault_windows[0]' is {'fault': 3}"),
        ({"complete": None}, "field 'complete' is None (expected true or false)"),
        # Fields an abuse test once slipped past `lab report`, which then said PASS:
        ({"seed": "x"}, "field 'seed' is 'x' (expected an integer >= 0, the scenario's)"),
        ({"workers": "many"}, "field 'workers' is 'many' (expected an integer >= 0)"),
        ({"processes": 5}, "field 'processes' is 5 (expected a list of objects)"),
    ],
)
def test_a_mistyped_run_json_field_is_refused_by_name(
    tmp_path: Path, fields: dict[str, Any], said: str
) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    _edit_run_json(run_dir, **fields)
    code, stdout, stderr = _report(run_dir)
    # 2, not 3: the run was made and its ledgers exist; its own record cannot be trusted,
    # so no verdict can be given (3 is for a run that could not be made at all).
    assert code == 2, stdout + stderr
    assert f"lab report: evidence unreadable: run.json: {said}" in stderr


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (Debian: apt-get install chromium); report.html not rendered",
)
def test_report_html_renders_in_headless_chromium_with_its_figures(tmp_path: Path) -> None:
    run_dir = _failing_incomplete_run(tmp_path / "run")
    _report(run_dir, figures=True)
    page = (run_dir / "report.html").as_uri()
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    base = _chromium(profile)
    # The page's own script counts the figures the browser decoded (naturalWidth > 0).
    dom = subprocess.run([*base, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    assert 'data-figures-loaded="6"' in dom.stdout, dom.stderr[-2000:]
    assert 'id="incomplete"' in dom.stdout

    shot = tmp_path / "shot.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,2000", page], capture_output=True, timeout=120
    )
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1200, 2000)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # text, tables and figures, not a blank page
    shutil.rmtree(profile, ignore_errors=True)


def test_outputs_that_cannot_be_written_exit_4_with_one_line(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    # Every output's place taken by a folder: no write can succeed (the same for root,
    # which a read-only mode bit would not stop).
    for name in ("report.json", "report.md", "junit.xml", "report.html", "fig-faults.png"):
        (run_dir / name).mkdir()
    code, stdout, stderr = _report(run_dir, figures=True)
    assert code == 4
    (line,) = [x for x in stderr.splitlines() if "the lab failed" in x]
    assert line.startswith(f"lab report: the lab failed: outputs not written in {run_dir} (")
    assert "report.json" in line and "fig-faults.png" in line and "would have been PASS" in line
    assert "Traceback" not in stdout + stderr


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_folder_exits_4(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    run_dir.chmod(0o555)
    try:
        done = _lab_report(run_dir)
    finally:
        run_dir.chmod(0o755)
    assert done.returncode == 4 and "the lab failed: outputs not written" in done.stderr


def test_a_crash_inside_lab_report_exits_4_with_one_line_naming_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lab.checker

    run_dir = clean_run().sim.write(tmp_path / "run")

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the checker tripped")

    monkeypatch.setattr(lab.checker, "judge", crash)
    code, stdout, stderr = _report(run_dir)
    assert code == 4
    (line,) = stderr.splitlines()
    assert line == (
        "lab report: the lab failed (RuntimeError: the checker tripped); "
        f"traceback in {run_dir / 'report-crash.log'}"
    )
    log = (run_dir / "report-crash.log").read_text(encoding="utf-8")
    assert log.startswith("Traceback") and "the checker tripped" in log
    assert "Traceback" not in stdout + stderr


def test_a_run_with_size_flags_says_so_in_the_headline(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    code, _, _ = _report(run_dir)
    assert "overridden" not in (run_dir / "report.md").read_text(encoding="utf-8")
    _edit_run_json(run_dir, overrides={"load.users": 50, "load.duration": "20s"})
    code, _, stderr = _report(run_dir)
    assert code == 0, stderr
    said = "overridden: load.users = 50, load.duration = '20s'"
    headline = (run_dir / "report.md").read_text(encoding="utf-8").splitlines()[2:5]
    assert any(said in line for line in headline), headline
    assert said.replace("'", "&#39;") in (run_dir / "report.html").read_text(encoding="utf-8")
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    assert doc["run"]["overrides"] == {"load.users": 50, "load.duration": "20s"}


def test_a_verdict_without_the_servers_ledger_says_it_is_judged_from_the_wire_alone(tmp_path: Path) -> None:
    # With the reference server's ledger the verdict line says nothing of its basis.
    code, out, _ = _report(clean_run().sim.write(tmp_path / "with"))
    assert code == 0 and "wire alone" not in out
    # Without it (deleted), the same run is judged from the wire alone, and says so in
    # the verdict line, the report's headline and the HTML's facts.
    run_dir = clean_run().sim.write(tmp_path / "without", server=False)
    code, out, _ = _report(run_dir)
    said = "judged from the wire alone: the reference server's ledger is missing (server/ledger.sqlite)"
    (line,) = [x for x in out.splitlines() if x.startswith("verdict: ")]
    assert said in line, out
    headline = (run_dir / "report.md").read_text(encoding="utf-8").splitlines()[2:5]
    assert any(said in x for x in headline), headline
    assert said.replace("'", "&#39;") in (run_dir / "report.html").read_text(encoding="utf-8")


def _chromium(profile: Path) -> list[str]:
    """Headless Chromium, quiet and offline, with its profile in `profile`."""
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]


def _dom(page: Path, tmp_path: Path, size: str = "1400,900") -> str:
    """The page's DOM after its script ran, in headless Chromium at `size`."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    argv = [*_chromium(profile), f"--window-size={size}", "--dump-dom", page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    shutil.rmtree(profile, ignore_errors=True)
    assert "data-first-screen" in done.stdout, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
def test_a_failing_report_says_why_in_the_first_screen_and_an_unfinished_one_shows_no_pass_badge(
    tmp_path: Path,
) -> None:
    sim = clean_run().sim
    sim.dispatch("b", "op-b-9", 4, "performed")  # one write performed twice: gate 2 fails
    sim.dispatch("b", "op-b-9", 5, "performed")
    failing = sim.write(tmp_path / "fail")
    assert _report(failing)[0] == 1
    html = (failing / "report.html").read_text(encoding="utf-8")
    assert html.index('id="why"') < html.index("<h2>Gates</h2>")
    assert "Why FAIL:" in html and 'First witness (gate 2, <span class="attr">server</span>)' in html
    dom = _dom(failing / "report.html", tmp_path)
    assert 'data-first-screen="why first-witness"' in dom  # both within 1400x900, unscrolled
    md = (failing / "report.md").read_text(encoding="utf-8")
    assert md.index("**Why FAIL:**") < md.index("| # |") and "First witness (gate 2, server)" in md

    sim = clean_run().sim
    sim.complete = False
    unfinished = sim.write(tmp_path / "unfinished")
    assert _report(unfinished)[0] == 2
    html = (unfinished / "report.html").read_text(encoding="utf-8")
    assert "the run did not finish" in html and "no violation" in html
    assert 'data-pass-badges="0"' in _dom(unfinished / "report.html", tmp_path)
    # Every gate row says what evidence it needed and what it got, met or not.
    assert '<div class="ok">✓ events: need 10, got 15</div>' in html
