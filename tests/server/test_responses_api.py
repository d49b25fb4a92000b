"""``/v1/responses`` with the official client: the same text as the chat route, streamed and not; /version."""

from __future__ import annotations

import httpx
import openai
import pytest

import multilora_studio
from tests.server_fixtures import GREEDY, client

MODEL = "tiny-r8-qo"
INSTRUCTIONS = "You are terse."
QUESTION = "Tell me about the sea."
MESSAGES = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]


def chat_text(api, messages, max_tokens):
    reply = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, **GREEDY)
    return reply.choices[0].message.content, reply.usage


def test_response_equals_the_chat_completion_of_the_same_messages(serve):
    api = client(serve())
    expected, usage = chat_text(api, MESSAGES, 9)
    response = api.responses.create(
        model=MODEL, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=9, **GREEDY
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == MODEL and response.output[0].role == "assistant"
    assert response.output_text == expected
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == usage.prompt_tokens
    assert response.usage.output_tokens == 9 and response.usage.total_tokens == usage.prompt_tokens + 9
    items = [
        {"role": "system", "content": INSTRUCTIONS},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    assert (
        api.responses.create(model=MODEL, input=items, max_output_tokens=9, **GREEDY).output_text == expected
    )


def test_streamed_response_events_reassemble_the_text(serve):
    api = client(serve())
    expected, _ = chat_text(api, MESSAGES, 7)
    events = list(
        api.responses.create(
            model=MODEL, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=7, stream=True, **GREEDY
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == expected and len(deltas) > 1
    assert events[-4].text == expected and events[-1].response.output_text == expected
    with api.responses.stream(
        model=MODEL, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=7, **GREEDY
    ) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
    assert "".join(texts) == expected


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input.0.type"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
    ],
)
def test_unsupported_response_fields_are_400_naming_them(serve, options, param):
    settings = {"model": MODEL, "input": QUESTION} | options
    with pytest.raises(openai.BadRequestError) as caught:
        client(serve()).responses.create(**settings)
    assert caught.value.body["param"] == param, caught.value.body


def test_store_false_and_default_service_tier_are_accepted(serve):
    response = client(serve()).responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=2, store=False, service_tier="auto", **GREEDY
    )
    assert response.usage.output_tokens == 2


def test_version_route_reports_the_package_version(serve):
    reply = httpx.get(f"{serve().url}/version")
    assert reply.status_code == 200 and reply.json() == {"version": multilora_studio.__version__}
