"""Scenarios written back as TOML, for the tools that make scenarios (a replay or a shrink
of a recorded run writes its clients as `[[load.clients]]`).

- `clients_toml(clients)`: the `[[load.clients]]` tables of scripted clients, to put in a
  scenario file after its top-level keys (they need no `[load]` header of their own, so
  they go before or after the file's `[load]` table alike).
- `scenario_toml(sc)`: a whole scenario that loads back equal to `sc` (every value
  written out, defaults included; no `name`, which the file's name gives); or a
  scenario's TOML data (a dict as `tomllib` gives it) written as it is.
- `toml_text(doc)`: the emitter under both, for a mapping of strings, integers, floats,
  booleans, lists of those, and tables. Floats are written as `repr` writes them, which
  reads back as the same float; strings are escaped as TOML basic strings. There is no
  TOML writer among the lab's dependencies (tomllib only reads), hence this one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Final

from lab.load.settings import ClientScript
from lab.scenario.parts import Scenario

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_INT64: Final = (-(2**63), 2**63 - 1)
"""TOML's integers (a reader need hold no more)."""


# ---------------------------------------------------------------------- values


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: quotes, backslashes and control characters escaped,
    everything else as it is (a TOML file is UTF-8)."""
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r}: a lone surrogate is not Unicode text, which TOML holds only")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    """A key, bare when TOML allows it (letters, digits, `_`, `-`), else quoted."""
    if not isinstance(key, str):
        raise TypeError(f"a TOML key is a string, got {key!r}")
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_value(value: object) -> str:
    """One value as TOML: a string, integer, float, boolean, list (inline array) or
    mapping (inline table). None has no TOML form: leave its key out instead."""
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return "true" if value else "false"
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"{value}: outside TOML's 64-bit integers")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"  # (repr's `nan` too; said here so no sign or payload is implied)
        return repr(value)  # the shortest text that reads back as this very float: inf, -0.0, 1e-07
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, Mapping):
        items = [f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None:
        raise TypeError("None has no TOML form: leave the key out")
    raise TypeError(f"no TOML form for {type(value).__name__}: {value!r}")


# ---------------------------------------------------------------------- documents


INLINE_LISTS: Final = frozenset({"at"})
"""Keys whose list of tables is written inline, one table a line (a fault's pins, `at`:
a replay has hundreds, each a few short keys), not as `[[tables]]`."""


def toml_text(doc: Mapping[str, object]) -> str:
    """A TOML document of `doc`: its plain values first, then each nested mapping as a
    `[table]` and each non-empty list of mappings as `[[tables]]` (inline, a table a line,
    under a key of INLINE_LISTS), in `doc`'s order. A table that holds only tables gets no
    header of its own (theirs define it)."""
    lines: list[str] = []
    _emit(lines, (), doc, array=False)
    return "\n".join(lines).strip("\n") + "\n"


def _is_table_array(value: object) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _plain(key: str, value: object) -> str:
    if key in INLINE_LISTS and _is_table_array(value):
        assert isinstance(value, list | tuple)
        return f"{toml_key(key)} = [\n" + "".join(f"    {toml_value(v)},\n" for v in value) + "]"
    return f"{toml_key(key)} = {toml_value(value)}"


def _emit(lines: list[str], path: tuple[str, ...], table: Mapping[str, object], *, array: bool) -> None:
    plain = {
        k: v
        for k, v in table.items()
        if not isinstance(v, Mapping) and (k in INLINE_LISTS or not _is_table_array(v))
    }
    nested = [(k, v) for k, v in table.items() if k not in plain]
    header = ".".join(toml_key(p) for p in path)
    if array:
        lines += ["", f"[[{header}]]"]  # always: it makes a new element
    elif path and (plain or not nested):
        lines += ["", f"[{header}]"]
    lines += [_plain(k, v) for k, v in plain.items()]
    for key, value in nested:
        if isinstance(value, Mapping):
            _emit(lines, (*path, key), value, array=False)
        else:
            assert isinstance(value, list | tuple)
            for item in value:
                _emit(lines, (*path, key), item, array=True)


# ---------------------------------------------------------------------- scenarios


def client_tables(clients: Iterable[ClientScript]) -> list[dict[str, object]]:
    """Scripted clients as `[[load.clients]]` tables: `id`, `ops`, `at` (seconds, floats)."""
    return [{"id": c.id, "ops": list(c.ops), "at": [float(t) for t in c.at]} for c in clients]


def clients_toml(clients: Iterable[ClientScript]) -> str:
    """The `[[load.clients]]` tables of `clients`, in their order, as TOML text."""
    tables = client_tables(clients)
    return toml_text({"load": {"clients": tables}}) if tables else ""


def scenario_dict(sc: Scenario) -> dict[str, object]:
    """`sc` in the scenario file's own form (docs/scenarios.md), every value written out,
    so that it loads back equal: durations in seconds, faults and toxics with their
    windows resolved (a `phase = ...` binding becomes its window), no `name` (a
    scenario's name is its file's)."""
    t, lo = sc.target, sc.load
    target: dict[str, object] = {"kind": t.kind, "protocol_version": t.protocol_version, "era": t.era}
    if t.kind == "url":
        target["url"] = t.url
        if t.restart_command:
            target.update(restart_command=list(t.restart_command), restart_timeout=t.restart_timeout)
    else:
        target.update(
            session_ttl=t.session_ttl,
            delete=t.delete,
            allowed_origins=list(t.allowed_origins),
            max_streams=t.max_streams,
            max_rps=t.max_rps,
            retry_after=t.retry_after,
            keepalive=t.keepalive,
            store=t.store,
            replicas=t.replicas,
        )
        if t.replicas > 1:
            target["affinity"] = t.affinity
        if t.tokens:
            target["tokens"] = dict(t.tokens)
    load: dict[str, object] = {
        "users": lo.users,
        "spawn_rate": lo.spawn_rate,
        "duration": lo.duration,
        "event_target": lo.event_target,
        "hard_timeout": lo.hard_timeout,
        "stall_timeout": lo.stall_timeout,
        "workers": lo.workers,
        "wait_min": lo.wait_min,
        "wait_max": lo.wait_max,
        "open_standalone": lo.open_standalone,
        "until_knee": lo.until_knee,
        "client": lo.client,
        "mix": dict(lo.mix),
        "ticker": asdict(lo.ticker),
    }
    if lo.clients:  # (an empty `clients` list is refused: none is said by leaving it out)
        load["clients"] = client_tables(lo.clients)
    doc: dict[str, object] = {
        "description": sc.description,
        "seed": sc.seed,
        **({"check": sc.check} if sc.check != "gates" else {}),
        "target": target,
        "load": load,
        "reconnect": asdict(sc.reconnect),
        "budgets": sc.budgets(),
        # A rule's own form is the fault plan's (read back by the same reader); an empty
        # match or params table says what leaving it out says.
        "faults": [_drop_empty_tables(r.to_dict()) for r in sc.faults],
        "toxics": [t.to_dict() for t in sc.toxics],
        "phases": [
            {
                "name": p.name,
                "kind": p.kind,
                "duration": p.duration,
                "users": p.users,
                "spawn_rate": p.spawn_rate,
                **({"server": dict(p.server)} if p.server else {}),
            }
            for p in sc.phases
        ],
        "restarts": [r.to_dict() if t.kind == "reference" else {"at": r.at} for r in sc.restarts],
        "expected_failures": {k: list(v) for k, v in sc.expected_failures.items()},
    }
    cleaned = _without_none(doc)
    assert isinstance(cleaned, dict)
    # Sections with nothing in them are left out (the same as empty, to the reader).
    return {k: v for k, v in cleaned.items() if v != [] and v != {}}


def scenario_toml(scenario: Scenario | Mapping[str, object]) -> str:
    """A scenario file: of a loaded `Scenario`, one that loads back equal to it
    (`scenario_dict`); of a scenario's TOML data (a file as `tomllib` read it, perhaps
    changed, as a replay changes it), that data as it is, keys without a value (None)
    left out."""
    if isinstance(scenario, Scenario):
        return toml_text(scenario_dict(scenario))
    doc = _without_none(scenario)
    assert isinstance(doc, dict)
    return toml_text(doc)


def _without_none(value: object) -> object:
    """`value` with every None (no TOML form; to the reader, a key left out) removed."""
    if isinstance(value, Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value if v is not None]
    return value


def _drop_empty_tables(table: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in table.items() if not (isinstance(v, Mapping) and not v)}
