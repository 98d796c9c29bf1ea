"""Reconnect storms: the proxy answers 429/503 itself, shaped in time."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from lab.faults.checks import Fields
from lab.faults.decisions import Window
from lab.faults.kinds.base import (
    Answer,
    BoolSpec,
    ChoiceSpec,
    DurationSpec,
    Evidence,
    FaultKind,
    Fired,
    IntChoiceSpec,
    OptionalDurationSpec,
    RateSpec,
    RequestEffect,
    RequestScope,
    Unit,
    param,
)

FAMILY: Final = "storms"


@dataclass(frozen=True, slots=True)
class StormParams:
    status: int = param(503, IntChoiceSpec((429, 503)), "the status the proxy answers with")
    retry_after: float = param(
        1.0, DurationSpec(), "seconds advised in `Retry-After` (sent rounded up to whole seconds)"
    )
    send_retry_after: bool = param(True, BoolSpec(), "false: answer without a `Retry-After` header")
    shape: str = param(
        "sustained",
        ChoiceSpec(("sustained", "burst", "ramp")),
        "sustained: `rate` all through the window; burst: `rate` during the first `burst` seconds of "
        "every `period`, else 0; ramp: from `from_rate` up to `rate` over `ramp` seconds, then `rate`",
    )
    period: float = param(10.0, DurationSpec(positive=True), "burst shape: the period")
    burst: float = param(2.0, DurationSpec(positive=True), "burst shape: the burst length (<= period)")
    ramp: float | None = param(
        None,
        OptionalDurationSpec(positive=True),
        "ramp shape: the ramp length",
        default_doc="the window's length",
    )
    from_rate: float = param(0.0, RateSpec(), "ramp shape: the rate it starts from (<= the rule's rate)")


class Storm(FaultKind[StormParams]):
    name = "storm"
    number = 6
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "answers 429/503 itself (JSON-RPC error body, `Retry-After`); the server never sees the request. "
        "A storm answers a request alone: no other request fault applies to it"
    )
    applies_to = "any request"
    evidence = (Evidence.FLOW,)
    feeds = frozenset({6})
    answers_alone = True
    params_type = StormParams

    def check(self, params: StormParams, f: Fields, window: Window | None, rate: float) -> None:
        if params.burst > params.period:
            f.problem(
                "burst",
                f"the burst ({params.burst:g}s) must not be longer than the period ({params.period:g}s)",
            )
        if params.shape == "ramp" and params.ramp is None and (window is None or window.end is None):
            f.problem("ramp", "a ramp storm needs a ramp length (params.ramp) or a window with an end")
        if params.from_rate > rate:
            f.problem("from_rate", f"must not exceed the rule's rate ({params.from_rate:g} > {rate:g})")

    def shape(self, rate: float, params: StormParams, window: Window | None, t: float) -> float:
        if params.shape == "sustained":
            return rate
        since = t - (window.start if window is not None else 0.0)
        if params.shape == "burst":
            return rate if (since % params.period) < params.burst else 0.0
        length = params.ramp
        if length is None:
            length = (window.end - window.start) if (window is not None and window.end is not None) else 1.0
        frac = min(1.0, max(0.0, since / length))
        return params.from_rate + (rate - params.from_rate) * frac

    def on_request(self, scope: RequestScope, fired: Fired, params: StormParams) -> RequestEffect:
        headers = {"content-type": "application/json"}
        if params.send_retry_after:
            headers["retry-after"] = str(math.ceil(params.retry_after))
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": scope.facts.rpc.id,
                "error": {"code": -32000, "message": f"lab fault: {params.status} storm"},
            }
        )
        return Answer(params.status, headers, body, {"status": params.status, "shape": params.shape})


KINDS: Final[tuple[FaultKind[Any], ...]] = (Storm(),)
