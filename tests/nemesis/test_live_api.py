"""The nemesis' HTTP API and its log, against the real process: the proxy lifecycle
through toxiproxy-python, bad input answered with the right 4xx (and the server still
serving), one log line per change, and the schedule runner acting on time."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from lab.nemesis.client import ConflictError, NotFoundError, ToxiproxyClient
from lab.nemesis.log import NemesisLog, NemesisRecord, read_nemesis_log, read_toxic_outcomes
from lab.nemesis.schedule import ScheduledToxic, ToxicScheduleRunner
from lab.nemesis.toxics import make_toxic
from tests.nemesis.conftest import NemesisProcess, ProxyFactory, listen_port, running_nemesis
from tests.nemesis.upstreams import TcpServer, connect, echo, round_trip

pytestmark = pytest.mark.live


def _raw(nemesis: NemesisProcess, method: str, path: str, body: str | None = None) -> requests.Response:
    return requests.request(method, nemesis.url + path, data=body, timeout=5)


def test_proxy_lifecycle_through_toxiproxy_python(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    assert client.version().startswith("lab-nemesis")
    with TcpServer(echo) as up:
        info = make_proxy(up.port)
        assert info.upstream == f"127.0.0.1:{up.port}" and info.enabled
        assert info.listen.startswith("127.0.0.1:") and listen_port(info) > 0, "port 0 became a real port"
        assert client.proxies()[info.name] == info
        assert client.toxics(info.name) == {}
        with connect(listen_port(info)) as s:
            assert round_trip(s, b"through the nemesis") < 5
        client.add_toxic(info.name, make_toxic("latency", latency=10, jitter=5))
        assert client.toxics(info.name)["latency_downstream"].attributes == {"latency": 10, "jitter": 5}
        client.delete_proxy(info.name)
        assert client.get_proxy(info.name) is None
        with pytest.raises(ConnectionRefusedError):
            connect(listen_port(info)).close()


def test_the_log_has_one_flushed_line_per_change(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(echo) as up:
        windows: list[tuple[float, float]] = []

        def timed(action: object) -> None:
            before = time.time()
            assert callable(action)
            action()
            windows.append((before, time.time()))

        holder: dict[str, str] = {}
        timed(lambda: holder.setdefault("name", make_proxy(up.port).name))
        name = holder["name"]
        toxic = make_toxic("bandwidth", stream="upstream", rate=100, toxicity=0.5)
        timed(lambda: client.add_toxic(name, toxic))
        timed(lambda: client.remove_toxic(name, "bandwidth_upstream"))
        timed(lambda: client.delete_proxy(name))
        records = nemesis.records(name)  # read while the nemesis runs: lines are flushed
    assert [r.type for r in records] == ["proxy_created", "toxic_added", "toxic_removed", "proxy_deleted"]
    for record, (before, after) in zip(records, windows, strict=True):
        assert before <= record.t <= after, (record, before, after)
        assert record.proxy == name and record.upstream == f"127.0.0.1:{up.port}"
        assert record.listen.startswith("127.0.0.1:") and not record.listen.endswith(":0")
    for record in records[1:3]:
        assert (record.toxic, record.kind, record.stream, record.toxicity) == (
            "bandwidth_upstream",
            "bandwidth",
            "upstream",
            0.5,
        )
        assert record.attributes == {"rate": 100}
    assert records[0].toxic is None and records[0].attributes is None


def test_bad_input_gets_the_right_4xx_and_the_server_keeps_running(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(echo) as up:
        info = make_proxy(up.port)
        name = info.name

        bad_json = _raw(nemesis, "POST", "/proxies", "{not json")
        assert bad_json.status_code == 400 and "bad request body" in bad_json.json()["error"]
        assert _raw(nemesis, "POST", f"/proxies/{name}/toxics", "").status_code == 400

        for body, message in [
            ({"type": "gremlins", "attributes": {}}, "invalid toxic type"),
            ({"type": "latency", "attributes": {"latency": -5}}, "must be >= 0"),
            ({"type": "latency", "stream": "sideways", "attributes": {"latency": 5}}, "stream was invalid"),
            ({"type": "latency", "toxicity": 2, "attributes": {"latency": 5}}, "toxicity"),
        ]:
            refused = _raw(nemesis, "POST", f"/proxies/{name}/toxics", json.dumps(body))
            assert refused.status_code == 400 and message in refused.json()["error"], (body, refused.text)

        again = _raw(nemesis, "POST", "/proxies", f'{{"name": "{name}", "upstream": "127.0.0.1:{up.port}"}}')
        assert again.status_code == 409 and again.json() == {"error": "proxy already exists", "status": 409}
        with pytest.raises(ConflictError):
            client.create_proxy(name, f"127.0.0.1:{up.port}")

        client.add_toxic(name, make_toxic("latency", latency=1))
        with pytest.raises(ConflictError, match="toxic already exists"):
            client.add_toxic(name, make_toxic("latency", latency=2))

        with pytest.raises(NotFoundError):
            client.add_toxic("no_such_proxy", make_toxic("latency", latency=1))
        with pytest.raises(NotFoundError):
            client.remove_toxic(name, "no_such_toxic")
        with pytest.raises(NotFoundError):
            client.delete_proxy("no_such_proxy")
        assert _raw(nemesis, "GET", "/proxies/no_such_proxy").status_code == 404
        assert _raw(nemesis, "GET", "/no/such/endpoint").status_code == 404
        wrong_method = _raw(nemesis, "PUT", "/proxies")
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET, POST"
        api_port = nemesis.url.rsplit(":", 1)[1]
        taken = _raw(
            nemesis,
            "POST",
            "/proxies",
            f'{{"name": "x", "upstream": "127.0.0.1:1", "listen": "127.0.0.1:{api_port}"}}',
        )
        assert taken.status_code == 409 and "cannot listen" in taken.json()["error"]
        assert client.get_proxy("x") is None
        outside = _raw(nemesis, "POST", "/proxies", '{"name": "x", "upstream": "10.0.0.1:80"}')
        assert outside.status_code == 400 and "loopback" in outside.json()["error"]
        browser = requests.get(nemesis.url + "/proxies", headers={"User-Agent": "Mozilla/5.0"}, timeout=5)
        assert browser.status_code == 403, "a web page must not drive the nemesis"

        with socket.create_connection(("127.0.0.1", int(nemesis.url.rsplit(":", 1)[1])), timeout=5) as raw:
            raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 400 ")

        assert nemesis.alive()
        assert client.version().startswith("lab-nemesis")
        with connect(listen_port(info)) as s:
            assert round_trip(s) < 5


def test_update_reset_and_populate(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(echo) as up:
        name = make_proxy(up.port).name
        client.add_toxic(name, make_toxic("latency", latency=5))
        moved = _raw(nemesis, "POST", f"/proxies/{name}", '{"listen": "127.0.0.1:0"}').json()
        assert moved["toxics"][0]["name"] == "latency_downstream", "toxics survive a restart"
        updated = _raw(
            nemesis, "POST", f"/proxies/{name}/toxics/latency_downstream", '{"attributes": {"jitter": 2}}'
        )
        assert updated.json()["attributes"] == {"latency": 5, "jitter": 2}
        client.set_enabled(name, False)
        client.reset()
        after = client.proxies()[name]
        assert after.enabled and client.toxics(name) == {}
        with connect(int(after.listen.rsplit(":", 1)[1])) as s:
            assert round_trip(s) < 5

        populated = _raw(
            nemesis, "POST", "/populate", f'[{{"name": "{name}_pop", "upstream": "127.0.0.1:{up.port}"}}]'
        )
        make_proxy.names.append(f"{name}_pop")
        assert populated.status_code == 201
        assert [p["name"] for p in populated.json()["proxies"]] == [f"{name}_pop"]
    types = [(r.type, r.toxic) for r in nemesis.records(name)]
    assert types == [
        ("proxy_created", None),
        ("toxic_added", "latency_downstream"),
        ("proxy_deleted", None),  # the listen change restarted it
        ("proxy_created", None),
        ("toxic_removed", "latency_downstream"),  # the update: old version out, new in
        ("toxic_added", "latency_downstream"),
        ("toxic_added", "down"),
        ("toxic_removed", "latency_downstream"),  # reset
        ("toxic_removed", "down"),
    ]


def test_schedule_runner_adds_then_removes_on_time(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(echo) as up:
        name = make_proxy(up.port).name
        windowed = make_toxic("latency", latency=50)
        open_ended = make_toxic("limit_data", stream="upstream", bytes=1_000_000)
        start = time.time() + 0.2
        with NemesisLog(nemesis.log) as shared:  # the nemesis writes to this file too
            runner = ToxicScheduleRunner(
                client,
                [ScheduledToxic(name, windowed, at=0.5, until=1.5), ScheduledToxic(name, open_ended, at=0.2)],
                start,
                log=shared,
            )
            stop = threading.Timer(2.5, runner.stop)  # the end of the run: the open-ended toxic goes
            stop.start()
            outcomes = runner.run()
            stop.join()
        assert client.toxics(name) == {}, "the end of the run removed what it added"
    assert [(o.step.action, o.step.toxic.name) for o in outcomes] == [
        ("add", "limit_data_upstream"),
        ("add", "latency_downstream"),
        ("remove", "latency_downstream"),
        ("remove", "limit_data_upstream"),  # cleanup
    ]
    assert all(o.ok for o in outcomes), outcomes
    logged = {(r.type, r.toxic): r.t for r in nemesis.records(name) if r.toxic is not None}
    for (kind, toxic), offset in {
        ("toxic_added", "limit_data_upstream"): 0.2,
        ("toxic_added", "latency_downstream"): 0.5,
        ("toxic_removed", "latency_downstream"): 1.5,
    }.items():
        t = logged[(kind, toxic)]
        assert start + offset - 0.02 <= t <= start + offset + 1.0, (kind, toxic, t - start)
    assert logged[("toxic_removed", "limit_data_upstream")] >= logged[("toxic_removed", "latency_downstream")]
    # one outcome record per call, in the same file as the nemesis's own records
    mine = [o for o in read_toxic_outcomes(nemesis.log) if o.proxy == name]
    assert [(o.action, o.toxic, o.kind, o.outcome) for o in mine] == [
        ("add", "limit_data_upstream", "limit_data", "ok"),
        ("add", "latency_downstream", "latency", "ok"),
        ("remove", "latency_downstream", "latency", "ok"),
        ("remove", "limit_data_upstream", "limit_data", "ok"),
    ]
    assert mine[2].t >= logged[("toxic_removed", "latency_downstream")], "the outcome follows the change"


def test_schedule_runner_stopped_early_leaves_no_toxic(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    with TcpServer(echo) as up:
        name = make_proxy(up.port).name
        runner = ToxicScheduleRunner(
            client, [ScheduledToxic(name, make_toxic("latency", latency=50), at=0.0, until=60.0)], time.time()
        )
        thread = threading.Thread(target=runner.run)
        thread.start()
        deadline = time.monotonic() + 5
        while not client.toxics(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "latency_downstream" in client.toxics(name)
        runner.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert client.toxics(name) == {}


def test_stopping_the_nemesis_ends_every_window_in_the_log(tmp_path: Path) -> None:
    with TcpServer(echo) as up, running_nemesis(tmp_path) as process:
        own = ToxiproxyClient(process.url)
        own.create_proxy("a", f"127.0.0.1:{up.port}")
        own.add_toxic("a", make_toxic("latency", latency=5))
        own.create_proxy("b", f"127.0.0.1:{up.port}", enabled=False)
        records = process.records
    # `running_nemesis` has stopped it by SIGTERM (and checked it exited 0)
    assert [(r.type, r.proxy, r.toxic) for r in records()] == [
        ("proxy_created", "a", None),
        ("toxic_added", "a", "latency_downstream"),
        ("proxy_created", "b", None),
        ("toxic_added", "b", "down"),
        ("toxic_removed", "a", "latency_downstream"),
        ("proxy_deleted", "a", None),
        ("toxic_removed", "b", "down"),
        ("proxy_deleted", "b", None),
    ]


def test_the_client_side_log_matches_the_server_side_log(
    make_proxy: ProxyFactory, nemesis: NemesisProcess, tmp_path: Path
) -> None:
    """Against a real Toxiproxy only the client can log: it must write what a server
    that logs itself would write (here the nemesis stands in for the real one)."""
    with TcpServer(echo) as up, NemesisLog(tmp_path / "client.jsonl") as log:
        logging_client = ToxiproxyClient(nemesis.url, log=log)
        name = f"{make_proxy.prefix}_logged"
        make_proxy.names.append(name)
        logging_client.create_proxy(name, f"127.0.0.1:{up.port}")
        logging_client.add_toxic(name, make_toxic("latency", latency=5))
        logging_client.update_toxic(name, make_toxic("latency", latency=7, toxicity=0.5))
        logging_client.set_enabled(name, False)
        logging_client.reset()
        logging_client.add_toxic(name, make_toxic("bandwidth", rate=10))
        logging_client.delete_proxy(name)
    client_side = read_nemesis_log(tmp_path / "client.jsonl")
    server_side = nemesis.records(name)

    def view(r: NemesisRecord) -> tuple[object, ...]:
        return (r.type, r.proxy, r.listen, r.upstream, r.toxic, r.kind, r.stream, r.toxicity, r.attributes)

    assert [view(r) for r in client_side] == [view(r) for r in server_side]
    assert len(client_side) == 10
    assert all(c.t >= s.t for c, s in zip(client_side, server_side, strict=True)), (
        "the client logs after the answer"
    )
