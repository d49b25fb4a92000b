"""The context-window check: prompt tokens plus the requested output must fit in max_model_len (as vLLM)."""

from __future__ import annotations

from multilora_studio.server.errors import ApiError


def check_fits(prompt_tokens: int, max_tokens: int, max_model_len: int, param: str | None) -> None:
    """400 naming ``param`` when the client asked for more tokens than the context leaves.

    ``param`` is the field the client set (``max_tokens`` or ``max_completion_tokens``); None when
    it set none (chat): the engine then generates until the context is full, finish_reason "length".
    A prompt that alone fills the context is the engine's refusal (naming the prompt).
    """
    if param is None or prompt_tokens >= max_model_len or prompt_tokens + max_tokens <= max_model_len:
        return
    raise ApiError(
        400,
        f"{param}={max_tokens} is too large: this model's maximum context length is {max_model_len} "
        f"tokens and the prompt has {prompt_tokens}, so at most {max_model_len - prompt_tokens} "
        f"can be generated ({prompt_tokens} + {max_tokens} = {prompt_tokens + max_tokens} > {max_model_len})",
        "invalid_value",
        param,
    )
