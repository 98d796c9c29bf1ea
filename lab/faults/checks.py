"""Typed reads of untrusted mappings (TOML, JSON) that collect every problem, not the first.

`Fields` reads one table: each read checks the type and range of one key and, when it is
wrong, records an `Issue` naming the dotted key and what was expected, then returns the
default so the caller can go on and find the next problem. Unknown keys are reported
with the closest known one. The fault plan and the scenario loader both read through it,
so their messages look alike:

    faults[2].rate: expected a number in 0..1, got 1.5
    load.duration: expected a duration like '30s', '500ms', '2m' or '1h30m', got '30 sec'
    faults[0].params.stauts: unknown key (did you mean 'status'?)
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_HINT: Final = "a duration like '30s', '500ms', '2m' or '1h30m'"


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem: the dotted key (with list indexes, e.g. `faults[2].rate`) and what was wrong."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" if self.key else self.message


def join_key(prefix: str, name: str | int) -> str:
    """`faults` + 2 -> `faults[2]`; `faults[2]` + `rate` -> `faults[2].rate`."""
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    if not name:
        return prefix
    return f"{prefix}.{name}" if prefix else name


def describe(value: object) -> str:
    """A short, readable rendering of a bad value for a message."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the known name closest to a mistyped one, else ""."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_number(value: object) -> bool:
    """int or float, but not bool (TOML `true` is not a number here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_duration(value: object) -> float:
    """Seconds from a duration: a number of seconds, or a string like `1h30m`, `2m`, `45s`, `250ms`.

    Raises ValueError naming what is accepted. Negative, NaN and infinite values are refused.
    """
    if is_number(value):
        seconds = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds, seen = 0, 0.0, False
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None:
                raise ValueError(f"expected {DURATION_HINT}, got {describe(value)}")
            seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos, seen = m.end(), True
        if not seen:
            raise ValueError(f"expected {DURATION_HINT}, got {describe(value)}")
    else:
        raise ValueError(f"expected {DURATION_HINT}, got {describe(value)}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite duration >= 0, got {describe(value)}")
    return seconds


def unknown_keys(raw: Mapping[str, object], known: Collection[str], prefix: str) -> list[Issue]:
    """One issue per key of `raw` not in `known`, suggesting the closest known key."""
    out = []
    for key in raw:
        if key in known:
            continue
        hint = did_you_mean(str(key), known) or f" (known: {', '.join(sorted(known))})"
        out.append(Issue(join_key(prefix, str(key)), "unknown key" + hint))
    return out


class Fields:
    """Reads keys of one table, recording issues into a shared list.

    Every read returns a usable value (the default when the key is missing or wrong), so a
    caller validates the whole document in one pass. `done()` reports unknown keys.
    """

    __slots__ = ("_issues", "_known", "prefix", "raw")

    def __init__(self, raw: object, prefix: str, issues: list[Issue]) -> None:
        self.prefix = prefix
        self._issues = issues
        self._known: set[str] = set()
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            issues.append(Issue(prefix, f"expected a table, got {describe(raw)}"))
            raw = {}
        self.raw: Mapping[str, object] = raw

    def key(self, name: str | int) -> str:
        return join_key(self.prefix, name)

    def problem(self, name: str | int, message: str) -> None:
        self._issues.append(Issue(self.key(name), message))

    def has(self, name: str) -> bool:
        self._known.add(name)
        return name in self.raw

    def get(self, name: str) -> object:
        self._known.add(name)
        return self.raw.get(name)

    def done(self, *extra_known: str) -> None:
        self._issues.extend(unknown_keys(self.raw, self._known | set(extra_known), self.prefix))

    # ------------------------------------------------------------------ typed reads

    def number(
        self,
        name: str,
        default: float,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        what: str | None = None,
    ) -> float:
        value = self.get(name)
        if value is None:
            return default
        expected = what or _range_text("a number", lo, hi, lo_open)
        if not is_number(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
            self.problem(name, f"expected {expected}, got {describe(value)}")
            return default
        v = float(value)  # type: ignore[arg-type]
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
            self.problem(name, f"expected {expected}, got {describe(value)}")
            return default
        return v

    def integer(self, name: str, default: int, *, lo: int | None = None, hi: int | None = None) -> int:
        value = self.get(name)
        if value is None:
            return default
        expected = _range_text("an integer", lo, hi, False)
        if not isinstance(value, int) or isinstance(value, bool):
            self.problem(name, f"expected {expected}, got {describe(value)}")
            return default
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.problem(name, f"expected {expected}, got {describe(value)}")
            return default
        return value

    def optional_integer(self, name: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
        if self.get(name) is None:
            return None
        sentinel = -(1 << 62)
        v = self.integer(name, sentinel, lo=lo, hi=hi)
        return None if v == sentinel else v

    def rate(self, name: str, default: float) -> float:
        return self.number(name, default, lo=0.0, hi=1.0, what="a number in 0..1")

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.problem(name, f"expected true or false, got {describe(value)}")
            return default
        return value

    def string(
        self, name: str, default: str, *, pattern: re.Pattern[str] | None = None, what: str = ""
    ) -> str:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
            self.problem(name, f"expected {what or 'a string'}, got {describe(value)}")
            return default
        return value

    def choice(self, name: str, default: str, choices: Iterable[str]) -> str:
        options = list(choices)
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or value not in options:
            self.problem(name, f"expected one of {', '.join(map(repr, options))}, got {describe(value)}")
            return default
        return value

    def duration(self, name: str, default: float, *, positive: bool = False) -> float:
        v = self.optional_duration(name, positive=positive)
        return default if v is None else v

    def optional_duration(self, name: str, *, positive: bool = False) -> float | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except ValueError as e:
            self.problem(name, str(e))
            return None
        if positive and seconds <= 0:
            self.problem(name, f"expected a duration > 0, got {describe(value)}")
            return None
        return seconds

    def string_list(
        self,
        name: str,
        *,
        choices: Collection[str] | None = None,
        pattern: re.Pattern[str] | None = None,
        what: str = "a string",
    ) -> tuple[str, ...] | None:
        """A non-empty list of strings (None when absent); each item checked on its own."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not value:
            self.problem(name, f"expected a non-empty list, each item {what}, got {describe(value)}")
            return None
        out: list[str] = []
        for i, item in enumerate(value):
            key = join_key(self.key(name), i)
            if not isinstance(item, str):
                self._issues.append(Issue(key, f"expected {what}, got {describe(item)}"))
            elif choices is not None and item not in choices:
                self._issues.append(
                    Issue(key, f"expected one of {', '.join(map(repr, choices))}, got {describe(item)}")
                )
            elif pattern is not None and not pattern.fullmatch(item):
                self._issues.append(Issue(key, f"expected {what}, got {describe(item)}"))
            else:
                out.append(item)
        return tuple(out)

    def table(self, name: str) -> Fields:
        """A nested table (an empty one when absent)."""
        return Fields(self.get(name), self.key(name), self._issues)

    def tables(self, name: str) -> list[Fields]:
        """A list of tables (`[[name]]` in TOML); an empty list when absent."""
        value = self.get(name)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            self.problem(name, f"expected a list of tables, got {describe(value)}")
            return []
        return [Fields(item, join_key(self.key(name), i), self._issues) for i, item in enumerate(value)]


def _range_text(noun: str, lo: float | None, hi: float | None, lo_open: bool) -> str:
    def fmt(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    if lo is not None and hi is not None:
        return f"{noun} in {fmt(lo)}..{fmt(hi)}"
    if lo is not None:
        return f"{noun} {'>' if lo_open else '>='} {fmt(lo)}"
    if hi is not None:
        return f"{noun} <= {fmt(hi)}"
    return noun
