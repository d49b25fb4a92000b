"""Tool-call parsing, streaming hold-back, request checks and enforcement grammars (no server)."""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from multilora_studio.engine.text.chat_tokens import render_in_process
from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import ChatMessage
from multilora_studio.server.tools.formats import HERMES, LLAMA3, MISTRAL, parse
from multilora_studio.server.tools.grammar import tool_grammar
from multilora_studio.server.tools.prompt import FALLBACK_SYSTEM, call_format, renders_tools, tool_prompt
from multilora_studio.server.tools.reply import tool_message
from multilora_studio.server.tools.spec import tool_request
from multilora_studio.server.tools.stream import ToolStream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def calls_of(parsed):
    return [(call.name, json.loads(call.arguments)) for call in parsed.calls]


def test_hermes_several_calls_and_the_text_around_them():
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\nDone.'
    )
    parsed = parse(HERMES, text)
    assert calls_of(parsed) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert parsed.content is not None
    assert "Let me look." in parsed.content and "Done." in parsed.content
    assert "tool_call" not in parsed.content and "Paris" not in parsed.content
    assert len({call.id for call in parsed.calls}) == 2
    assert all(call.id.startswith("call_") for call in parsed.calls)


def test_hermes_only_calls_has_no_content():
    parsed = parse(HERMES, '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n')
    assert parsed.content is None
    assert calls_of(parsed) == [("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call>',  # malformed JSON
        '<tool_call>\n["add"]\n</tool_call>',  # not a call object
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        "no call at all",
    ],
)
def test_hermes_malformed_calls_stay_content(text):
    parsed = parse(HERMES, text)
    assert parsed.calls == ()
    assert parsed.content == text


def test_hermes_keeps_good_calls_next_to_a_malformed_one():
    bad = '<tool_call>\n{"name": "add", "arguments": {oops}\n</tool_call>'
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    parsed = parse(HERMES, bad + "\n" + good)
    assert calls_of(parsed) == [("add", {"a": 3, "b": 4})]
    assert parsed.content is not None and "{oops}" in parsed.content


