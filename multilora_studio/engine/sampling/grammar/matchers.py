"""Grammars compiled for the engine's tokenizer (cached), a matcher per request, and its advance."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import llguidance
import llguidance.hf

from multilora_studio.engine.errors import GrammarFailure
from multilora_studio.engine.sampling.grammar.byte_cache import ByteBoundedCache
from multilora_studio.engine.sampling.grammar.compile import grammar_text, invalid
from multilora_studio.engine.sampling.structured import StructuredOutput

# Compiled grammars are kept up to GRAMMAR_CACHE_BYTES by an estimate of their memory: llguidance's
# matchers (lexer and parser tables) were measured at 25-100 bytes per byte of grammar text (a
# 180 KB JSON schema: 15 MB), so each counts GRAMMAR_BYTES_PER_TEXT_BYTE per byte plus MATCHER_BYTES.
GRAMMAR_CACHE_BYTES = 256 << 20
GRAMMAR_BYTES_PER_TEXT_BYTE = 128
MATCHER_BYTES = 64 << 10
# How a request whose grammar refused its own next token ends (the server answers it with a 400)
GRAMMAR_FAILED = "structured output failed"  # how a GrammarFailure begins
# Errors without the parser state dump: they reach API clients.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarCompiler:
    """Compiles ``StructuredOutput`` specs for one tokenizer; thread-safe.

    The llguidance tokenizer is built on first use (about a second for a 128k vocabulary), so
    an engine that never sees a structured request never pays for it. Compiled grammars stay
    in an LRU cache keyed by the spec, bounded by ``max_bytes`` (estimated: ``grammar_bytes``):
    each request's matcher is a copy of the cached, never-advanced one (a copy costs
    microseconds; compiling a schema costs milliseconds).
    """

    def __init__(
        self, tokenizer: object | None, eos_token_ids: Sequence[int], max_bytes: int = GRAMMAR_CACHE_BYTES
    ) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self.cache: ByteBoundedCache[StructuredOutput, llguidance.LLMatcher] = ByteBoundedCache(max_bytes)
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled (cache misses), for tests and diagnosis

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance view of the model's tokenizer (built on first use)."""
        with self._lock:
            return self._llg_tokenizer()

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            if self._hf_tokenizer is None:
                raise ValueError("structured output needs the model's tokenizer, and this model has none")
            try:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer,  # type: ignore[arg-type]
                    eos_token=self._eos or None,
                )
            except ValueError as error:
                raise ValueError(f"structured output cannot use this model's tokenizer: {error}") from None
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Tokens the grammar masks cover (the tokenizer's vocabulary)."""
        return self.tokenizer.vocab_size

    def compile(self, spec: StructuredOutput) -> None:
        """Compile ``spec`` into the cache; ValueError (naming what is wrong) if it is invalid."""
        with self._lock:
            self._template(spec)

    def matcher(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher of ``spec`` for one request (compiled now if it left the cache)."""
        with self._lock:
            return self._template(spec).deep_copy()

    def _template(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        cached = self.cache.get(spec)
        if cached is not None:
            return cached
        tokenizer = self._llg_tokenizer()
        try:
            grammar = grammar_text(spec)
        except ValueError as error:
            raise invalid(spec, str(error)) from None
        for text in spec.choice or ():
            written = tokenizer.decode_bytes(tokenizer.tokenize_bytes(text.encode()))
            if written != text.encode():
                raise invalid(spec, f"{text!r} has characters that no token of this model's tokenizer writes")
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, tokenizer, limits=LIMITS
        )
        if is_error:
            raise invalid(spec, messages[0])
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=LIMITS)
        if matcher.is_error():
            raise invalid(spec, matcher.get_error())
        self.compiles += 1
        self.cache.put(spec, matcher, grammar_bytes(grammar))
        return matcher


def grammar_bytes(grammar: str) -> int:
    """The memory a compiled ``grammar`` is counted at in the cache (an estimate; see the top)."""
    return GRAMMAR_BYTES_PER_TEXT_BYTE * len(grammar) + MATCHER_BYTES


def advance(matcher: llguidance.LLMatcher, token: int) -> bool:
    """Feed the sampled ``token`` to ``matcher``: True once the grammar is complete (the request
    stops), False while it goes on; GrammarFailure if the matcher refused it."""
    if not matcher.consume_token(token):
        raise GrammarFailure(f"{GRAMMAR_FAILED}: {matcher.get_error() or 'the token was refused'}")
    return matcher.is_stopped()
