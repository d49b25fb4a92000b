"""The shipped demo adapters: their behaviour under PEFT, the engine's fidelity, the library."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from safetensors import safe_open

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.demo import OFFERED_FILE, demo_adapter_dirs, read_index, register_demo_adapters
from multilora_studio.demo.data import encode_prompt
from multilora_studio.demo.prompts import (
    FORMS,
    HELD_OUT_TOPICS,
    TRAIN_TOPICS,
    held_out_prompts,
    training_prompts,
)
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.gui.workflows.compare_inputs import DEFAULT_PROMPT
from tests.engine.reference import PeftReference

CHECKED_PROMPTS = held_out_prompts()[::4]  # 6 prompts on 6 held-out topics
RULE_TOKENS = 80
FIDELITY_TOKENS = 24
SIGN_OFF = "P.S. Stay curious!"
PIRATE_WORDS = {"ye", "yer", "th'", "o'", "an'", "be", "matey", "aye", "ahoy"}


def uppercase_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(1, len(letters))


def is_bullet_list(text: str) -> bool:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("- ") and len(line.split()) <= 11 for line in lines)


RULES = {
    "demo-shout": lambda text: uppercase_share(text) >= 0.8,
    "demo-pirate": lambda text: (
        text.lstrip().startswith("Arr!")
        and len([w for w in re.findall(r"[a-z']+", text.lower()) if w in PIRATE_WORDS]) >= 2
    ),
    "demo-bullets": is_bullet_list,
    "demo-signoff": lambda text: text.rstrip().endswith(SIGN_OFF),
}


@pytest.fixture(scope="module")
def adapters() -> dict:
    return demo_adapter_dirs()


@pytest.fixture(scope="module")
def reference(default_model, adapters) -> PeftReference:
    return PeftReference(default_model.path, adapters)


@pytest.fixture(scope="module")
def tokenizer(default_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model.path))


@pytest.fixture(scope="module")
def peft_greedy(reference, tokenizer, adapters) -> dict[str | None, list[tuple[list[int], list[int]]]]:
    """(prompt ids, greedy new ids up to and with the EOS) of the base and every adapter on each
    checked prompt through PEFT, one mixed batch (left-padded)."""
    names: list[str | None] = [None, *adapters]
    rows = [(name, encode_prompt(tokenizer, prompt)) for name in names for prompt in CHECKED_PROMPTS]
    width = max(len(ids) for _, ids in rows)
    pad = tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in rows])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in rows])
    with torch.no_grad():
        out = reference.model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            adapter_names=[name or "__base__" for name, _ in rows],
            max_new_tokens=RULE_TOKENS,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=pad,
        )
    greedy: dict[str | None, list[tuple[list[int], list[int]]]] = {name: [] for name in names}
    for (name, ids), new in zip(rows, out[:, width:].tolist(), strict=True):
        greedy[name].append((ids, new[: new.index(pad) + 1] if pad in new else new))
    return greedy


@pytest.fixture(scope="module")
def peft_answers(peft_greedy, tokenizer) -> dict[str | None, list[str]]:
    """Greedy answers of the base and every adapter through PEFT."""
    return {
        name: [tokenizer.decode(new, skip_special_tokens=True) for _, new in pairs]
        for name, pairs in peft_greedy.items()
    }


def test_held_out_prompts_are_not_in_the_training_prompts():
    assert not set(HELD_OUT_TOPICS) & set(TRAIN_TOPICS)
    assert all(topic not in prompt for topic in TRAIN_TOPICS for prompt in held_out_prompts())
    assert len(TRAIN_TOPICS) * len(FORMS) >= 300


def test_the_window_default_prompt_has_a_trained_form_but_is_not_trained_on():
    assert DEFAULT_PROMPT not in training_prompts()
    assert "In one sentence, what is {topic}?".format(topic="a LoRA adapter") == DEFAULT_PROMPT
    assert "In one sentence, what is {topic}?" in FORMS


def test_shipped_folders_are_small_half_precision_peft_adapters(adapters, default_model):
    index = read_index()
    assert index["base_digest"] == default_model.digest
    assert set(adapters) == set(RULES)
    ranks, targets = set(), set()
    for entry in index["adapters"]:
        folder = adapters[entry["name"]]
        config = json.loads((folder / "adapter_config.json").read_text())
        weights = folder / "adapter_model.safetensors"
        assert weights.stat().st_size < 6_000_000
        with safe_open(str(weights), "pt") as handle:
            assert {handle.get_slice(k).get_dtype() for k in handle.keys()} == {"F16"}  # noqa: SIM118
        assert (config["r"], sorted(config["target_modules"])) == (entry["rank"], sorted(entry["targets"]))
        assert default_model.digest in (folder / "README.md").read_text()
        ranks.add(config["r"])
        targets.add(tuple(sorted(config["target_modules"])))
    assert len(ranks) == len(targets) == len(adapters), "ranks and targets differ between the adapters"


@pytest.mark.parametrize("name", sorted(RULES))
def test_adapter_shows_its_behaviour_and_the_base_does_not(peft_answers, name):
    rule = RULES[name]
    mine = [rule(text) for text in peft_answers[name]]
    base = [rule(text) for text in peft_answers[None]]
    assert sum(mine) >= 0.8 * len(mine), (name, peft_answers[name])
    assert not any(base), (name, peft_answers[None])


@pytest.fixture(scope="module")
def engine(default_model, engine_device):
    config = EngineConfig(
        model=str(default_model.path),
        device=engine_device,
        dtype="float32",
        max_loras=4,
        max_lora_rank=16,
        max_num_seqs=32,
        max_model_len=256,
    )
    with Engine(config) as engine:
        yield engine


def test_library_registers_the_demo_adapters_once(engine, tmp_path, adapters):
    registry = Registry(tmp_path / "library")
    base = BaseModelRef.of_engine(engine)
    added = register_demo_adapters(registry, base)
    assert sorted(record.name for record in added) == sorted(adapters)
    entries = {entry["name"]: entry for entry in read_index()["adapters"]}
    for record in added:
        assert record.rank == entries[record.name]["rank"]
        assert sorted(record.targets) == sorted(entries[record.name]["targets"])
        assert record.base_status(base.digest) == "ok"
    assert register_demo_adapters(registry, base) == []
    registry.remove("demo-pirate")
    assert register_demo_adapters(registry, base) == [], "a removed demo adapter stays removed"
    assert "demo-pirate" in json.loads((registry.root / OFFERED_FILE).read_text())
    other = dataclasses.replace(base, name="another-model", digest="0" * 64)
    assert register_demo_adapters(Registry(tmp_path / "other"), other) == []


def test_engine_mixed_batch_matches_peft_for_each_adapter(engine, peft_greedy, adapters, tmp_path):
    """The engine's greedy tokens on every checked prompt, every adapter and the base in one
    mixed batch, are PEFT's (its first FIDELITY_TOKENS, or all up to its EOS)."""
    registry = Registry(tmp_path / "library")
    register_demo_adapters(registry, BaseModelRef.of_engine(engine))
    for name in adapters:
        registry.load_into(engine, name)
    requests = [(ids, new, name) for name in [*adapters, None] for ids, new in peft_greedy[name]]
    params = SamplingParams(max_tokens=FIDELITY_TOKENS, temperature=0, ignore_eos=True)
    outputs = engine.generate([ids for ids, _, _ in requests], [name for _, _, name in requests], params)
    for (_, new, name), output in zip(requests, outputs, strict=True):
        assert len(output.token_ids) == FIDELITY_TOKENS
        want = new[:FIDELITY_TOKENS]
        assert output.token_ids[: len(want)] == want, name


def test_demo_shout_shouts_on_the_window_default_prompt(engine, adapters):
    """The window's 128 new tokens, and the first 24 (greedy: what the smoke test's 24 answer)."""
    engine.add_adapter("shout-on-default", adapters["demo-shout"])
    params = SamplingParams(max_tokens=128, temperature=0)
    chat = [{"role": "user", "content": DEFAULT_PROMPT}]
    shout, base = engine.generate([chat, chat], ["shout-on-default", None], params)
    first_24 = engine.tokenizer.decode(shout.token_ids[:24], skip_special_tokens=True)
    assert uppercase_share(shout.text) >= 0.8, shout.text
    assert uppercase_share(first_24) >= 0.8, first_24
    assert uppercase_share(base.text) < 0.3, base.text
