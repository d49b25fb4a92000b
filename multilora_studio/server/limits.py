"""Admission control: a server-wide in-flight bound and per-key concurrency and token budgets.

All methods run on the server's event loop thread; none of them waits.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from multilora_studio.server.errors import ApiError

WINDOW_S = 60.0


@dataclass
class _KeyUsage:
    active: int = 0
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens), oldest first
    spent_total: int = 0

    def expire(self, now: float) -> None:
        while self.spent and now - self.spent[0][0] >= WINDOW_S:
            self.spent_total -= self.spent.popleft()[1]


class Admission:
    """Grants or refuses work at once: 503 when the server is full, 429 when a key is over its limits."""

    def __init__(
        self, max_in_flight: int, max_concurrent_per_key: int | None, tokens_per_minute_per_key: int | None
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_concurrent = max_concurrent_per_key
        self.tokens_per_minute = tokens_per_minute_per_key
        self.in_flight = 0
        self._keys: dict[str, _KeyUsage] = {}

    def acquire(self, key: str, sequences: int) -> None:
        """Reserve ``sequences`` engine requests for ``key``, or raise ApiError (429/503)."""
        usage = self._keys.setdefault(key, _KeyUsage())
        if self.max_concurrent is not None and usage.active >= self.max_concurrent:
            raise ApiError(
                429,
                f"too many concurrent requests for this API key (limit {self.max_concurrent})",
                "concurrency_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        if self.tokens_per_minute is not None:
            now = time.monotonic()
            usage.expire(now)
            if usage.spent_total >= self.tokens_per_minute:
                wait = self._seconds_until_under_budget(usage, now)
                raise ApiError(
                    429,
                    f"token budget of this API key is used up ({self.tokens_per_minute} tokens per "
                    f"minute); retry in {wait} s",
                    "rate_limit_exceeded",
                    headers={"Retry-After": str(wait)},
                )
        if self.in_flight + sequences > self.max_in_flight:
            raise ApiError(
                503,
                f"the server is busy ({self.in_flight} requests in flight, limit {self.max_in_flight}); "
                "retry shortly",
                "server_overloaded",
                headers={"Retry-After": "1"},
            )
        self.in_flight += sequences
        usage.active += 1

    def release(self, key: str, sequences: int, tokens: int) -> None:
        """Return the reservation and charge ``tokens`` (prompt + completion) to ``key``."""
        self.in_flight -= sequences
        usage = self._keys[key]
        usage.active -= 1
        if self.tokens_per_minute is not None and tokens > 0:
            usage.spent.append((time.monotonic(), tokens))
            usage.spent_total += tokens

    def _seconds_until_under_budget(self, usage: _KeyUsage, now: float) -> int:
        assert self.tokens_per_minute is not None
        excess = usage.spent_total - self.tokens_per_minute
        for stamp, tokens in usage.spent:
            excess -= tokens
            if excess < 0:
                return max(1, math.ceil(stamp + WINDOW_S - now))
        return 1
