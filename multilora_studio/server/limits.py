"""Admission control: a server-wide in-flight bound and per-key concurrency and token budgets.

A key refused with 429 is told when to retry (``Retry-After``). A request of that key that
comes sooner is refused too, but its answer is held until that time (at most
``MAX_HELD_REFUSALS`` at once per key, each at most ``MAX_HOLD_S``): a client that ignores
``Retry-After`` then waits as if it had obeyed, instead of taking the server's event loop, and
the CPU the engine shares with it, from the other tenants.

The token budget counts what usage reports (prompt + completion tokens) over a sliding
minute. A request reserves its worst case before it runs (its caps at admission, its prompt
once tokenized) and is charged what it used when it ends; the rest is refunded. So requests
in flight together can never spend more than the budget. All methods run on the server's
event loop thread; none of them waits but ``hold_refusal``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from multilora_studio.server.errors import ApiError

WINDOW_S = 60.0
MAX_HELD_REFUSALS = 32  # refusals of one key held at once; more are answered at once
MAX_HOLD_S = 2.0  # the longest a refusal is held


@dataclass
class _KeyUsage:
    active: int = 0
    reserved: int = 0  # tokens held by this key's requests in flight
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens), oldest first
    spent_total: int = 0
    retry_at: float = 0.0  # when its last 429 told it to retry (monotonic seconds)
    held: int = 0  # its refusals being held now

    def expire(self, now: float) -> None:
        while self.spent and now - self.spent[0][0] >= WINDOW_S:
            self.spent_total -= self.spent.popleft()[1]


@contextmanager
def _told_when_to_retry(usage: _KeyUsage) -> Iterator[None]:
    """Note the retry time of a 429 raised inside; one that comes before the key's previous retry
    time gets that wait as its ``hold_s`` (unless ``MAX_HELD_REFUSALS`` are held already)."""
    try:
        yield
    except ApiError as error:
        retry_after = error.headers.get("Retry-After")
        if error.status == 429 and retry_after is not None:
            now = time.monotonic()
            if usage.retry_at > now and usage.held < MAX_HELD_REFUSALS:
                error.hold_s = min(MAX_HOLD_S, usage.retry_at - now)
            usage.retry_at = max(usage.retry_at, now + float(retry_after))
        raise


class Admission:
    """Grants or refuses work at once: 503 when the server is full, 429 when a key is over its
    limits; says how long a refusal of a key that did not wait as told is held."""

    def __init__(
        self, max_in_flight: int, max_concurrent_per_key: int | None, tokens_per_minute_per_key: int | None
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_concurrent = max_concurrent_per_key
        self.tokens_per_minute = tokens_per_minute_per_key
        self.in_flight = 0
        self._keys: dict[str, _KeyUsage] = {}

    def acquire(self, key: str, sequences: int, tokens: int = 0, param: str | None = None) -> int:
        """Reserve ``sequences`` engine requests and ``tokens`` of the budget for ``key`` (``param``:
        the field that asked for them), or raise ApiError (429/503). Returns the tokens reserved
        (0 without a budget)."""
        usage = self._keys.setdefault(key, _KeyUsage())
        with _told_when_to_retry(usage):
            self._check_concurrency(usage)
            self._check_budget(usage, 0, tokens, param)
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
        return self._hold(usage, tokens)

    def check_room(self, key: str) -> None:
        """429 at once when ``key`` already holds its concurrent requests: a generation route asks
        before it resolves the model, leases the engine or tokenizes anything, so a client that
        floods past its limit costs the server as little as possible (``acquire`` decides again)."""
        usage = self._keys.setdefault(key, _KeyUsage())
        with _told_when_to_retry(usage):
            self._check_concurrency(usage)

    async def hold_refusal(self, key: str, error: ApiError) -> None:
        """Wait ``error.hold_s`` before ``key``'s refusal is answered (counted in ``held``)."""
        if error.hold_s <= 0:
            return
        usage = self._keys.setdefault(key, _KeyUsage())
        usage.held += 1
        try:
            await asyncio.sleep(error.hold_s)
        finally:
            usage.held -= 1

    def held(self, key: str) -> int:
        """Refusals of ``key`` being held now."""
        usage = self._keys.get(key)
        return usage.held if usage is not None else 0

    def reserve(self, key: str, held: int, tokens: int, param: str | None) -> int:
        """Reserve ``tokens`` more for an admitted request that holds ``held``; returns the tokens
        reserved (0 without a budget), or raises ApiError (429)."""
        usage = self._keys[key]
        with _told_when_to_retry(usage):
            self._check_budget(usage, held, tokens, param)
        return self._hold(usage, tokens)

    def room(self, key: str) -> int | None:
        """Tokens ``key`` may still reserve now; None without a budget."""
        if self.tokens_per_minute is None:
            return None
        usage = self._keys.setdefault(key, _KeyUsage())
        usage.expire(time.monotonic())
        return max(0, self.tokens_per_minute - usage.spent_total - usage.reserved)

    def release(self, key: str, sequences: int, reserved: int, tokens: int) -> None:
        """Return the reservation and charge ``tokens`` (prompt + completion) to ``key``."""
        self.in_flight -= sequences
        usage = self._keys[key]
        usage.active -= 1
        usage.reserved -= reserved
        if self.tokens_per_minute is not None and tokens > 0:
            usage.spent.append((time.monotonic(), tokens))
            usage.spent_total += tokens

    def _check_concurrency(self, usage: _KeyUsage) -> None:
        if self.max_concurrent is not None and usage.active >= self.max_concurrent:
            raise ApiError(
                429,
                f"too many concurrent requests for this API key (limit {self.max_concurrent})",
                "concurrency_limit_exceeded",
                headers={"Retry-After": "1"},
            )

    def _hold(self, usage: _KeyUsage, tokens: int) -> int:
        if self.tokens_per_minute is None:
            return 0
        usage.reserved += tokens
        return tokens

    def _check_budget(self, usage: _KeyUsage, held: int, tokens: int, param: str | None) -> None:
        """429 unless ``tokens`` more fit the key's budget next to what is spent and reserved."""
        limit = self.tokens_per_minute
        if limit is None:
            return
        if held + tokens > limit:  # never fits, however long the client waits
            raise ApiError(
                429,
                f"request too large: it needs up to {held + tokens} tokens (prompt + max tokens of every "
                f"choice) but this API key's budget is {limit} tokens per minute; "
                f"lower {param or 'the prompt or max_tokens'}",
                "request_too_large",
                param,
            )
        now = time.monotonic()
        usage.expire(now)
        used = usage.spent_total + usage.reserved
        if used + tokens > limit or (tokens == 0 and used >= limit):
            wait = self._seconds_until_room(usage, used + max(tokens, 1) - limit, now)
            raise ApiError(
                429,
                f"token budget of this API key is used up ({limit} tokens per minute; {used} spent or "
                f"reserved by requests in flight, this request needs up to {tokens}); retry in {wait} s",
                "rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
            )

    @staticmethod
    def _seconds_until_room(usage: _KeyUsage, excess: int, now: float) -> int:
        """When enough spent tokens leave the window; 1 s when only requests in flight can free it."""
        for stamp, tokens in usage.spent:
            excess -= tokens
            if excess <= 0:
                return max(1, math.ceil(stamp + WINDOW_S - now))
        return 1
