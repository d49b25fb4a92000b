"""tool_choice required / named are enforced by the grammar (needs the engine's structured-output masks).

These fail until the engine applies ``SamplingParams.structured``; with it, even the random-weight
tiny model must answer with exactly the forced call. The parameters are bounded (enums, small
integers) so a constrained random model finishes well within max_tokens.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

from tests.server_fixtures import client

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}
FORECAST = {
    "type": "function",
    "function": {
        "name": "forecast",
        "description": "Weather for a few days",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
UNITS = {
    "type": "function",
    "function": {
        "name": "set_units",
        "parameters": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "required": ["metric"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [FORECAST, UNITS]
NAMED = {"type": "function", "function": {"name": "forecast"}}
ASK_OPTIONS = {"messages": ASK, "tools": TOOLS, "max_tokens": 120, "temperature": 0}


def check_call(call, name=None):
    """The call names a tool (``name`` when given) and its arguments meet that tool's schema."""
    assert call.id.startswith("call_") and call.type == "function"
    arguments = json.loads(call.function.arguments)
    if name is not None:
        assert call.function.name == name
    if call.function.name == "forecast":
        assert set(arguments) == {"city", "days"}
        assert arguments["city"] in CITY["enum"] and 1 <= arguments["days"] <= 7
    else:
        assert call.function.name == "set_units" and set(arguments) == {"metric"}
        assert isinstance(arguments["metric"], bool)


@pytest.mark.parametrize("model", ["tiny-r8-all", None])
def test_named_tool_choice_forces_that_call(serve, engine, model):
    answer = client(serve()).chat.completions.create(
        model=model or engine.model_name, tool_choice=NAMED, **ASK_OPTIONS
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    check_call(call, "forecast")


def test_required_forces_one_call_of_some_tool(serve, engine):
    answer = client(serve()).chat.completions.create(
        model="tiny-r4-qv", tool_choice="required", parallel_tool_calls=False, **ASK_OPTIONS
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    check_call(call)


def test_required_in_a_mixed_batch_every_adapter_calls(serve, engine, server_adapters):
    api = client(serve())
    models = [*server_adapters, engine.model_name]

    def ask(model):
        return api.chat.completions.create(model=model, tool_choice="required", seed=3, **ASK_OPTIONS)

    with ThreadPoolExecutor(len(models)) as pool:
        answers = list(pool.map(ask, models))
    for answer in answers:
        assert answer.choices[0].finish_reason == "tool_calls"
        assert answer.choices[0].message.tool_calls
        for call in answer.choices[0].message.tool_calls:
            check_call(call)


def test_named_streamed_deltas_equal_the_whole_answer(serve, engine):
    api = client(serve())
    whole = api.chat.completions.create(model="tiny-r8-qo", tool_choice=NAMED, **ASK_OPTIONS).choices[0]
    calls, reason, content = {}, None, ""
    for chunk in api.chat.completions.create(
        model="tiny-r8-qo", tool_choice=NAMED, stream=True, **ASK_OPTIONS
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = call.id or entry["id"]
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert reason == "tool_calls" and content == ""
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected
    assert all(calls[i]["id"].startswith("call_") for i in calls)


def test_langchain_forced_tool_call(serve, engine):
    server = serve()
    chat = ChatOpenAI(
        model=engine.model_name, base_url=f"{server.url}/v1", api_key="unused", max_tokens=120, temperature=0
    )
    message = chat.bind_tools(TOOLS, tool_choice="forecast").invoke([HumanMessage("Weather in Oslo?")])
    [call] = message.tool_calls
    assert call["name"] == "forecast"
    assert call["args"]["city"] in CITY["enum"] and 1 <= call["args"]["days"] <= 7


def test_forced_tools_with_another_constraint_is_a_400(serve, engine):
    with pytest.raises(openai.BadRequestError) as raised:
        client(serve()).chat.completions.create(
            model=engine.model_name,
            tool_choice="required",
            response_format={"type": "json_object"},
            **ASK_OPTIONS,
        )
    assert raised.value.body["param"] == "tool_choice"
