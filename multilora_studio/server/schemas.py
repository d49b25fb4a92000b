"""Request bodies of the OpenAI (and vLLM) routes; request_fields decides on fields they do not declare."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from multilora_studio.engine import MAX_LOGPROBS, MAX_SEED
from multilora_studio.engine.sampling_params import MAX_LOGIT_BIAS_TOKENS
from multilora_studio.server.unicode_check import refuse_invalid_unicode

MAX_STOP = 16  # stop strings (and stop_token_ids) per request
MAX_STOP_CHARS = 1024  # characters in one stop string
MIN_SEED = -(1 << 63)  # OpenAI takes any signed 64-bit seed; sampling maps it into the engine's range
MAX_BAD_WORDS = 128  # bad_words entries per request (vLLM's limit)
MAX_BAD_WORD_CHARS = 1024  # characters in one bad word, as in one stop string


class _Body(BaseModel):
    """Numbers and booleans are strict (``true`` is no count, ``"yes"`` no boolean); text is valid Unicode."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        return refuse_invalid_unicode(data)


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Sampling(_Body):
    """Fields both generation routes share."""

    model_config = ConfigDict(extra="allow")  # request_fields.check_fields reads the undeclared ones

    model: str = Field(min_length=1, max_length=256)
    n: StrictInt = Field(1, ge=1, le=128)
    temperature: StrictFloat | None = Field(None, ge=0, le=100)
    top_p: StrictFloat | None = Field(None, ge=0, le=1)  # 0: only the most likely token (MIN_TOP_P)
    seed: StrictInt | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    logit_bias: dict[str, StrictFloat] | None = Field(None, max_length=MAX_LOGIT_BIAS_TOKENS)
    user: str | None = None
    # vLLM's extra sampling fields
    top_k: StrictInt | None = Field(None, ge=-1, le=1 << 20)
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = Field(None, max_length=MAX_STOP)
    prompt_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    return_tokens_as_token_ids: bool = False
    # structured output: OpenAI's response_format, vLLM's guided_* (at most one; server/structured.py)
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    repetition_penalty: StrictFloat | None = None  # SamplingParams validates these four
    min_p: StrictFloat | None = None
    min_tokens: StrictInt | None = None
    bad_words: list[Annotated[str, Field(max_length=MAX_BAD_WORD_CHARS)]] | None = Field(
        None, max_length=MAX_BAD_WORDS
    )
    # vLLM's: requests with different salts share no cached prefix
    cache_salt: Annotated[str, Field(max_length=256)] | None = None
    # MultiLoRA Studio's own: the adapter's strength (SamplingParams.adapter_scale validates it)
    adapter_scale: StrictFloat = 1.0

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        texts = [stop] if isinstance(stop, str) else stop or []
        if len(texts) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(texts)}")
        if any(not text for text in texts):
            raise ValueError("a stop string must not be empty")
        if any(len(text) > MAX_STOP_CHARS for text in texts):
            raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters")
        return stop


class CompletionRequest(_Sampling):
    """``POST /v1/completions``; ``prompt`` is text, texts, token ids or lists of token ids."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(
        16, ge=0
    )  # 0: the prompt only (with echo: scored, as OpenAI's legacy API)
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None


class LoadLoraRequest(_Body):
    """vLLM's ``POST /v1/load_lora_adapter`` body."""

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1, max_length=4096)
    base_model: str | None = Field(default=None, max_length=256)  # which base (default: the first)


class UnloadLoraRequest(_Body):
    """vLLM's ``POST /v1/unload_lora_adapter`` body."""

    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: StrictInt | None = None


class TokenizeRequest(_Body):
    """vLLM's ``POST /tokenize`` body: a text ``prompt`` or chat ``messages``."""

    model: str | None = Field(None, min_length=1, max_length=256)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: StrictBool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: StrictBool = True  # messages only
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    """vLLM's ``POST /detokenize`` body."""

    model: str | None = Field(None, min_length=1, max_length=256)
    tokens: list[StrictInt]
