"""The server's request-rate limiter (`--max-rps`): a token bucket, nothing more.

It is the server's own, not the client's reconnect budget: the two answer different
questions (how fast may this server be asked vs how fast may a client fleet come back)
and change for different reasons.
"""

from __future__ import annotations

import math


class RequestRateLimiter:
    """`rate` requests per second on average, at most `burst` at once; `rate=inf` is off."""

    __slots__ = ("_burst", "_rate", "_stamp", "_tokens")

    def __init__(self, rate: float, *, burst: float, now: float) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"rate limiter needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._stamp = now

    def try_acquire(self, now: float) -> bool:
        """Admit one request at `now`, or say no."""
        if math.isinf(self._rate):
            return True
        if now > self._stamp:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
