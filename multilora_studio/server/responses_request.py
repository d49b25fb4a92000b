"""``POST /v1/responses`` bodies (OpenAI's Responses API, text only) as the chat request they mean."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import ChatCompletionRequest
from multilora_studio.server.unicode_check import refuse_invalid_unicode

ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text")  # output_text: an earlier assistant turn given back


class ResponsesRequest(BaseModel):
    """The fields we honour; request_fields decides on the others (refused ones are a 400)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0, le=100)
    top_p: StrictFloat | None = Field(None, ge=0, le=1)
    stream: StrictBool = False
    # vLLM's extras and ours, as on chat
    top_k: StrictInt | None = Field(None, ge=-1, le=1 << 20)
    ignore_eos: StrictBool = False
    adapter_scale: StrictFloat = 1.0

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        return refuse_invalid_unicode(data)


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)


def _item_text(item: dict[str, Any], position: int) -> tuple[str, str]:
    """(role, text) of one input item: a message with string content or text parts."""
    where = f"input.{position}"
    if item.get("type", "message") != "message":
        raise _invalid(
            f"only message input items are supported, got type {item.get('type')!r}", f"{where}.type"
        )
    role = item.get("role")
    if role not in ROLES:
        raise _invalid(f"role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return role, content
    if not isinstance(content, list):
        raise _invalid("content must be a string or a list of input_text parts", f"{where}.content")
    texts = []
    for index, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") not in TEXT_PARTS
            or not isinstance(part.get("text"), str)
        ):
            raise _invalid("only input_text content parts are supported", f"{where}.content.{index}")
        texts.append(part["text"])
    return role, "\n".join(texts)


def as_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request with the same messages and sampling (instructions: a system turn)."""
    messages = [] if body.instructions is None else [{"role": "system", "content": body.instructions}]
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        if not body.input:
            raise _invalid("input must not be empty", "input")
        for position, item in enumerate(body.input):
            role, text = _item_text(item, position)
            messages.append({"role": role, "content": text})
    shared = body.model_dump(
        include={"model", "temperature", "top_p", "stream", "top_k", "ignore_eos", "adapter_scale"}
    )
    return ChatCompletionRequest.model_validate(
        shared | {"messages": messages, "max_completion_tokens": body.max_output_tokens}
    )
