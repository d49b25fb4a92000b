"""The engine's errors as types, so that each face (HTTP, command line, window) decides from the
class and its fields, never from the wording. Each subclasses the built-in its callers caught
before (ValueError for what the caller sent, RuntimeError for what happened while running).
A refused setting is ``InvalidSetting`` (``multilora_studio/invalid_setting.py``, below the
engine: the adapters refuse a rank above ``max_lora_rank`` too).
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the engine refuses before it runs: ``field`` names what of it is wrong, a
    ``SamplingParams`` field (``stop_token_ids``, ``logit_bias``, ``bad_words_token_ids``,
    ``adapter_scale``, ``structured``) or ``prompt``."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class UnknownAdapter(InvalidRequest):
    """A request for an adapter the engine was never given (or was removed from it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "adapter")


class GrammarFailure(RuntimeError):
    """A request's output constraint refused a token it had allowed: that request ends with an
    error, the engine and the other requests go on. The request's own doing, not the engine's."""


class EngineStopped(RuntimeError):
    """A call to an engine that was shut down (its requests ended with reason 'abort')."""
