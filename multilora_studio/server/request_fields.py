"""Every request field of OpenAI's and vLLM's generation schemas, and what this server does with it.

One place for the decision per field: ``honoured`` (it changes the output as documented),
``refused`` (a 400 naming the field unless its value is one of ``harmless``, the values that
mean "not set"), or ``ignored`` (accepted, harmless, with the reason). Fields in none of
these schemas are ignored, as OpenAI's servers do. docs/server.md's field table is
generated from this one (``field_table``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from multilora_studio.server.errors import ApiError

HONOURED, REFUSED, IGNORED = "honoured", "refused", "accepted, ignored"
CHAT, COMPLETIONS, RESPONSES = "chat", "completions", "responses"
BOTH = (CHAT, COMPLETIONS)


@dataclass(frozen=True)
class RequestField:
    name: str
    routes: tuple[str, ...]
    source: str  # "OpenAI", "vLLM" or "ours"
    status: str
    note: str
    harmless: tuple[Any, ...] = (None,)  # refused fields: the values that are accepted
    example: Any = None  # refused fields: a value that is refused (the tests send it)


def _honoured(name: str, routes: tuple[str, ...], source: str, note: str) -> RequestField:
    return RequestField(name, routes, source, HONOURED, note)


def _ignored(name: str, routes: tuple[str, ...], source: str, note: str) -> RequestField:
    return RequestField(name, routes, source, IGNORED, note)


def _refused(
    name: str,
    routes: tuple[str, ...],
    source: str,
    note: str,
    example: Any,
    harmless: tuple[Any, ...] = (None,),
) -> RequestField:
    return RequestField(name, routes, source, REFUSED, note, harmless, example)


FIELDS: tuple[RequestField, ...] = (
    # ---- OpenAI, both routes
    _honoured("model", (*BOTH, RESPONSES), "OpenAI", "the base model or an adapter name"),
    _honoured("n", BOTH, "OpenAI", "choices per prompt"),
    _honoured("temperature", (*BOTH, RESPONSES), "OpenAI", "below 1e-5 is greedy"),
    _honoured("top_p", (*BOTH, RESPONSES), "OpenAI", "0 is greedy"),
    _honoured("seed", BOTH, "OpenAI", "choice i samples with (seed + i) mod 2**63"),
    _honoured("stop", BOTH, "OpenAI", "up to 16 non-empty strings of at most 1024 characters"),
    _honoured("stream", (*BOTH, RESPONSES), "OpenAI", "server-sent events"),
    _honoured(
        "stream_options", BOTH, "OpenAI", "include_usage: a last chunk with usage; only with stream: true"
    ),
    _honoured("max_tokens", BOTH, "OpenAI", "prompt + max_tokens above max_model_len is a 400"),
    _honoured(
        "logprobs",
        BOTH,
        "OpenAI",
        "completions: top-k count (0: the chosen token only); chat: true/false only",
    ),
    _honoured("presence_penalty", BOTH, "OpenAI", "minus once per token already generated"),
    _honoured("frequency_penalty", BOTH, "OpenAI", "minus per occurrence of a generated token"),
    _honoured("logit_bias", BOTH, "OpenAI", "added to the logits of the given token ids"),
    _ignored(
        "user", (*BOTH, RESPONSES), "OpenAI", "an end-user tag for abuse monitoring; nothing to monitor"
    ),
    # ---- OpenAI, completions
    _honoured("prompt", (COMPLETIONS,), "OpenAI", "text, texts, token ids or lists of token ids"),
    _honoured("echo", (COMPLETIONS,), "OpenAI", "the prompt before the completion (and its logprobs)"),
    _refused("suffix", (COMPLETIONS,), "OpenAI", "insertion is not supported", "tail", (None, "")),
    _refused("best_of", (COMPLETIONS,), "OpenAI", "use n; accepted only equal to n", 3),
    # ---- OpenAI, chat
    _honoured("messages", (CHAT,), "OpenAI", "text content through the chat template"),
    _honoured("max_completion_tokens", (CHAT,), "OpenAI", "as max_tokens (wins when both are set)"),
    _honoured("top_logprobs", (CHAT,), "OpenAI", "alternatives per token; needs logprobs: true"),
    _honoured("response_format", BOTH, "OpenAI", "structured output (completions: vLLM's extra)"),
    _honoured("tools", (CHAT,), "OpenAI", "tool calling"),
    _honoured("tool_choice", (CHAT,), "OpenAI", "tool calling"),
    _honoured("parallel_tool_calls", (CHAT,), "OpenAI", "tool calling"),
    _refused("audio", (CHAT,), "OpenAI", "text only", {"voice": "alloy", "format": "wav"}),
    _refused("modalities", (CHAT,), "OpenAI", "text only", ["text", "audio"], (None, ["text"])),
    _refused("functions", (CHAT,), "OpenAI", "deprecated; use tools", [{"name": "f"}], (None, [])),
    _refused("function_call", (CHAT,), "OpenAI", "deprecated; use tool_choice", "auto", (None, "none")),
    _refused(
        "prediction",
        (CHAT,),
        "OpenAI",
        "predicted outputs are not supported",
        {"type": "content", "content": "x"},
    ),
    _refused("web_search_options", (CHAT,), "OpenAI", "no web search", {}),
    _refused("reasoning_effort", (CHAT,), "OpenAI", "not a reasoning model", "high"),
    _refused("verbosity", (CHAT,), "OpenAI", "no verbosity control", "low"),
    _refused(
        "store", (CHAT, RESPONSES), "OpenAI", "nothing is stored; false is accepted", True, (None, False)
    ),
    _refused(
        "service_tier",
        (CHAT, RESPONSES),
        "OpenAI",
        "one tier; auto and default are accepted",
        "flex",
        (None, "auto", "default"),
    ),
    _refused("moderation", (CHAT, RESPONSES), "OpenAI", "no moderation", {"input": {"mode": "block"}}),
    _ignored("metadata", (CHAT, RESPONSES), "OpenAI", "tags for stored completions; nothing is stored"),
    _ignored("safety_identifier", (CHAT, RESPONSES), "OpenAI", "an end-user id for abuse monitoring"),
    _ignored(
        "prompt_cache_key",
        (CHAT, RESPONSES),
        "OpenAI",
        "a cache-routing hint; prompt prefixes are cached automatically, per adapter",
    ),
    _ignored(
        "prompt_cache_options",
        (CHAT, RESPONSES),
        "OpenAI",
        "cache hints; cached prefixes stay until the KV cache needs their room",
    ),
    _ignored(
        "prompt_cache_retention",
        (CHAT, RESPONSES),
        "OpenAI",
        "cache hints; cached prefixes stay until the KV cache needs their room",
    ),
    # ---- OpenAI, responses
    _honoured("input", (RESPONSES,), "OpenAI", "a string or message items with text content"),
    _honoured("instructions", (RESPONSES,), "OpenAI", "a system message before the input"),
    _honoured("max_output_tokens", (RESPONSES,), "OpenAI", "as chat's max_completion_tokens"),
    _refused(
        "previous_response_id", (RESPONSES,), "OpenAI", "nothing is stored; send the whole input", "resp_1"
    ),
    _refused("conversation", (RESPONSES,), "OpenAI", "nothing is stored; send the whole input", "conv_1"),
    _refused(
        "context_management", (RESPONSES,), "OpenAI", "no server-side context", [{"type": "compaction"}]
    ),
    _refused("reasoning", (RESPONSES,), "OpenAI", "not a reasoning model", {"effort": "high"}),
    _refused("text", (RESPONSES,), "OpenAI", "text output only", {"format": {"type": "json_object"}}),
    _refused(
        "include", (RESPONSES,), "OpenAI", "no extra output", ["reasoning.encrypted_content"], (None, [])
    ),
    _refused("background", (RESPONSES,), "OpenAI", "no background runs", True, (None, False)),
    _refused("background_options", (RESPONSES,), "OpenAI", "no background runs", {"x": 1}, (None, {})),
    _refused("prompt", (RESPONSES,), "OpenAI", "no stored prompts", {"id": "pmpt_1"}),
    _refused("top_logprobs", (RESPONSES,), "OpenAI", "use /v1/chat/completions for logprobs", 2, (None, 0)),
    _refused("truncation", (RESPONSES,), "OpenAI", "inputs are never truncated", "auto", (None, "disabled")),
    _refused("image", (RESPONSES,), "OpenAI", "text only", {"size": "auto"}),
    _refused("access_programs", (RESPONSES,), "OpenAI", "no access programs", {"x": 1}),
    _refused(
        "tools", (RESPONSES,), "OpenAI", "no tools on /v1/responses", [{"type": "web_search"}], (None, [])
    ),
    _refused(
        "tool_choice", (RESPONSES,), "OpenAI", "no tools on /v1/responses", "required", (None, "none", "auto")
    ),
    _ignored("parallel_tool_calls", (RESPONSES,), "OpenAI", "no tools on /v1/responses"),
    _ignored("max_tool_calls", (RESPONSES,), "OpenAI", "no built-in tools run on the server"),
    _ignored("stream_options", (RESPONSES,), "OpenAI", "include_obfuscation: streams are never padded"),
    # ---- vLLM's extras
    _honoured("top_k", (*BOTH, RESPONSES), "vLLM", "0 or -1: off"),
    _honoured("ignore_eos", (*BOTH, RESPONSES), "vLLM", "generate past the end-of-sequence token"),
    _honoured("stop_token_ids", BOTH, "vLLM", "up to 16 token ids"),
    _honoured("prompt_logprobs", BOTH, "vLLM", "scores of the prompt tokens"),
    _honoured("return_tokens_as_token_ids", BOTH, "vLLM", "logprob tokens as token:<id>"),
    _honoured("min_p", BOTH, "vLLM", "drops tokens below min_p x the top one"),
    _honoured("min_tokens", BOTH, "vLLM", "no EOS, stop token or stop string before it"),
    _honoured("repetition_penalty", BOTH, "vLLM", "HF's formula over prompt and output"),
    _honoured("bad_words", BOTH, "vLLM", "with and without a leading space"),
    _honoured("guided_json", BOTH, "vLLM", "structured output"),
    _honoured("guided_regex", BOTH, "vLLM", "structured output"),
    _honoured("guided_choice", BOTH, "vLLM", "structured output"),
    _honoured("guided_grammar", BOTH, "vLLM", "structured output"),
    _refused("use_beam_search", BOTH, "vLLM", "no beam search", True, (None, False)),
    _refused("length_penalty", BOTH, "vLLM", "beam search only", 0.5, (None, 1, 1.0)),
    _refused(
        "include_stop_str_in_output", BOTH, "vLLM", "the stop string is always cut", True, (None, False)
    ),
    _refused("skip_special_tokens", BOTH, "vLLM", "special tokens are always skipped", False, (None, True)),
    _refused(
        "spaces_between_special_tokens", BOTH, "vLLM", "special tokens are skipped", False, (None, True)
    ),
    _refused("truncate_prompt_tokens", BOTH, "vLLM", "prompts are never truncated", 8),
    _refused("allowed_token_ids", BOTH, "vLLM", "use logit_bias", [1, 2]),
    _refused("guided_decoding_backend", BOTH, "vLLM", "one structured-output backend", "outlines"),
    _refused("guided_whitespace_pattern", BOTH, "vLLM", "fixed whitespace rules", r"\s*"),
    _refused("structural_tag", BOTH, "vLLM", "not supported", "{}"),
    _refused("logits_processors", BOTH, "vLLM", "no custom logits processors", ["my.processor"], (None, [])),
    _refused("priority", BOTH, "vLLM", "first come, first served", 1, (None, 0)),
    _refused(
        "add_special_tokens",
        (COMPLETIONS,),
        "vLLM",
        "the tokenizer's special tokens are added",
        False,
        (None, True),
    ),
    _refused("add_special_tokens", (CHAT,), "vLLM", "the chat template adds its own", True, (None, False)),
    _refused("mm_processor_kwargs", BOTH, "vLLM", "text only", {"x": 1}, (None, {})),
    _refused("kv_transfer_params", BOTH, "vLLM", "no KV transfer", {"x": 1}),
    _refused("vllm_xargs", BOTH, "vLLM", "no extension arguments", {"x": 1}, (None, {})),
    _refused("echo", (CHAT,), "vLLM", "no echo of the last message", True, (None, False)),
    _refused(
        "add_generation_prompt", (CHAT,), "vLLM", "the assistant turn is always opened", False, (None, True)
    ),
    _refused(
        "continue_final_message", (CHAT,), "vLLM", "the assistant turn is always new", True, (None, False)
    ),
    _refused("chat_template", (CHAT,), "vLLM", "the model's template is used", "{{ messages }}"),
    _refused(
        "chat_template_kwargs", (CHAT,), "vLLM", "the template takes no extra variables", {"x": 1}, (None, {})
    ),
    _refused(
        "documents", (CHAT,), "vLLM", "no retrieval documents in the template", [{"text": "d"}], (None, [])
    ),
    _ignored("request_id", BOTH, "vLLM", "responses carry the server's own id"),
    _honoured(
        "cache_salt",
        BOTH,
        "vLLM",
        "requests with different salts share no cached prefix (without one, every key's requests "
        "to an adapter share its cached prefixes)",
    ),
    # ---- ours
    _honoured("adapter_scale", (*BOTH, RESPONSES), "ours", "the adapter's strength, 0 to 16"),
)


def fields_of(route: str) -> dict[str, RequestField]:
    """The table's entries for one route, by name."""
    return {entry.name: entry for entry in FIELDS if route in entry.routes}


def _is_harmless(value: Any, harmless: Iterable[Any]) -> bool:
    return any(type(value) is type(h) and value == h for h in harmless if h is not None) or value is None


def check_fields(route: str, body: BaseModel) -> None:
    """400 for every field the request models do not declare that the table refuses (non-harmless)."""
    known = fields_of(route)
    for name, value in (body.model_extra or {}).items():
        entry = known.get(name)
        if entry is not None and entry.status == REFUSED and not _is_harmless(value, entry.harmless):
            raise ApiError(400, f"{name} is not supported: {entry.note}", "unsupported_parameter", name)


def field_table() -> str:
    """The Markdown table docs/server.md shows (a test keeps the two equal)."""
    rows = ["| field | routes | from | status | note |", "| --- | --- | --- | --- | --- |"]
    for entry in sorted(FIELDS, key=lambda e: (e.name, e.routes)):
        status = entry.status
        if entry.status == REFUSED:
            accepted = ", ".join(json.dumps(h) for h in entry.harmless)
            status = f"refused unless {accepted}"
        rows.append(
            f"| `{entry.name}` | {', '.join(entry.routes)} | {entry.source} | {status} | {entry.note} |"
        )
    return "\n".join(rows) + "\n"
