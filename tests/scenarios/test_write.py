"""Scenarios written as TOML (lab.scenario.write): every value reads back as it was
(through tomllib, the reader the lab uses), and every shipped scenario, written out,
loads back equal."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from lab.load.settings import ClientScript
from lab.scenario import load_scenario, scenario_names
from lab.scenario.write import clients_toml, scenario_dict, scenario_toml, toml_key, toml_text, toml_value

FLOATS = [0.0, -0.0, 0.1, 0.5, 2.25, 1 / 3, 1e-7, 5e-324, 1.7976931348623157e308, 1e16, 123456.789, -2.5]


@pytest.mark.parametrize("x", FLOATS)
def test_floats_read_back_exactly(x: float) -> None:
    back = tomllib.loads(f"x = {toml_value(x)}")["x"]
    assert isinstance(back, float) and back == x and math.copysign(1, back) == math.copysign(1, x)


def test_special_floats_and_integers() -> None:
    doc = {"inf": math.inf, "ninf": -math.inf, "big": 2**63 - 1, "small": -(2**63), "zero": 0}
    back = tomllib.loads(toml_text(doc))
    assert back == doc and all(type(back[k]) is type(v) for k, v in doc.items())
    assert math.isnan(tomllib.loads(f"x = {toml_value(math.nan)}")["x"])
    with pytest.raises(ValueError, match="64-bit"):
        toml_value(2**63)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        'a "quoted" word',
        "back\\slash \\n not a newline",
        "new\nline\ttab\rcr\bbs\fff",
        "\x00\x01\x1f\x7f controls",
        "unicode: é ü 漢字 🙂 \u2028",
        "'single' and ''' triple '''",
        '"""',
    ],
)
def test_strings_read_back_exactly(text: str) -> None:
    assert tomllib.loads(f"s = {toml_value(text)}")["s"] == text
    assert tomllib.loads(f"{toml_key(text)} = 1") == {text: 1}  # as a key too (`""` is one)


def test_a_string_that_is_not_unicode_text_is_refused() -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        toml_value("a\udc00b")


def test_what_toml_cannot_hold_is_refused() -> None:
    with pytest.raises(TypeError, match="None has no TOML form"):
        toml_text({"a": None})
    with pytest.raises(TypeError, match="no TOML form for set"):
        toml_value({1, 2})


def test_tables_lists_and_keys_read_back() -> None:
    doc: dict[str, object] = {
        "title": "x",
        "flag": False,
        "on": True,
        "n": [1, 2, 3],
        "mixed": [1, "two", 3.0, [True], {"inline": "table"}],
        "empty_list": [],
        "table": {"a": 1, "b.c": "dotted key", "with space": 2, "nested": {"deep": [0.5]}, "empty": {}},
        "only_tables": {"sub": {"x": 1}},
        "items": [
            {"id": "a", "at": [0.5], "meta": {"k": "v"}, "inner": [{"q": 1}, {"q": 2}]},
            {"id": "b", "at": []},
        ],
        "": "empty key",
    }
    assert tomllib.loads(toml_text(doc)) == doc


def test_a_table_of_tables_gets_no_header_of_its_own() -> None:
    text = toml_text({"load": {"clients": [{"id": "a"}]}})
    assert text == '[[load.clients]]\nid = "a"\n'


def test_clients_toml_is_the_tables_of_the_format() -> None:
    clients = [
        ClientScript("w0-u4", ("stream", "write", "read"), (0.5, 2.25, 4.0)),
        ClientScript("idle", (), ()),
        ClientScript("c.3_x-y", ("read",), (1 / 3,)),
    ]
    text = clients_toml(clients)
    assert text.startswith(
        '[[load.clients]]\nid = "w0-u4"\nops = ["stream", "write", "read"]\nat = [0.5, 2.25, 4.0]\n\n'
    )
    back = tomllib.loads(text)["load"]["clients"]
    assert [ClientScript(c["id"], tuple(c["ops"]), tuple(c["at"])) for c in back] == clients
    assert clients_toml([]) == ""


def test_clients_toml_goes_into_a_scenario_before_or_after_its_load_table(tmp_path: Path) -> None:
    clients = [ClientScript("a", ("read", "stream"), (0.2, 0.6)), ClientScript("b", ("write",), (1.0,))]
    top, load = "seed = 1\n\n", '[load]\nduration = "60s"\n'
    tables = clients_toml(clients)
    for n, text in enumerate((top + load + "\n" + tables, top + tables + "\n" + load)):
        path = tmp_path / f"s{n}.toml"
        path.write_text(text)
        assert load_scenario(path).load.clients == tuple(clients)


@pytest.mark.parametrize("name", scenario_names())
def test_every_shipped_scenario_written_out_loads_back_equal(tmp_path: Path, name: str) -> None:
    sc = load_scenario(name)
    path = tmp_path / f"{name}.toml"
    path.write_text(scenario_toml(sc))
    assert replace(load_scenario(path), path=sc.path) == sc


def test_a_scripted_scenario_written_out_loads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "scripted.toml"
    path.write_text(
        'seed = 9\ndescription = "a \\"quoted\\" one"\n[load]\nduration = 30\n[load.ticker]\ncount = 5\n'
        + clients_toml([ClientScript("w0-u7", ("read", "stream"), (0.2, 0.6)), ClientScript("z", (), ())])
    )
    sc = load_scenario(path)
    again = tmp_path / "again" / "scripted.toml"
    again.parent.mkdir()
    again.write_text(scenario_toml(sc))
    assert replace(load_scenario(again), path=path) == sc
    assert scenario_dict(sc)["load"]["clients"] == [  # type: ignore[index]
        {"id": "w0-u7", "ops": ["read", "stream"], "at": [0.2, 0.6]},
        {"id": "z", "ops": [], "at": []},
    ]


def test_a_scenarios_toml_data_is_written_as_it_is(tmp_path: Path) -> None:
    # What a replay does: the file's data as tomllib read it, changed, written back.
    doc = tomllib.loads(load_scenario("smoke").path.read_text(encoding="utf-8"))
    doc["load"] = {"duration": "40s", "clients": [{"id": "w0-u1", "ops": ["read"], "at": [0.25]}]}
    doc["faults"][0]["window"] = None  # (no TOML form: left out)
    text = scenario_toml(doc)
    back = tomllib.loads(text)
    assert back["load"] == doc["load"] and "window" not in back["faults"][0]
    path = tmp_path / "smoke.toml"
    path.write_text(text)
    assert load_scenario(path).load.clients == (ClientScript("w0-u1", ("read",), (0.25,)),)


def test_a_faults_pins_are_written_inline_one_a_line_and_read_back() -> None:
    doc = {
        "faults": [
            {
                "kind": "cut_stream",
                "id": "cut_stream#0",
                "at": [
                    {"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 2, "event": 3},
                    {"client": "w0-u5", "request": "GET resume", "ordinal": 1, "event": 0},
                ],
            }
        ],
        "load": {"clients": [{"id": "w0-u4", "ops": ["stream"], "at": [0.5]}]},
    }
    text = toml_text(doc)
    assert '    { client = "w0-u4", request = "POST tools/call ticker", ordinal = 2, event = 3 },\n' in text
    assert "[[faults.at]]" not in text
    assert tomllib.loads(text) == doc
