"""When to reconnect: server advice, backoff with jitter, and a shared reconnect budget
(the policy; `_reconnector` applies it to every kind of reconnect).

Times are Unix epoch seconds passed in by the caller (the lab merges ledgers of many
processes, so every part uses one clock); nothing here reads a clock.

- `retry` (SSE, milliseconds) and `Retry-After` (HTTP, seconds or an HTTP date) are the
  server's advice: the client never reconnects earlier than advised.
- Without advice, the delay is exponential backoff with jitter, so clients that lost
  their connections together do not come back together.
- `ReconnectBudget` caps reconnect attempts of every stream of a process. Its rate can
  be changed from outside at any time (a distributed run splits one global budget
  across workers). It is a token bucket *and* a cap per calendar second, because the
  gate counts attempts in 1-second bins of the shared clock: the cap makes "never above
  the budget" hold by construction, the bucket spreads attempts within the second.
"""

from __future__ import annotations

import calendar
import math
import re
from dataclasses import dataclass
from typing import Protocol

from lab.wire.errors import LocalProtocolError

_MONTHS = {
    m: i
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
_IMF = re.compile(r"[A-Za-z]{3}, (\d{2}) ([A-Za-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT")
_RFC850 = re.compile(r"[A-Za-z]+, (\d{2})-([A-Za-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT")
_ASCTIME = re.compile(r"[A-Za-z]{3} ([A-Za-z]{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})")


def parse_http_date(value: str) -> float | None:
    """An HTTP date (IMF-fixdate, RFC 850 or asctime, RFC 9110 5.6.7) as epoch seconds.

    Written out rather than taken from `email.utils`, which pulls in `socket`: the core
    imports nothing that does I/O.
    """
    if m := _IMF.fullmatch(value):
        day, mon, year, hh, mm, ss = m.groups()
    elif m := _RFC850.fullmatch(value):
        day, mon, yy, hh, mm, ss = m.groups()
        year = str(1900 + int(yy) if int(yy) >= 70 else 2000 + int(yy))
    elif m := _ASCTIME.fullmatch(value):
        mon, day, hh, mm, ss, year = m.groups()
    else:
        return None
    month = _MONTHS.get(mon.lower())
    y, d, h, mi, se = int(year), int(day), int(hh), int(mm), int(ss)
    if month is None or not (1 <= d <= calendar.monthrange(y, month)[1] and h < 24 and mi < 60 and se < 61):
        return None
    return float(calendar.timegm((y, month, d, h, mi, se, 0, 0, 0)))


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from `now` according to a `Retry-After` value, or None if absent/invalid.

    Accepts delta-seconds (`120`) or an HTTP date; a date in the past means 0.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    when = parse_http_date(value)
    return None if when is None else max(0.0, when - now)


class RandomSource(Protocol):
    """Where jitter comes from: a `random.Random`, or anything drawing the same way (the
    Locust worker makes each client's seeded generator on its first draw: ~2.5 KiB that an
    idle client never needs)."""

    def random(self) -> float: ...


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Exponential backoff with "equal jitter": half fixed, half random.

    attempt 0 waits between base/2 and base, attempt n between d/2 and d with
    d = min(cap, base * multiplier**n). Equal jitter keeps a floor, so a storm of failures
    cannot collapse to zero delay; the random half de-synchronises clients.
    """

    base: float = 0.25
    cap: float = 30.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base and self.multiplier >= 1):
            raise LocalProtocolError(f"bad backoff policy {self}")

    def delay(self, attempt: int, rng: RandomSource) -> float:
        d = min(self.cap, self.base * self.multiplier ** min(attempt, 64))
        return d / 2 + rng.random() * d / 2


@dataclass(frozen=True, slots=True)
class ReconnectPlan:
    """The decision for one reconnect: not before `at`, and why."""

    at: float
    backoff_delay: float
    advised_delay: float | None
    """What the server advised (retry or Retry-After), in seconds; None if it said nothing."""

    @property
    def delay(self) -> float:
        return max(self.backoff_delay, self.advised_delay or 0.0)


def plan_reconnect(
    now: float,
    attempt: int,
    policy: BackoffPolicy,
    rng: RandomSource,
    *,
    retry_ms: int | None = None,
    retry_after: float | None = None,
) -> ReconnectPlan:
    """Plan attempt number `attempt` (0 = first after a loss).

    Server advice is a floor, never shortened. A `retry` on a cooperative close (polling)
    replaces backoff on the first attempt, since nothing failed.
    """
    advised = None
    if retry_ms is not None:
        advised = retry_ms / 1000.0
    if retry_after is not None:
        advised = max(advised or 0.0, retry_after)
    backoff = 0.0 if (advised is not None and attempt == 0) else policy.delay(attempt, rng)
    return ReconnectPlan(at=now + max(backoff, advised or 0.0), backoff_delay=backoff, advised_delay=advised)


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    rate: float
    burst: float
    bin_cap: int
    granted: int
    denied: int


class ReconnectBudget:
    """Token bucket (rate/s, burst) plus a cap of attempts per calendar second.

    `rate=math.inf` means unlimited. The per-second cap is max(1, floor(rate)): a budget
    of 2.5/s allows at most 2 attempts in any 1-second bin (and 1 per bin below 1/s).
    """

    def __init__(self, rate: float, *, burst: float = 1.0, now: float = 0.0) -> None:
        self._check(rate, burst)
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._stamp = now
        self._bin = math.floor(now)
        self._bin_count = 0
        self._granted = 0
        self._denied = 0

    @staticmethod
    def _check(rate: float, burst: float) -> None:
        if not rate >= 0 or not burst >= 1:
            raise LocalProtocolError(f"reconnect budget needs rate >= 0 and burst >= 1, got {rate}, {burst}")

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def bin_cap(self) -> int:
        if math.isinf(self._rate):
            return 1 << 62
        return max(1, math.floor(self._rate))

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            if math.isinf(self._rate):
                self._tokens = self._burst
            else:
                self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
        b = math.floor(now)
        if b != self._bin:
            self._bin = b
            self._bin_count = 0

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate from now on (tokens earned so far at the old rate are kept)."""
        self._check(rate, self._burst)
        self._refill(now)
        self._rate = rate

    def try_acquire(self, now: float) -> bool:
        """Take one reconnect token at `now`, or say no (and count the denial)."""
        self._refill(now)
        if math.isinf(self._rate):
            self._granted += 1
            return True
        if self._tokens >= 1.0 and self._bin_count < self.bin_cap:
            self._tokens -= 1.0
            self._bin_count += 1
            self._granted += 1
            return True
        self._denied += 1
        return False

    def next_available(self, now: float) -> float:
        """The earliest time at which `try_acquire` can succeed (inf if the rate is 0 and empty)."""
        self._refill(now)
        t = now
        if math.isinf(self._rate):
            return t
        if self._tokens < 1.0:
            if self._rate == 0:
                return math.inf
            t = now + (1.0 - self._tokens) / self._rate
        if math.floor(t) == self._bin and self._bin_count >= self.bin_cap:
            t = float(self._bin + 1)
        return t

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(self._rate, self._burst, self.bin_cap, self._granted, self._denied)
