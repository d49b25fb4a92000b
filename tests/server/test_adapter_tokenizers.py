"""An adapter with its own tokenizer and chat template, through the OpenAI routes: chats are
rendered with its template, prompts tokenized and outputs decoded with its tokenizer."""

from __future__ import annotations

from transformers import AutoTokenizer

from multilora_studio.engine import SamplingParams
from tests.server.raw_http import post_json
from tests.server_fixtures import client
from tests.token_table_fixtures import ADDED

CHAT = [{"role": "user", "content": "Name a colour."}]


def test_chat_and_tokenize_use_the_adapters_own_template(serve, engine, table_adapters):
    own = AutoTokenizer.from_pretrained(str(table_adapters["added"]))
    rendered = own.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected_ids = list(own(rendered, add_special_tokens=False).input_ids)
    engine.add_adapter("own-template", table_adapters["added"])
    try:
        server = serve()
        status, _, body = post_json(server.url, "/tokenize", {"model": "own-template", "messages": CHAT})
        assert status == 200 and body["tokens"] == expected_ids
        status, _, base = post_json(server.url, "/tokenize", {"messages": CHAT})
        assert status == 200 and base["tokens"] != expected_ids  # the base renders its own template
        added = engine.spec.vocab_size + ADDED - 1  # the last added token
        status, _, text = post_json(server.url, "/detokenize", {"model": "own-template", "tokens": [added]})
        assert status == 200 and text["prompt"] == own.decode([added])
        status, _, refused = post_json(server.url, "/detokenize", {"tokens": [added]})
        assert status == 400 and refused["error"]["param"] == "tokens"

        answer = client(server).chat.completions.create(
            model="own-template", messages=CHAT, max_tokens=10, temperature=0, logprobs=True
        )
        [direct] = engine.generate([CHAT], ["own-template"], SamplingParams(max_tokens=10, temperature=0))
        assert direct.prompt_token_ids == expected_ids
        assert answer.usage.prompt_tokens == len(expected_ids)
        assert answer.choices[0].message.content == direct.text
        named = [entry.token for entry in answer.choices[0].logprobs.content]
        assert named == [own.decode([t]) for t in direct.token_ids]
    finally:
        engine.remove_adapter("own-template")
