"""How one request samples (``SamplingParams``), validated on construction, and the limits a
request's values are checked against."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from multilora_studio.engine.sampling.structured import StructuredOutput
from multilora_studio.engine.settings import check_int, check_number
from multilora_studio.invalid_setting import InvalidSetting

MAX_SEED = 2**63 - 1  # torch.Generator seeds are signed 64-bit
MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's and vLLM's limit)
GREEDY_BELOW = 1e-5
# Largest adapter strength a request may ask for (SamplingParams.adapter_scale): 16x an
# adapter's own scale is far past any useful extrapolation and still far from float overflow.
MAX_ADAPTER_SCALE = 16.0
MAX_PENALTY = 2.0  # presence_penalty / frequency_penalty range is [-2, 2] (OpenAI's)
MAX_REPETITION_PENALTY = 100.0  # past this a seen token's logit is as good as removed
MAX_LOGIT_BIAS = 100.0  # logit_bias values range over [-100, 100] (OpenAI's)
MAX_LOGIT_BIAS_TOKENS = 300  # logit_bias entries per request (OpenAI's limit)
# bad_words_token_ids per request: sequences and their tokens in all (vLLM's limits are 128 words,
# 1024 tokens; a word gives up to two sequences, with and without a leading space)
MAX_BAD_WORDS = 256
MAX_BAD_WORDS_TOKENS = 1024
MAX_CACHE_SALT = 256  # characters of a cache_salt (a tenant's or user's id)


def _as_tuple(name: str, value: object, item: str) -> tuple:
    """A user's list (or None for none) as a tuple; InvalidSetting for anything that is not a list."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSetting.of(name, value, f"must be a list of {item}, got {{value!r}}")
    return tuple(value)


@dataclass
class SamplingParams:
    """How one request samples. ``temperature=0`` is greedy."""

    # 0: only the prompt runs (and is scored, with ``prompt_logprobs``); the request ends with
    # reason "length" and no token, as OpenAI's legacy ``echo`` with ``max_tokens=0``.
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    # Log-probabilities of the model's distribution (raw logits: before temperature, top-k/top-p
    # and every other sampling filter, as OpenAI reports them). None: none (costs nothing);
    # 0: each generated token's own; k: also the k most likely tokens at each step.
    logprobs: int | None = None
    # The same for every prompt token given the ones before it (vLLM's ``prompt_logprobs``).
    prompt_logprobs: int | None = None
    # The first prompt token ``prompt_logprobs`` scores (the entries before it are None): a
    # continuation's score needs only its own tokens', and the prefix cache may then serve the
    # tokens before it. 0: every token is scored, and the prompt is computed whole.
    prompt_logprobs_start: int = 0
    # Requests with different salts never share prefix-cache blocks (vLLM's ``cache_salt``): a
    # client that must not learn from timing what prompts others sent sets its own.
    cache_salt: str | None = None
    # Adapter strength: the request's LoRA term is multiplied by it (on top of the adapter's own
    # alpha / r); 0 gives the base model's output through the adapter's slot, 1 the adapter as
    # trained. Needs an adapter (a base request with another value is refused at submit).
    adapter_scale: float = 1.0
    # What the output must match (a JSON schema, a regex, a grammar ...); None: free text.
    structured: StructuredOutput | None = None
    # Logits processors (engine/sampling/logits_processors.py; docs/dev/engine.md, "Sampling order"), all
    # off by default. OpenAI's penalties over the tokens generated so far: logit -= presence *
    # (count > 0) + frequency * count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's / HF's: a token seen in the prompt or the output has its logit divided by it when
    # positive, multiplied when not; 1.0 = off.
    repetition_penalty: float = 1.0
    # Tokens whose probability (after temperature) is below min_p x the largest are dropped.
    min_p: float = 0.0
    # token id -> bias added to its logit (ids checked against the vocabulary at submit).
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    # EOS (unless ignore_eos) and stop_token_ids are banned, and stop strings do not end the
    # request, until this many tokens are generated.
    min_tokens: int = 0
    # Banned token sequences: a sequence's last token is banned when the output ends with the
    # tokens before it (a one-token sequence is always banned), as vLLM's bad_words.
    bad_words_token_ids: Sequence[Sequence[int]] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, 0)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        check_int("prompt_logprobs_start", self.prompt_logprobs_start, 0)
        salt = self.cache_salt
        if salt is not None and (not isinstance(salt, str) or len(salt) > MAX_CACHE_SALT):
            limit = f"must be a string of at most {MAX_CACHE_SALT} characters"
            raise InvalidSetting.of("cache_salt", salt, limit)
        check_number("temperature", self.temperature, 0, 100, low_inclusive=True)
        check_number("top_p", self.top_p, 0, 1, low_inclusive=False)
        check_int("top_k", self.top_k, 0)
        if self.seed is not None:
            check_int("seed", self.seed, 0, MAX_SEED)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = _as_tuple("stop", self.stop, "non-empty strings")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidSetting.of(
                "stop", list(self.stop), "must be a list of non-empty strings, got {value!r}"
            )
        self.stop_token_ids = _as_tuple("stop_token_ids", self.stop_token_ids, "token ids")
        for token in self.stop_token_ids:
            check_int("stop_token_ids", token, 0, part="entry")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSetting.of("ignore_eos", self.ignore_eos, "must be True or False, got {value!r}")
        check_number("adapter_scale", self.adapter_scale, 0, MAX_ADAPTER_SCALE, low_inclusive=True)
        self.adapter_scale = float(self.adapter_scale)
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise InvalidSetting.of(
                "structured", self.structured, "must be a StructuredOutput, got {value!r}"
            )
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            check_number(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY, low_inclusive=True)
            setattr(self, name, float(getattr(self, name)))
        check_number("repetition_penalty", self.repetition_penalty, 0, MAX_REPETITION_PENALTY, False)
        self.repetition_penalty = float(self.repetition_penalty)
        check_number("min_p", self.min_p, 0, 1, low_inclusive=True)
        self.min_p = float(self.min_p)
        if self.logit_bias is None:
            self.logit_bias = {}
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidSetting.of(
                "logit_bias", self.logit_bias, "must be a mapping of token id to bias, got {value!r}"
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise InvalidSetting.of(
                "logit_bias",
                len(self.logit_bias),
                f"may hold at most {MAX_LOGIT_BIAS_TOKENS} token ids, got {{value}}",
            )
        bias = {}
        for token, value in self.logit_bias.items():
            check_int("logit_bias", token, 0, part="token id")
            check_number("logit_bias", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, True, part="value")
            bias[token] = float(value)
        self.logit_bias = bias
        check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise InvalidSetting(
                "{min_tokens:()} must be <= {max_tokens:()}",
                {"min_tokens": self.min_tokens, "max_tokens": self.max_tokens},
            )
        words = _as_tuple("bad_words_token_ids", self.bad_words_token_ids, "lists of token ids")
        if len(words) > MAX_BAD_WORDS:
            raise InvalidSetting.of(
                "bad_words_token_ids", len(words), f"may hold at most {MAX_BAD_WORDS} sequences"
            )
        checked = []
        for word in words:
            ids = _as_tuple("bad_words_token_ids", word, "lists of token ids")
            if not ids:
                raise InvalidSetting.of("bad_words_token_ids", ids, "must not hold an empty sequence")
            for token in ids:
                check_int("bad_words_token_ids", token, 0, part="entry")
            checked.append(ids)
        tokens = sum(len(ids) for ids in checked)
        if tokens > MAX_BAD_WORDS_TOKENS:
            raise InvalidSetting.of(
                "bad_words_token_ids",
                tokens,
                f"may hold at most {MAX_BAD_WORDS_TOKENS} tokens in all, got {{value}}",
            )
        self.bad_words_token_ids = tuple(checked)

    @property
    def greedy(self) -> bool:
        """Temperatures below ``GREEDY_BELOW`` are the greedy limit (dividing by them overflows)."""
        return self.temperature < GREEDY_BELOW
