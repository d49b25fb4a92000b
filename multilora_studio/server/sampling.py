"""OpenAI request fields -> engine prompts and SamplingParams; unsupported options are refused clearly."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from multilora_studio.engine import Prompt, SamplingParams
from multilora_studio.engine.sampling_params import MAX_BAD_WORDS_TOKENS
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.server.errors import ApiError
from multilora_studio.server.logprob_shapes import ScoreOptions
from multilora_studio.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from multilora_studio.server.structured import requested_structure

GREEDY_BELOW = 1e-5  # temperatures this small sample greedily, as in vLLM
MIN_TOP_P = 1e-6  # smaller values round to 0 in float32 and empty the distribution; same choice as 1e-6
PARAM_NAMES = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "logprobs",
    "prompt_logprobs",
    "adapter_scale",
    "cache_salt",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "logit_bias",
    "min_tokens",
    "bad_words",
)


def _refuse(param: str, message: str) -> ApiError:
    return ApiError(400, message, "unsupported_parameter", param)


def check_supported(body: CompletionRequest | ChatCompletionRequest) -> None:
    """Options we cannot honour are a 400, never silently ignored."""
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400, "stream_options is only allowed when stream is true", "invalid_value", "stream_options"
        )
    if isinstance(body, CompletionRequest):
        if body.suffix:
            raise _refuse("suffix", "suffix is not supported")
        if body.best_of is not None and body.best_of != body.n:
            raise _refuse("best_of", "best_of is not supported; use n")
    elif body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "invalid_value", "top_logprobs")


def score_options(body: CompletionRequest | ChatCompletionRequest) -> ScoreOptions:
    """The log-probabilities (and echo) a request asked for."""
    as_ids = body.return_tokens_as_token_ids
    if isinstance(body, CompletionRequest):
        return ScoreOptions(body.logprobs, body.prompt_logprobs, body.echo, as_ids)
    top = (body.top_logprobs or 0) if body.logprobs else None
    return ScoreOptions(top, body.prompt_logprobs, token_ids=as_ids)


def _engine_prompt_logprobs(options: ScoreOptions) -> int | None:
    """Alternatives per prompt token the engine computes: for prompt_logprobs and an echo's logprobs."""
    wanted = [options.prompt_logprobs]
    if options.echo:
        wanted.append(options.logprobs)
    given = [k for k in wanted if k is not None]
    return max(given) if given else None


def _logit_bias(given: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias (token-id strings -> bias) with integer keys."""
    bias = {}
    for key, value in (given or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise ApiError(
                400, f"logit_bias keys must be token ids, got {key!r}", "invalid_value", "logit_bias"
            ) from None
    return bias


def bad_words_token_ids(words: list[str] | None, tokenizer: Any | None) -> list[list[int]]:
    """vLLM's tokenization of ``bad_words``: each word as is and, where that gives other tokens of
    the same count, with a leading space (the word inside a sentence); at most
    ``MAX_BAD_WORDS_TOKENS`` tokens in all."""
    if not words:
        return []
    if tokenizer is None:
        raise ApiError(400, "bad_words needs a model with a tokenizer", "invalid_value", "bad_words")
    sequences: list[list[int]] = []
    tokens = 0
    for position, word in enumerate(words):
        plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if not plain:
            raise ApiError(400, f"bad_words entry {word!r} has no tokens", "invalid_value", "bad_words")
        sequences.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
        tokens += len(plain) + len(spaced)
        if tokens > MAX_BAD_WORDS_TOKENS:  # stop tokenizing at once
            raise ApiError(
                400,
                f"bad_words: the first {position + 1} words are over {MAX_BAD_WORDS_TOKENS} tokens "
                "(each counted with and without a leading space); send fewer or shorter words",
                "invalid_value",
                "bad_words",
            )
    return sequences


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, max_tokens: int, tokenizer: Any = None
) -> list[SamplingParams]:
    """Parameters of each of the request's ``n`` choices; choice i samples with ``seed + i`` when a
    seed is given. What the choices share (bad words, the output constraint) is worked out once."""
    options = score_options(body)
    temperature = 1.0 if body.temperature is None else body.temperature
    structured = requested_structure(body)
    bad_words = bad_words_token_ids(body.bad_words, tokenizer)
    try:
        first = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if temperature < GREEDY_BELOW else temperature,
            top_p=1.0 if body.top_p is None else max(body.top_p, MIN_TOP_P),
            top_k=max(0, body.top_k or 0),
            seed=None if body.seed is None else body.seed % (1 << 63),
            stop=body.stop or (),
            stop_token_ids=body.stop_token_ids or (),
            ignore_eos=body.ignore_eos,
            logprobs=options.logprobs,
            prompt_logprobs=_engine_prompt_logprobs(options),
            adapter_scale=body.adapter_scale,
            cache_salt=body.cache_salt,
            structured=structured,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
            min_p=body.min_p or 0.0,
            logit_bias=_logit_bias(body.logit_bias),
            min_tokens=body.min_tokens or 0,
            bad_words_token_ids=bad_words,
        )
    except InvalidSetting as error:  # SamplingParams refuses a field: the parameter it came from
        named = next((field for field in error.fields if field in PARAM_NAMES), None)
        raise ApiError(400, str(error), "invalid_value", named) from None
    if body.seed is None:
        return [first] * body.n  # never changed in place: a choice that needs others gets a copy
    return [first] + [dataclasses.replace(first, seed=(body.seed + i) % (1 << 63)) for i in range(1, body.n)]


def completion_prompts(body: CompletionRequest) -> list[Prompt]:
    """``prompt`` as a list of engine prompts (one per prompt in a batch)."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", "invalid_value", "prompt")
    if all(isinstance(item, int) for item in prompt):
        return [cast(list[int], list(prompt))]
    return cast(list[Prompt], list(prompt))  # several texts or several token lists


def chat_prompt(given: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template expects them: role and plain-text content."""
    messages = []
    for position, message in enumerate(given):
        content = message.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            if any(part.type != "text" or part.text is None for part in content):
                raise ApiError(
                    400,
                    "only text content parts are supported",
                    "invalid_value",
                    f"messages.{position}.content",
                )
            text = "\n".join(part.text or "" for part in content)
        role = "system" if message.role == "developer" else message.role
        messages.append({"role": role, "content": text})
    return messages


def chat_max_tokens(body: ChatCompletionRequest, max_model_len: int) -> int:
    """The requested cap, or as many tokens as the context allows (the engine stops at max_model_len)."""
    return body.max_completion_tokens or body.max_tokens or max_model_len


def chat_max_tokens_field(body: ChatCompletionRequest) -> str | None:
    """The field that set the chat cap (checked against the context), or None: the rest of the context."""
    if body.max_completion_tokens:
        return "max_completion_tokens"
    return "max_tokens" if body.max_tokens else None
