"""The `mcpLabNemesis.v1` log: one flushed line per record, fields as documented."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from lab.nemesis.log import (
    NemesisLog,
    NemesisRecord,
    down_record,
    proxy_record,
    read_nemesis_log,
    toxic_record,
)
from lab.nemesis.toxics import make_toxic

FIELDS = ["type", "t", "proxy", "listen", "upstream", "toxic", "kind", "stream", "toxicity", "attributes"]


def test_each_record_is_on_disk_before_the_log_closes(tmp_path: Path) -> None:
    path = tmp_path / "run" / "nemesis.jsonl"
    with NemesisLog(path) as log:
        log.write(proxy_record("proxy_created", "p", "127.0.0.1:4000", "127.0.0.1:8000", t=10.0))
        first = path.read_text().splitlines()
        log.write(
            toxic_record(
                "toxic_added",
                "p",
                "127.0.0.1:4000",
                "127.0.0.1:8000",
                make_toxic("latency", latency=5),
                t=11.5,
            )
        )
        second = path.read_text().splitlines()
    assert len(first) == 1 and len(second) == 2
    assert list(json.loads(second[0])) == FIELDS
    assert json.loads(second[1]) == {
        "type": "toxic_added",
        "t": 11.5,
        "proxy": "p",
        "listen": "127.0.0.1:4000",
        "upstream": "127.0.0.1:8000",
        "toxic": "latency_downstream",
        "kind": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 5, "jitter": 0},
    }


def test_read_back_and_append(tmp_path: Path) -> None:
    path = tmp_path / "nemesis.jsonl"
    with NemesisLog(path) as log:
        log.write(down_record("toxic_added", "p", "127.0.0.1:1", "127.0.0.1:2", t=1.0))
    with NemesisLog(path) as log:  # a second writer appends, never truncates
        log.write(down_record("toxic_removed", "p", "127.0.0.1:1", "127.0.0.1:2", t=2.0))
    records = read_nemesis_log(path)
    assert [(r.type, r.toxic, r.kind, r.stream, r.t) for r in records] == [
        ("toxic_added", "down", "down", None, 1.0),
        ("toxic_removed", "down", "down", None, 2.0),
    ]


def test_lines_from_many_threads_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "nemesis.jsonl"
    spec = make_toxic("slicer", average_size=100, size_variation=10, delay=5)
    with NemesisLog(path) as log:

        def writer(n: int) -> None:
            for i in range(50):
                log.write(
                    toxic_record("toxic_added", f"p{n}", "127.0.0.1:1", "127.0.0.1:2", spec, t=float(i))
                )

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(read_nemesis_log(path)) == 200


def test_unknown_types_and_broken_lines_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown record type 'proxy_moved'"):
        NemesisRecord("proxy_moved", 1.0, "p", "l", "u")
    path = tmp_path / "nemesis.jsonl"
    path.write_text(
        '{"type": "proxy_created", "t": 1, "proxy": "p", "listen": "l", "upstream": "u"}\nnot json\n'
    )
    with pytest.raises(ValueError, match=r"nemesis\.jsonl:2: not a mcpLabNemesis\.v1 record"):
        read_nemesis_log(path)
    with NemesisLog(path) as log:
        pass
    with pytest.raises(ValueError, match="closed"):
        log.write(proxy_record("proxy_created", "p", "l", "u"))
