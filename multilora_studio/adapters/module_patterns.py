"""PEFT's ``rank_pattern`` / ``alpha_pattern`` keys, matched in bounded time.

A key is a regex that must match a dotted suffix of the module's name, as PEFT does with
``re.match(rf"(.*\\.)?({key})$", name)``. Keys come from untrusted files, so each match has a
timeout and every adapter a total budget; a key Python's ``re`` cannot compile is skipped,
as PEFT's lookup would never match it.
"""

from __future__ import annotations

import re
import time

import regex

MAX_KEY_CHARS = 256
MATCH_TIMEOUT_S = 0.25
ADAPTER_BUDGET_S = 2.0


class PatternTimeout(ValueError):
    """A pattern key that took too long to match."""


class PatternMatcher:
    """The keys of one pattern dict, compiled once; every match draws on one time budget."""

    def __init__(self, name: str, pattern: dict, budget: list[float]) -> None:
        self.name = name
        self.budget = budget  # [seconds left], shared by the adapter's matchers
        self.keys = []
        for key, value in pattern.items():
            try:
                re.compile(key)
            except re.error:
                continue
            self.keys.append((key, regex.compile(rf"(.*\.)?({key})$"), value))

    def value(self, full_name: str, default: float) -> float:
        """The value of the first key matching ``full_name``, else ``default``."""
        for key, compiled, value in self.keys:
            start = time.perf_counter()
            try:
                found = compiled.match(full_name, timeout=max(min(MATCH_TIMEOUT_S, self.budget[0]), 1e-3))
            except TimeoutError:
                found, self.budget[0] = None, 0.0
            else:
                self.budget[0] -= time.perf_counter() - start
            if self.budget[0] <= 0:
                raise PatternTimeout(f"{self.name} key {key!r} took too long to match; simplify it")
            if found:
                return value
        return default
