"""Toxic specifications: parsing and validation of the Toxiproxy v2 toxic fields (pure).

A toxic, as the API carries it::

    {"name": str, "type": str, "stream": "upstream"|"downstream",
     "toxicity": float, "attributes": {...}}

- `name` defaults to `<type>_<stream>`; it is unique within a proxy (both streams).
- `stream`: `upstream` is client -> server, `downstream` is server -> client (default).
- `toxicity`: the probability, per connection, that the toxic applies to it (default 1.0).

Attributes by type (all integers; a missing attribute is 0, like Toxiproxy's zero values):

| type | attribute | unit | meaning |
| --- | --- | --- | --- |
| latency | latency, jitter | ms | every chunk is delayed by latency ± jitter |
| bandwidth | rate | KB/s (1 KB = 1000 bytes) | throughput cap; must be >= 1 |
| slow_close | delay | ms | the close (EOF) is passed on this much later |
| timeout | timeout | ms | data is dropped; the connection is closed after `timeout` (0: never, until the toxic is removed, which closes it) |
| reset_peer | timeout | ms | on the first data after the toxic applies: drop it, wait `timeout`, then reset (RST) |
| limit_data | bytes | bytes | pass this many bytes, then close the connection |
| slicer | average_size, size_variation | bytes | cut chunks into slices of average_size ± size_variation (variation < average) |
| slicer | delay | µs | pause between slices |
| buffer | size, flush | bytes, ms | bytes are held until `size` are held, `flush` ms have passed since the first held byte (0: never), or the stream ends; then they go on at once. A response head carrying `X-Accel-Buffering: no` ends the buffering of its connection (the lab's nemesis only) |
| header_hold | — | — | each response's head (status and headers) is held until the first byte of its body, as some CDNs do (the lab's nemesis only) |
| idle_timeout | timeout | ms | the connection is closed (FIN both ways) once its `stream` direction has carried no byte for `timeout` ms: a proxy's read or idle timeout (not in Toxiproxy: the lab's nemesis only, `LAB_ONLY`) |

Stricter than Toxiproxy on purpose (a typo must not silently become a zero): unknown
fields and unknown attributes are refused, numbers must be integers (not 1.5, not true),
attributes must be >= 0, `toxicity` must lie in 0..1, `bandwidth.rate` must be >= 1 and
`slicer.average_size` >= 1, a toxic's name must not be empty, and an update cannot change
a toxic's name, type or stream. Every refusal is a `ValueError` whose message names the
field.

`compat=True` accepts what a real Toxiproxy accepts (`lab nemesis --compat`): unknown
fields and attributes are ignored, any int64 attribute and any toxicity are taken, an
empty name means the default one, and an update ignores name, type and stream. Numbers
must still be integers (Toxiproxy's JSON decoder refuses 1.5 and true too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

STREAMS: Final = ("upstream", "downstream")
DEFAULT_STREAM: Final = "downstream"

KIND_ATTRIBUTES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "latency": ("latency", "jitter"),
        "bandwidth": ("rate",),
        "slow_close": ("delay",),
        "timeout": ("timeout",),
        "reset_peer": ("timeout",),
        "limit_data": ("bytes",),
        "slicer": ("average_size", "size_variation", "delay"),
        "idle_timeout": ("timeout",),
        "buffer": ("size", "flush"),
        "header_hold": (),
    }
)
"""Every toxic type this nemesis implements, with its attributes in display order."""

LAB_ONLY: Final = frozenset({"idle_timeout", "buffer", "header_hold"})
"""Toxic types a real Toxiproxy does not have: what sits in front of servers in production
(a proxy's idle timeout), which Toxiproxy's set cannot make. A run through a real
Toxiproxy refuses them before it starts."""

BREAKS_CONNECTIONS: Final = frozenset({"timeout", "reset_peer", "limit_data", "idle_timeout"})
"""The toxic types that end the connections they act on (clients must recover)."""

_INT64_MAX: Final = 2**63 - 1  # Toxiproxy's attributes are Go int64
_TOXIC_FIELDS: Final = frozenset({"name", "type", "stream", "toxicity", "attributes"})
_UPDATE_FIELDS: Final = _TOXIC_FIELDS


@dataclass(frozen=True, slots=True)
class ToxicSpec:
    """One validated toxic. `kind` is the API's `type`; `attributes` is complete (every
    attribute of the kind, defaults filled in) and read-only."""

    name: str
    kind: str
    stream: str
    toxicity: float
    attributes: Mapping[str, int]

    def to_json(self) -> dict[str, object]:
        """The toxic as the API shows it."""
        return {
            "name": self.name,
            "type": self.kind,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }

    def attribute(self, key: str) -> int:
        """One attribute (always present: `attributes` is complete)."""
        return self.attributes[key]


def check_name(value: object, what: str) -> str:
    """A proxy or toxic name: a non-empty string that can stand in a URL path segment."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {_show(value)}")
    if not value.strip():
        raise ValueError(f"{what} must not be empty")
    if "/" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{what} {value!r} must not contain '/' or control characters")
    if len(value) > 200:
        raise ValueError(f"{what} is longer than 200 characters")
    return value


def parse_toxic(body: object, *, compat: bool = False) -> ToxicSpec:
    """A toxic from an API create body (a JSON object already decoded)."""
    if not isinstance(body, dict):
        raise ValueError(f"a toxic must be a JSON object, got {_show(body)}")
    if not compat:
        _refuse_unknown(body, _TOXIC_FIELDS, "toxic field")
        if "type" not in body:
            raise ValueError("missing required field: type")
    kind = body.get("type")
    stream = _parse_stream(body.get("stream", DEFAULT_STREAM))
    if not isinstance(kind, str) or kind not in KIND_ATTRIBUTES:
        if compat:
            raise ValueError("invalid toxic type")
        raise ValueError(f"invalid toxic type {_show(kind)}; known types: {', '.join(KIND_ATTRIBUTES)}")
    if "name" not in body or (compat and body["name"] in (None, "")):
        name = f"{kind}_{stream}"  # Toxiproxy's default name
    else:
        name = check_name(body["name"], "toxic name")
    toxicity = _parse_toxicity(body.get("toxicity", 1.0), compat=compat)
    attributes = parse_attributes(kind, body.get("attributes", {}), compat=compat)
    return ToxicSpec(name, kind, stream, toxicity, attributes)


def parse_toxic_update(current: ToxicSpec, body: object, *, compat: bool = False) -> ToxicSpec:
    """`current` changed by an API update body: `toxicity` and any subset of `attributes`.

    The name, type and stream of a toxic cannot change (delete it and add another); a body
    that repeats them unchanged is accepted. With `compat`, they are ignored, as are
    unknown fields.
    """
    if not isinstance(body, dict):
        raise ValueError(f"a toxic update must be a JSON object, got {_show(body)}")
    if not compat:
        _refuse_unknown(body, _UPDATE_FIELDS, "toxic field")
        for key, now in (("name", current.name), ("type", current.kind), ("stream", current.stream)):
            if key in body and body[key] != now:
                raise ValueError(
                    f"a toxic's {key} cannot change ({now!r} -> {_show(body[key])}): remove it and add another"
                )
    toxicity = _parse_toxicity(body["toxicity"], compat=compat) if "toxicity" in body else current.toxicity
    changes = body.get("attributes", {})
    if not isinstance(changes, dict):
        raise ValueError(f"attributes must be a JSON object, got {_show(changes)}")
    merged: dict[str, object] = {**current.attributes, **changes}
    attributes = parse_attributes(current.kind, merged, compat=compat)
    return ToxicSpec(current.name, current.kind, current.stream, toxicity, attributes)


def parse_attributes(kind: str, raw: object, *, compat: bool = False) -> Mapping[str, int]:
    """The complete, validated attributes of a toxic of type `kind` (with `compat`:
    unknown attributes ignored, any int64 taken)."""
    allowed = KIND_ATTRIBUTES.get(kind)
    if allowed is None:
        raise ValueError(f"invalid toxic type {_show(kind)}")
    if not isinstance(raw, dict):
        raise ValueError(f"attributes must be a JSON object, got {_show(raw)}")
    if not compat:
        _refuse_unknown(raw, frozenset(allowed), f"attribute of {kind}")
    out: dict[str, int] = {}
    for key in allowed:
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{kind}.{key} must be an integer, got {_show(value)}")
        if value < 0 and not compat:
            raise ValueError(f"{kind}.{key} must be >= 0, got {value}")
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise ValueError(f"{kind}.{key} is too large ({value})")
        out[key] = value
    if not compat:
        _check_kind_rules(kind, out)
    return MappingProxyType(out)


def make_toxic(
    kind: str,
    *,
    stream: str = DEFAULT_STREAM,
    name: str | None = None,
    toxicity: float = 1.0,
    **attributes: int,
) -> ToxicSpec:
    """A validated toxic for code (same rules as the API): `make_toxic("latency", latency=200)`."""
    body: dict[str, object] = {"type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes}
    if name is not None:
        body["name"] = name
    return parse_toxic(body)


def _check_kind_rules(kind: str, attrs: Mapping[str, int]) -> None:
    # Values that would make Toxiproxy spin or divide by zero are refused here.
    if kind == "bandwidth" and attrs["rate"] < 1:
        raise ValueError("bandwidth.rate must be >= 1 (KB/s); to stop all data use a timeout toxic")
    if kind == "buffer" and attrs["size"] < 1:
        raise ValueError("buffer.size must be >= 1 (bytes held before they go on)")
    if kind == "idle_timeout" and attrs["timeout"] < 1:
        raise ValueError("idle_timeout.timeout must be >= 1 (ms of silence before the connection is closed)")
    if kind == "slicer":
        if attrs["average_size"] < 1:
            raise ValueError("slicer.average_size must be >= 1 (bytes)")
        if attrs["size_variation"] >= attrs["average_size"]:
            raise ValueError(
                f"slicer.size_variation ({attrs['size_variation']}) must be smaller than "
                f"slicer.average_size ({attrs['average_size']})"
            )


def _parse_stream(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in STREAMS:
        raise ValueError(f"stream was invalid, can be either upstream or downstream (got {_show(value)})")
    return value.lower()


def _parse_toxicity(value: object, *, compat: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"toxicity must be a number in 0..1, got {_show(value)}")
    if compat:  # any finite number: above 1 always applies, below 0 never
        if not math.isfinite(float(value)):
            raise ValueError(f"toxicity must be a finite number, got {value}")
        return float(value)
    if not 0.0 <= float(value) <= 1.0:  # also refuses NaN
        raise ValueError(f"toxicity must be in 0..1, got {value}")
    return float(value)


def _refuse_unknown(body: Mapping[str, object], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise ValueError(
            f"unknown {what}: {', '.join(map(repr, unknown))}; expected one of {', '.join(sorted(allowed))}"
        )


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
