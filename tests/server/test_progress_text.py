"""A ticker's progress notifications are written from a template (`progress_json`), not by
json's encoder: the text must be exactly what the encoder writes, byte for byte, since the
bytes are digested into event IDs and ledgers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lab.server.tools import progress_json
from lab.wire import jsonrpc

tokens = st.one_of(st.text(max_size=30), st.integers(min_value=-(2**63), max_value=2**63))


@given(token=tokens, n=st.integers(min_value=-5, max_value=10**9), total=st.none() | st.integers(0, 10**9))
def test_progress_json_is_the_encoders_text(token: str | int, n: int, total: int | None) -> None:
    params: dict[str, object] = {"progressToken": token, "progress": n}
    if total is not None:
        params["total"] = total
    assert progress_json(token, n, total) == jsonrpc.dumps(jsonrpc.notification(jsonrpc.PROGRESS, params))
