"""Bad inputs: a corrupted or unknown-schema ledger is refused with an error naming the
file (never a traceback), the gates that need it are inconclusive, the rest still run;
a gate whose code raises is inconclusive with the error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.jsonl import LINE, LedgerError, read_jsonl
from lab.checker.inputs.load import load_run
from lab.checker.inputs.schemas import TAP_RECORDS, TAP_SCHEMA
from lab.checker.judge.verdict import judge_dir, run_rule
from lab.checker.model import Verdict
from lab.checker.rules import Rule
from tests.checker.builders import clean_run


def _run(tmp_path: Path) -> Path:
    return clean_run().sim.write(tmp_path / "run")


def _verdicts(run_dir: Path) -> dict[str, Verdict]:
    _, report = judge_dir(run_dir)
    return {g.gate: g.verdict for g in report.gates}


def test_a_corrupted_tap_line_is_named_and_only_its_gates_suffer(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    tap = run_dir / "proxy" / "tap.jsonl"
    lines = tap.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = '{"type": "sent", "flow": "f1", oops\n'
    tap.write_text("".join(lines), encoding="utf-8")
    data, report = judge_dir(run_dir)
    (problem,) = report.problems
    assert str(problem).startswith("proxy/tap.jsonl: line 3 is not JSON (Expecting property name")
    assert data.tap is None
    by_gate = {g.gate: g for g in report.gates}
    # Gate 1 falls back to the server ledger but cannot show a crossing was injected.
    assert by_gate["cross_stream"].verdict is Verdict.INCONCLUSIVE
    assert by_gate["cross_stream"].measured["truth_source"] == "server"
    for name in ("missing_rehandshake", "resume_p99", "reconnect_qps", "illegal_origin"):
        assert by_gate[name].verdict is Verdict.PASS, name
    assert report.verdict is Verdict.INCONCLUSIVE


def test_a_corrupted_client_ledger_is_named_in_every_gate_that_needs_it(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    (run_dir / "clients" / "worker-1.sqlite").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (run_dir / "clients" / f"worker-1.sqlite{suffix}").unlink(missing_ok=True)
    _, report = judge_dir(run_dir)
    (problem,) = report.problems
    assert problem.path == "clients/worker-1.sqlite" and "not a readable SQLite database" in problem.message
    for g in report.gates:
        if g.gate == "illegal_origin":  # decided from the tap and server alone
            assert g.verdict is Verdict.PASS
            continue
        assert g.verdict is Verdict.INCONCLUSIVE, g.gate
        assert g.error is None  # a refused input, not a checker crash
        text = g.summary + " ".join(e.detail for e in g.evidence)
        assert "clients/worker-1.sqlite" in text, g.gate


def test_one_broken_worker_file_keeps_the_gates_from_passing(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    (run_dir / "clients" / "worker-2.sqlite").write_bytes(b"\0garbage")
    _, report = judge_dir(run_dir)
    assert report.verdict is Verdict.INCONCLUSIVE
    g = next(g for g in report.gates if g.gate == "resume_p99")
    assert [e.detail for e in g.evidence if not e.ok] == ["unreadable: clients/worker-2.sqlite"]


@pytest.mark.parametrize(
    ("path", "content", "message"),
    [
        ("run.json", '{"schema": "mcpLabRun.v9"}', "unknown schema 'mcpLabRun.v9'"),
        ("run.json", "{not json", "is not JSON (line 1"),
        ("proxy/tap.jsonl", '{"t": 1}\n', "line 1 has no record type"),
        ("proxy/tap.jsonl", '{"type": "flow", "schema": "mcpLabTap.v2"}\n', "schema 'mcpLabTap.v2' is not"),
        (
            "proxy/tap.jsonl",
            '{"type": "dropped", "flow": "f", "t": 1}\n',
            "'dropped' records lack field(s) index",
        ),
        ("proxy/tap.jsonl", '[1, 2]\n{"type": "x"}\n', "line 1 is not a JSON object"),
        (
            "nemesis.jsonl",
            '{"type": "toxic_added", "t": "soon", "proxy": "p", "toxic": "x", "kind": "latency"}\n',
            "field 't'",
        ),
    ],
)
def test_unknown_or_malformed_files_are_refused_by_name(
    tmp_path: Path, path: str, content: str, message: str
) -> None:
    run_dir = _run(tmp_path)
    (run_dir / path).write_text(content, encoding="utf-8")
    _, report = judge_dir(run_dir)
    problems = [p for p in report.problems if p.path == path]
    assert problems and message in problems[0].message, report.problems
    assert report.verdict is Verdict.INCONCLUSIVE


def test_records_of_a_type_the_contract_does_not_define_are_skipped_with_a_note(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    with (run_dir / "proxy" / "tap.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"type": "stats", "t": 1, "n": 3}\n{"type": "stats", "t": 2, "n": 4}\n')
    _, report = judge_dir(run_dir)
    assert report.verdict is Verdict.PASS
    assert report.notes == (
        "proxy/tap.jsonl: skipped records of types mcpLabTap.v1 does not define: 2 'stats'",
    )


def test_an_unknown_sqlite_schema_is_refused(tmp_path: Path) -> None:
    import sqlite3

    run_dir = _run(tmp_path)
    db = sqlite3.connect(run_dir / "server" / "ledger.sqlite")
    db.execute("UPDATE meta SET value = 'mcpServerLedger.v7' WHERE name = 'schema'")
    db.commit()
    db.close()
    data = load_run(run_dir)
    assert data.server is None
    assert [str(p) for p in data.problems] == [
        "server/ledger.sqlite: meta schema='mcpServerLedger.v7' is a schema the checker does not know"
    ]


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    import sqlite3

    run_dir = _run(tmp_path)
    db = sqlite3.connect(run_dir / "server" / "ledger.sqlite")
    db.execute("ALTER TABLE dispatches DROP COLUMN effect")
    db.commit()
    db.close()
    data = load_run(run_dir)
    assert [str(p) for p in data.problems] == [
        "server/ledger.sqlite: table 'dispatches' lacks column(s) effect"
    ]


def test_a_cut_off_last_tap_line_is_tolerated_with_a_note(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    with (run_dir / "proxy" / "tap.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"type": "sent", "flow": "f1", "t": 17')
    data, report = judge_dir(run_dir)
    assert report.verdict is Verdict.PASS
    assert data.notes == [
        "proxy/tap.jsonl: the last line is cut off (the writer stopped mid-line); it was ignored"
    ]


def test_no_run_json_means_spec_budgets_and_no_pass(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    (run_dir / "run.json").unlink()
    _, report = judge_dir(run_dir)
    assert report.verdict is Verdict.INCONCLUSIVE
    assert report.budgets["resume_p99_s"] == 5.0 and report.budgets["min_events"] == 100_000
    assert report.budgets["reconnect_qps"] is None
    assert any(p.path == "run.json" and "missing" in p.message for p in report.problems)


def test_a_gate_whose_code_raises_is_inconclusive_with_the_error(tmp_path: Path) -> None:
    data = load_run(_run(tmp_path))

    def explode(ctx: Context) -> None:
        raise KeyError("no_such_column")

    broken = Rule(id="broken", number=99, title="Broken", blames=(), evidence="", check=explode)  # type: ignore[arg-type]
    result = run_rule(broken, Context(data, parse_budgets(data.run)))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.error is not None and result.error.startswith(
        "KeyError: 'no_such_column' (at test_inputs.py:"
    )


def test_the_fast_and_the_line_by_line_jsonl_paths_agree(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    tap = run_dir / "proxy" / "tap.jsonl"
    fast = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    # A blank line forces the line-by-line path (and is tolerated by it).
    tap.write_text(tap.read_text(encoding="utf-8").replace("\n", "\n\n", 1), encoding="utf-8")
    slow = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    assert fast.lines == slow.lines > 0
    for kind in TAP_RECORDS:
        a, b = fast.frames[kind], slow.frames[kind]
        assert a.drop(columns=LINE).equals(b.drop(columns=LINE)), kind
        # Line numbers are exact on both paths: every record after the blank line moved down one.
        assert (b[LINE].astype(int) - a[LINE].astype(int)).tolist() == [0 if n == 1 else 1 for n in a[LINE]]
    lines = tap.read_text(encoding="utf-8").split("\n")
    last = fast.frames["flow"].iloc[-1]
    assert json.loads(lines[int(last[LINE]) - 1 + 1])["flow"] == last["flow"]  # +1: the blank line


def test_a_bad_line_number_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = json.dumps({"type": "flow_end", "flow": "f", "t": 1.0, "reason": "complete"})
    path.write_text(f"{good}\n{good}\n{good}\n{{\n{good}\n", encoding="utf-8")
    with pytest.raises(LedgerError, match=r"^t.jsonl: line 4 is not JSON"):
        read_jsonl(path, "t.jsonl", TAP_RECORDS, TAP_SCHEMA)


def _bigger_run(tmp_path: Path) -> Path:
    """A clean run whose ledgers span many pages (so 'the middle' is a data page)."""
    run = clean_run()
    for _ in range(30):
        run.sim.notify(run.get_a, 20)
    return run.sim.write(tmp_path / "run")


def _scribble(path: Path, offset: int, size: int = 4096, seed: int = 1) -> None:
    """Write `size` random bytes at `offset`, leaving the SQLite header (first 100 bytes) intact."""
    import random

    assert offset >= 100
    data = bytearray(path.read_bytes())
    data[offset : offset + size] = random.Random(seed).randbytes(size)[: len(data) - offset]
    path.write_bytes(bytes(data))


def _middle_index_page(path: Path) -> int:
    """The byte offset of the index page nearest the middle of a SQLite file: a page that
    reading the tables never touches (a full scan reads only the table b-trees)."""
    import sqlite3

    db = sqlite3.connect(path)
    try:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        pages = [p for name, p in db.execute("SELECT name, pageno FROM dbstat") if name in indexes]
    except sqlite3.OperationalError as e:
        pytest.skip(f"this SQLite has no dbstat table to find an index page with ({e})")
    finally:
        db.close()
    middle = path.stat().st_size // size // 2
    offset: int = (min(pages, key=lambda p: abs(p - middle)) - 1) * int(size)
    return offset


def test_random_bytes_in_the_middle_of_a_client_ledger_make_the_run_inconclusive(tmp_path: Path) -> None:
    run_dir = _bigger_run(tmp_path)
    assert set(_verdicts(run_dir).values()) == {Verdict.PASS}  # pristine: a pass
    ledger = run_dir / "clients" / "worker-1.sqlite"
    # 4 KiB of random bytes over one index page in the middle (header intact): every table
    # still reads, which is how such damage used to pass unseen.
    _scribble(ledger, _middle_index_page(ledger), 4096)
    _, report = judge_dir(run_dir)
    (problem,) = report.problems
    assert problem.path == "clients/worker-1.sqlite"
    assert problem.message.startswith("is damaged (PRAGMA quick_check: ")
    assert "\n" not in problem.message
    assert report.verdict is Verdict.INCONCLUSIVE


@pytest.mark.parametrize("ledger", ["clients/worker-1.sqlite", "server/ledger.sqlite"])
def test_damaged_inner_pages_give_one_line_and_exit_2_never_a_traceback(tmp_path: Path, ledger: str) -> None:
    import subprocess
    import sys

    run_dir = _bigger_run(tmp_path)
    path = run_dir / ledger
    size = path.stat().st_size
    for n, at in enumerate(range(4096, size, 4096 * 3)):  # every third page after the first
        _scribble(path, at, 512, seed=n)
    lab = Path(sys.executable).with_name("lab")
    done = subprocess.run(
        [str(lab), "report", str(run_dir), "--no-figures"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    (line,) = [x for x in done.stderr.splitlines() if ledger in x]
    assert line.startswith(f"lab report: evidence unreadable: {ledger}: ")


def test_a_sqlite_error_raised_while_rows_are_read_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page that turns out damaged only when its rows are fetched (after quick_check
    # passed): the file is refused with SQLite's own one line, the run is inconclusive.
    import sqlite3

    from lab.checker.inputs import columns

    run_dir = _run(tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(columns.ColumnParts, "add_tuples", broken)
    _, report = judge_dir(run_dir)
    messages = {p.path: p.message for p in report.problems}
    assert messages["clients/worker-1.sqlite"] == (
        "is not a readable SQLite database (database disk image is malformed)"
    )
    assert report.verdict is Verdict.INCONCLUSIVE


def _long_and_short_taps() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """One flow's tap in the long form (every `forwarded` record written) and in the short
    form the proxy writes (an untouched one folded into its `sent` record), the same run."""
    long: list[dict[str, object]] = [{"type": "plan", "t": 1.0, "source": "x", "digest": "d", "error": None}]
    short: list[dict[str, object]] = list(long)
    for i, (eid, fault) in enumerate([("e0", None), ("e1", None), ("e2", "cross_ids"), ("e3", None)]):
        sent = {
            "type": "sent", "flow": "f1", "t": 2.0 + i, "index": i, "event_id": eid, "digest": f"d{i}",
            "has_data": True, "priming": False, "stream_id": None, "session": "s_x", "retry": None,
        }  # fmt: skip
        fwd = {
            "type": "forwarded", "flow": "f1", "t": 2.0 + i, "index": i,
            "event_id": eid if fault is None else "other", "digest": f"d{i}",
            "source": {"flow": "f1", "index": i}, "fault": fault,
            "rule": None if fault is None else "r1", "decision": None if fault is None else "d_1",
        }  # fmt: skip
        long += [sent, fwd]
        short += [{**sent, "fwd": i}] if fault is None else [sent, fwd]
    return long, short


def test_the_short_form_of_an_untouched_forward_reads_as_the_long_form(tmp_path: Path) -> None:
    long, short = _long_and_short_taps()
    frames = {}
    for name, records in (("long", long), ("short", short)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        frames[name] = read_jsonl(path, name, TAP_RECORDS, TAP_SCHEMA).frames
    for kind in ("sent", "forwarded"):
        got, want = frames["short"][kind], frames["long"][kind]
        assert got.drop(columns=[LINE]).to_dict("records") == want.drop(columns=[LINE]).to_dict("records")
    assert "fwd" not in frames["short"]["sent"].columns
    # A witness points at the line that holds the record: a short form's own line.
    assert frames["short"]["forwarded"][LINE].tolist() == [2, 3, 5, 6]
    # The faulted forward keeps its own record, with its fault named.
    [faulted] = frames["short"]["forwarded"].query("fault == 'cross_ids'").to_dict("records")
    assert faulted["event_id"] == "other" and faulted["rule"] == "r1"


def test_records_in_memory_expand_the_short_form_as_a_file_does() -> None:
    from lab.checker.inputs.records import run_data_from_records

    long, short = _long_and_short_taps()
    a, b = run_data_from_records(tap=long), run_data_from_records(tap=short)
    for kind in ("sent", "forwarded"):
        got, want = b.tap_records(kind).drop(columns=[LINE]), a.tap_records(kind).drop(columns=[LINE])
        assert got.to_dict("records") == want.to_dict("records")
