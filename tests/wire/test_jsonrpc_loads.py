"""`jsonrpc.loads` calls json's scanner directly for a text that is one JSON value and
nothing else (for speed): it must answer exactly as `json.loads` does, value or error, for
every input, including whitespace around, trailing data, bytes and broken JSON."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from lab.wire import jsonrpc

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def outcome(fn: object, text: str | bytes) -> tuple[str, object]:
    try:
        return "value", fn(text)  # type: ignore[operator]
    except (ValueError, RecursionError) as e:
        return type(e).__name__, str(e)


@given(
    value=values, before=st.sampled_from(["", " ", "\n"]), after=st.sampled_from(["", " ", "x", "}", "\n"])
)
def test_the_same_answer_as_json_loads(value: object, before: str, after: str) -> None:
    text = before + json.dumps(value, ensure_ascii=False) + after
    assert outcome(jsonrpc.loads, text) == outcome(json.loads, text)
    assert outcome(jsonrpc.loads, text.encode()) == outcome(json.loads, text.encode())


@given(text=st.text(alphabet='{}[]":,0123456789.eE-+ tfnrulasNIn\\u', max_size=30))
@example(text="")
@example(text='{"a":1}{"b":2}')
@example(text="[" * 5000)
@example(text="NaN")
def test_the_same_error_as_json_loads_on_broken_text(text: str) -> None:
    assert outcome(jsonrpc.loads, text) == outcome(json.loads, text)
