"""Request bodies of the OpenAI (and vLLM) routes; unknown fields are ignored, as OpenAI's servers do."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from multilora_studio.engine import MAX_LOGPROBS, MAX_SEED

MAX_STOP = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields both generation routes share."""

    model: str = Field(min_length=1, max_length=256)
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = Field(None, max_length=MAX_STOP)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling fields
    top_k: int | None = Field(None, ge=-1, le=1 << 20)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    return_tokens_as_token_ids: bool = False
    repetition_penalty: float | None = None  # SamplingParams validates these four
    min_p: float | None = None
    min_tokens: int | None = None
    bad_words: list[str] | None = Field(None, max_length=256)
    # MultiLoRA Studio's own: the adapter's strength (SamplingParams.adapter_scale validates it)
    adapter_scale: float = 1.0


class CompletionRequest(_Sampling):
    """``POST /v1/completions``; ``prompt`` is text, texts, token ids or lists of token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # 0: the prompt only (with echo: scored, as OpenAI's legacy API)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


class LoadLoraRequest(_Body):
    """vLLM's ``POST /v1/load_lora_adapter`` body."""

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraRequest(_Body):
    """vLLM's ``POST /v1/unload_lora_adapter`` body."""

    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = None


class TokenizeRequest(_Body):
    """vLLM's ``POST /tokenize`` body: a text ``prompt`` or chat ``messages``."""

    model: str | None = Field(None, min_length=1, max_length=256)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True  # messages only
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    """vLLM's ``POST /detokenize`` body."""

    model: str | None = Field(None, min_length=1, max_length=256)
    tokens: list[int]