def test_llama3_json_with_and_without_python_tag_and_several():
    one = parse(LLAMA3, '{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert calls_of(one) == [("add", {"a": 1, "b": 2})] and one.content is None
    tagged = parse(LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert calls_of(tagged) == [("get_weather", {"city": "Oslo"})]
    two = parse(
        LLAMA3,
        '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 5, "b": 6}}',
    )
    assert calls_of(two) == [("add", {"a": 1, "b": 2}), ("add", {"a": 5, "b": 6})]


@pytest.mark.parametrize(
    "text",
    ['{"name": "add", "parameters": {"a": 1', 'The answer is {"name": "add"}', '{"city": "Paris"}', "plain"],
)
def test_llama3_malformed_or_prose_stays_content(text):
    parsed = parse(LLAMA3, text)
    assert parsed.calls == () and parsed.content == text


def test_mistral_marker_array_and_leading_text():
    parsed = parse(
        MISTRAL,
        'Sure. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
    )
    assert calls_of(parsed) == [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Rome"})]
    assert parsed.content == "Sure. "
    bare = parse(
        MISTRAL, '[{"name": "add", "arguments": {"a": 7, "b": 8}}]'
    )  # the marker was a dropped special
    assert calls_of(bare) == [("add", {"a": 7, "b": 8})] and bare.content is None
    broken = parse(MISTRAL, '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}')
    assert broken.calls == () and broken.content == '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}'


def test_message_and_finish_reason():
    message, reason = tool_message(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', HERMES, "stop"
    )
    assert reason == "tool_calls" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    plain, reason = tool_message("hello", HERMES, "length")
    assert plain == {"role": "assistant", "content": "hello"} and reason == "length"


def stream_pieces(tokenizer, text):
    """Text as the detokenizer hands it out: one token at a time, incrementally decoded."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    pieces, before = [], ""
    for end in range(1, len(ids) + 1):
        now = tokenizer.decode(ids[:end])
        pieces.append(now[len(before) :])
        before = now
    assert "".join(pieces) == text
    return pieces


def assemble(format_name, pieces):
    """What an OpenAI client rebuilds from the streamed deltas: content and calls by index."""
    held = ToolStream(format_name)
    content = "".join(held.feed(piece) for piece in pieces)
    rest, deltas = held.finish()
    calls: dict[int, dict] = {}
    for delta in deltas:
        call = calls.setdefault(delta["index"], {"id": None, "name": "", "arguments": ""})
        call["id"] = delta.get("id", call["id"])
        call["name"] += delta["function"].get("name", "")
        call["arguments"] += delta["function"].get("arguments", "")
    return (content + rest) or None, [calls[i] for i in sorted(calls)], content


@pytest.mark.parametrize(
    ("format_name", "text"),
    [
        (
            HERMES,
            'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "\n</tool_call>",
        ),
        (
            HERMES,
            '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
        ),
        (HERMES, "Just text, with a <tool_ lookalike and <b>tags</b>."),
        (HERMES, 'broken <tool_call>{"name": "add", "arguments": {</tool_call> end'),
        (LLAMA3, '{"name": "add", "parameters": {"a": 10, "b": 20}}'),
        (LLAMA3, "An ordinary answer."),
        (MISTRAL, 'Here: [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lima", "days": 2}}]'),
    ],
)
def test_streamed_deltas_reassemble_to_the_whole_message(tokenizer, format_name, text):
    content, calls, early = assemble(format_name, stream_pieces(tokenizer, text))
    message, _ = tool_message(text, format_name, "stop")
    assert content == message["content"]
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert [(c["name"], c["arguments"]) for c in calls] == expected
    assert all(c["id"].startswith("call_") for c in calls)
    assert "tool_call" not in early and "[TOOL_CALLS]" not in early  # a call never leaks as content
    if not expected:
        assert early  # plain text streamed before the end (the hold-back is bounded)


def test_plain_text_streams_before_the_answer_ends(tokenizer):
    held = ToolStream(HERMES)
    pieces = stream_pieces(tokenizer, "The weather is nice today in the city of Paris")
    sent = "".join(held.feed(piece) for piece in pieces[:-1])
    assert sent.startswith("The weather is nice")


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "retrieval"}], None, "tools.0.type"),
        ([{"type": "function", "function": {"name": "has space"}}], None, "tools.0.function.name"),
        (
            [WEATHER, {"type": "function", "function": {"name": "x", "parameters": [1]}}],
            None,
            "tools.1.function.parameters",
        ),
        ([WEATHER, WEATHER], None, "tools.1.function.name"),
        ([WEATHER], {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        (None, "required", "tool_choice"),
    ],
)
def test_bad_tool_options_name_the_field(tools, choice, param):
    with pytest.raises(ApiError) as raised:
        tool_request(tools, choice, None)
    assert raised.value.status == 400 and raised.value.param == param


def test_tool_choice_modes():
    assert tool_request(TOOLS, None, None).mode == "auto"
    assert tool_request(None, None, None).mode == "none"
    assert tool_request(TOOLS, "none", None).offered == ()
    named = tool_request(TOOLS, {"type": "function", "function": {"name": "add"}}, False)
    assert (named.mode, named.named, named.parallel) == ("named", "add", False)
    assert [t.name for t in named.offered] == ["add"]


def history():
    return [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=[
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        ),
        ChatMessage(role="tool", tool_call_id="call_1", content="18 degrees and sunny"),
    ]


def test_smollm_template_ignores_tools_so_the_fallback_renders_them(tokenizer):
    assert not renders_tools(tokenizer, render_in_process)
    assert call_format(tokenizer, render_in_process, "llama") == HERMES
    prompt = tool_prompt(tokenizer, render_in_process, "llama", history(), tool_request(TOOLS, None, None))
    text = tokenizer.decode(prompt.token_ids)
    assert not prompt.native
    assert FALLBACK_SYSTEM.split("\n")[0] in text
    assert '"name": "get_weather"' in text and '"name": "add"' in text  # both tools listed
    assert text.index("<tools>") < text.index("Weather in Paris?")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 degrees and sunny\n</tool_response>" in text
    assert text.rstrip().endswith("assistant")  # the generation prompt


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tokenizer):
    prompt = tool_prompt(tokenizer, render_in_process, "llama", history(), tool_request(TOOLS, "none", None))
    text = tokenizer.decode(prompt.token_ids)
    assert "<tools>" not in text and "18 degrees" in text


QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<tool_call> format<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_LIKE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}{{ c.function | tojson }}{% endfor %}\n{% endfor %}"
    "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}assistant:"
)


def test_a_template_that_renders_tools_is_used_and_picks_the_parser(tokenizer):
    qwen = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    qwen.chat_template = QWEN_LIKE
    assert renders_tools(qwen, render_in_process)
    assert call_format(qwen, render_in_process, "llama") == HERMES  # the template's markers win
    prompt = tool_prompt(qwen, render_in_process, "qwen2", history(), tool_request(TOOLS, None, None))
    text = qwen.decode(prompt.token_ids)
    assert prompt.native and '"name": "add"' in text
    shown = text.split("<tool_call>")[-1].split("</tool_call>")[0]  # the history's call
    assert json.loads(shown) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert "<|im_start|>tool\n18 degrees and sunny" in text
    llama = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    llama.chat_template = LLAMA_LIKE
    assert call_format(llama, render_in_process, "llama") == LLAMA3
    assert call_format(llama, render_in_process, "mistral") == MISTRAL
    assert call_format(llama, render_in_process, "qwen2") == HERMES


def test_bad_history_arguments_are_a_400(tokenizer):
    given = history()
    given[1] = ChatMessage(
        role="assistant",
        tool_calls=[{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{nope"}}],
    )
    with pytest.raises(ApiError) as raised:
        tool_prompt(tokenizer, render_in_process, "llama", given, tool_request(TOOLS, None, None))
    assert raised.value.param == "messages.1.tool_calls.0.function.arguments"


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer):
    return llguidance.hf.from_tokenizer(tokenizer)


def matches(ll_tokenizer, tokenizer, grammar, text):
    """Whether the grammar's matcher takes ``text``'s tokens and may stop right after."""
    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ok = matcher.consume_tokens(tokenizer(text, add_special_tokens=False).input_ids)
    return bool(ok) and matcher.is_accepting() and not matcher.is_error()


GOOD = {
    HERMES: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    LLAMA3: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    MISTRAL: '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
}


@pytest.mark.parametrize("format_name", [HERMES, LLAMA3, MISTRAL])
def test_named_grammar_compiles_and_takes_only_that_call(ll_tokenizer, tokenizer, format_name):
    request = tool_request(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, None)
    grammar = tool_grammar(request, format_name)
    error, _ = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(grammar), ll_tokenizer
    )
    assert not error
    good = GOOD[format_name]
    assert matches(ll_tokenizer, tokenizer, grammar, good)
    assert calls_of(parse(format_name, good)) == [
        ("get_weather", {"city": "Paris"})
    ]  # the parser reads it back
    add = good.replace('"get_weather"', '"add"').replace('{"city": "Paris"}', '{"a": 1, "b": 2}')
    assert not matches(ll_tokenizer, tokenizer, grammar, add)  # another function
    assert not matches(ll_tokenizer, tokenizer, grammar, good.replace('"Paris"', "7"))  # wrong type
    assert not matches(
        ll_tokenizer, tokenizer, grammar, good.replace('"Paris"}', '"Paris", "x": 1}')
    )  # extra key
    assert not matches(ll_tokenizer, tokenizer, grammar, "Sure! " + good)  # text first
    assert not matches(ll_tokenizer, tokenizer, grammar, good[: len(good) // 2])  # unfinished
    assert not matches(ll_tokenizer, tokenizer, grammar, good.replace('": "', '":   "'))  # padded JSON


@pytest.mark.parametrize("format_name", [HERMES, LLAMA3, MISTRAL])
def test_required_grammar_takes_any_tool_but_not_text(ll_tokenizer, tokenizer, format_name):
    grammar = tool_grammar(tool_request(TOOLS, "required", False), format_name)
    good = GOOD[format_name]
    add = good.replace('"get_weather"', '"add"').replace('{"city": "Paris"}', '{"a": 1, "b": 2}')
    assert matches(ll_tokenizer, tokenizer, grammar, good)
    assert matches(ll_tokenizer, tokenizer, grammar, add)
    assert not matches(ll_tokenizer, tokenizer, grammar, add.replace('"add"', '"mul"'))
    assert not matches(ll_tokenizer, tokenizer, grammar, "I cannot call tools.")


def test_parallel_calls_only_when_allowed(ll_tokenizer, tokenizer):
    two = GOOD[HERMES] + "\n" + GOOD[HERMES]
    assert matches(ll_tokenizer, tokenizer, tool_grammar(tool_request(TOOLS, "required", True), HERMES), two)
    assert not matches(
        ll_tokenizer, tokenizer, tool_grammar(tool_request(TOOLS, "required", False), HERMES), two
    )
    array = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 3, "b": 4}}]'
    assert matches(
        ll_tokenizer, tokenizer, tool_grammar(tool_request(TOOLS, "required", True), MISTRAL), array
    )
    assert not matches(
        ll_tokenizer, tokenizer, tool_grammar(tool_request(TOOLS, "required", False), MISTRAL), array
    )
