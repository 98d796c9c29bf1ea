"""Which pieces of a JSON-lines ledger the checker reads on its fast path."""

from __future__ import annotations

from typing import Any

import pytest

from lab.checker.inputs import jsonl_fast


def fast_path_outcomes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, one entry per piece the checker decodes: True when the fast path
    (lab.checker.inputs.jsonl_fast) read it, False when it went the general way."""
    decode = jsonl_fast.decode_piece
    outcomes: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = decode(*args, **kwargs)
        outcomes.append(out is not None)
        return out

    monkeypatch.setattr(jsonl_fast, "decode_piece", counted)
    return outcomes
