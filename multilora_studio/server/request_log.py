"""A bounded in-memory log of served requests, with callbacks for live views (the GUI)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestRecord:
    """One generation request as the server answered it."""

    time: float  # wall clock (time.time()) when it arrived
    request_id: str
    route: str  # "completions" or "chat"
    model: str  # the ``model`` field as sent
    adapter: str | None  # None: the base model
    api_key: str  # a label ("key-1", "anonymous"), never the key itself
    status: int  # HTTP status; 499 when the client went away first
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    ttft_s: float | None
    error: str | None = None
    engine_seconds: float = 0.0  # its share of the engine's busy time (RequestOutput.engine_seconds)
    adapter_tier: str | None = None  # where its adapter was when it arrived (the coldest of its choices)
    queue_s: float | None = None  # arrival at the engine to its first step (the longest of its choices)
    cached_tokens: int = 0  # of prompt_tokens, those whose KV came from the prefix cache


Subscriber = Callable[[RequestRecord], None]


class RequestLog:
    """The last ``maxlen`` records; subscribers are called on the server thread for each new one."""

    def __init__(self, maxlen: int = 1000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(record)
            except Exception:
                log.exception("request log subscriber failed")

    def records(self) -> list[RequestRecord]:
        """Oldest first."""
        with self._lock:
            return list(self._records)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` for every new record (keep it quick); returns the unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe
