"""Structured output: a request's ``StructuredOutput`` compiled into an llguidance grammar, its
matcher advanced token by token, and the token masks it allows applied to the logits."""

from multilora_studio.engine.sampling.grammar.compile import (
    as_lark,
    check_structured,
    grammar_text,
    lark_json,
)
from multilora_studio.engine.sampling.grammar.masks import DeviceMasks, TokenMasks, apply_token_masks
from multilora_studio.engine.sampling.grammar.matchers import GrammarCompiler, advance

__all__ = [
    "DeviceMasks",
    "GrammarCompiler",
    "TokenMasks",
    "advance",
    "apply_token_masks",
    "as_lark",
    "check_structured",
    "grammar_text",
    "lark_json",
]
