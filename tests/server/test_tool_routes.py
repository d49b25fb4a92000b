"""Tools on /v1/chat/completions through a real server: the official client and LangChain."""

from __future__ import annotations

import json

import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from multilora_studio.engine.text.chat_tokens import render_in_process
from multilora_studio.server.schemas import ChatMessage
from multilora_studio.server.tools.prompt import tool_prompt
from multilora_studio.server.tools.spec import tool_request
from tests.server.test_tool_formats import TOOLS
from tests.server_fixtures import GREEDY, client

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_9", "content": "18 degrees and sunny"},
]


def expected_prompt_tokens(engine, messages, tools, choice=None):
    given = [ChatMessage(**m) for m in messages]
    return len(
        tool_prompt(
            engine.tokenizer,
            render_in_process,
            engine.spec.model_type,
            given,
            tool_request(tools, choice, None),
        ).token_ids
    )


def test_tools_reach_the_prompt_and_none_leaves_them_out(serve, engine):
    api = client(serve())
    ask = {"model": engine.model_name, "messages": ASK, "max_tokens": 4, **GREEDY}
    plain = api.chat.completions.create(**ask)
    auto = api.chat.completions.create(tools=TOOLS, **ask)
    none = api.chat.completions.create(tools=TOOLS, tool_choice="none", **ask)
    assert auto.usage.prompt_tokens == expected_prompt_tokens(engine, ASK, TOOLS)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None


def test_auto_answer_is_content_or_parsed_calls(serve, engine):
    answer = client(serve()).chat.completions.create(
        model="tiny-r8-all", messages=ASK, tools=TOOLS, max_tokens=24, **GREEDY
    )
    choice = answer.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        names = {t["function"]["name"] for t in TOOLS}
        for call in choice.message.tool_calls:
            assert call.id.startswith("call_") and call.function.name in names
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert choice.finish_reason == "length" and isinstance(choice.message.content, str)
        assert "<tool_call>" not in choice.message.content or "</tool_call>" not in choice.message.content


def test_streamed_answer_with_tools_equals_the_whole_one(serve, engine):
    api = client(serve())
    ask = {"model": "tiny-r4-qv", "messages": ASK, "tools": TOOLS, "max_tokens": 16, **GREEDY}
    whole = api.chat.completions.create(**ask).choices[0]
    content, calls, reason = "", {}, None
    for chunk in api.chat.completions.create(stream=True, **ask):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert (content or None) == whole.message.content
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected
    assert reason == whole.finish_reason


def test_history_with_calls_and_results_is_rendered_and_accepted(serve, engine):
    answer = client(serve()).chat.completions.create(
        model=engine.model_name, messages=HISTORY, tools=TOOLS, max_tokens=4, **GREEDY
    )
    assert answer.usage.prompt_tokens == expected_prompt_tokens(engine, HISTORY, TOOLS)
    without_tools = client(serve()).chat.completions.create(
        model=engine.model_name, messages=HISTORY, max_tokens=4, **GREEDY
    )
    assert without_tools.usage.prompt_tokens == expected_prompt_tokens(engine, HISTORY, None)
    assert without_tools.usage.prompt_tokens < answer.usage.prompt_tokens


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
    ],
)
def test_bad_tool_options_are_400_naming_the_field(serve, engine, options, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client(serve()).chat.completions.create(
            model=engine.model_name, messages=ASK, max_tokens=2, **options
        )
    assert raised.value.body["param"] == param


def test_bad_history_call_is_400_and_the_server_still_answers(serve, engine):
    api = client(serve())
    broken = [dict(m) for m in HISTORY]
    broken[1] = {
        **broken[1],
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "x", "arguments": "{"}}],
    }
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=engine.model_name, messages=broken, tools=TOOLS, max_tokens=2)
    assert raised.value.body["param"] == "messages.1.tool_calls.0.function.arguments"
    assert api.chat.completions.create(model=engine.model_name, messages=ASK, max_tokens=2).choices


def test_langchain_bind_tools_and_tool_message_history(serve, engine):
    server = serve()
    chat = ChatOpenAI(
        model=engine.model_name, base_url=f"{server.url}/v1", api_key="unused", max_tokens=6, temperature=0
    )
    bound = chat.bind_tools(TOOLS)
    first = bound.invoke([HumanMessage("What is the weather in Paris?")])
    assert isinstance(first, AIMessage)
    assert isinstance(first.tool_calls, list)
    assert first.usage_metadata["input_tokens"] == expected_prompt_tokens(engine, ASK, TOOLS)
    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_9"}]),
        ToolMessage("18 degrees and sunny", tool_call_id="call_9"),
    ]
    second = bound.invoke(history)
    assert second.usage_metadata["input_tokens"] == expected_prompt_tokens(engine, HISTORY, TOOLS)
