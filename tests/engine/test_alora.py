"""Activated LoRA (aLoRA) adapters served in mixed batches, equal to PEFT's aLoRA ``generate``.

PEFT builds the adapters (random, non-zero factors). An aLoRA row applies its adapter from the
start of the invocation's last occurrence in the prompt on, generated tokens included, and runs
as the base model before it (throughout, when the prompt lacks the invocation). Greedy tokens
equal PEFT's ``generate`` for that adapter alone and log-probabilities are within the fidelity
tests' float32 tolerance, beside plain LoRA and base rows, on each LoRA path and in chunked
prefill; the eager step and the graphs' staging give each token the same slot.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from multilora_studio.adapters.adapter_config import parse_adapter_config
from multilora_studio.adapters.peft_adapter import AdapterError, inspect_peft_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.batch.activation import NEVER, adapter_start
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.model.model_spec import spec_from_config
from multilora_studio.engine.step.step_graphs import forward_staged
from multilora_studio.engine.step.step_inputs import eager_inputs
from multilora_studio.engine.step.step_staging import StepStaging
from tests.adapter_fixtures import edit_config
from tests.engine.conftest import RUNNER_BLOCK
from tests.engine.reference import PeftReference
from tests.engine.test_decode_staging import assert_lora_words, make_sequences
from tests.engine.test_logprobs import TOLERANCE
from tests.engine.test_model_families import PATHS, new_tokens
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

NEW_TOKENS = 16
TOP = 3
INVOKE = [510, 2300, 44]  # the aLoRA adapters' invocation tokens
ALORA = AdapterSpec(
    "alora-r8-all", 8, 16, (*ATTENTION_TARGETS, *MLP_TARGETS), 31, (("alora_invocation_tokens", INVOKE),)
)
ALORA_BIAS = AdapterSpec(
    "alora-bias-r4",
    4,
    8,
    ("q_proj", "k_proj", "v_proj", "down_proj"),
    32,
    (("alora_invocation_tokens", INVOKE), ("lora_bias", True)),
)
LORA = AdapterSpec("lora-r4-qv", 4, 8, ("q_proj", "v_proj"), 33)
AS_LORA = "alora-as-lora"  # the aLoRA's factors as a plain LoRA (its config without the invocation)
TWICE = [1, *INVOKE, 88, 3, *INVOKE, 901, 7, 12]  # the last occurrence counts: from position 6
AT_END = [1, 88, 3, 4, 5, 6, *INVOKE]  # the usual form: the invocation ends the prompt
AT_START = [*INVOKE, 9000, 77, 5, 6]
WITHOUT = [1, 9000, 77, 510, 2300, 5]  # only part of the invocation: the base model throughout
REQUESTS = [  # (prompt, adapter), one batch
    (TWICE, ALORA.name),
    (AT_END, ALORA.name),
    (AT_START, ALORA_BIAS.name),
    (WITHOUT, ALORA.name),
    (TWICE, LORA.name),
    (AT_END, None),
    (TWICE, AS_LORA),
]


class Expected:
    """PEFT's ``generate`` per (adapter, prompt), computed once."""

    def __init__(self, reference: PeftReference) -> None:
        self.reference = reference
        self._done: dict[tuple[str | None, tuple[int, ...], int], tuple[list[int], torch.Tensor]] = {}

    def __call__(self, adapter: str | None, prompt: list[int], count: int) -> tuple[list[int], torch.Tensor]:
        key = (adapter, tuple(prompt), count)
        if key not in self._done:
            self._done[key] = self.reference.generated(adapter, prompt, count)
        return self._done[key]


@pytest.fixture(scope="module")
def alora(tiny_model_dir, tmp_path_factory) -> tuple[dict, Expected]:
    """The adapters (name -> folder) and PEFT's outputs over them."""
    folder = tmp_path_factory.mktemp("alora")
    specs = (ALORA, ALORA_BIAS, LORA)
    adapters = {spec.name: build_adapter(tiny_model_dir, spec, folder / spec.name) for spec in specs}
    adapters[AS_LORA] = shutil.copytree(adapters[ALORA.name], folder / AS_LORA)
    edit_config(adapters[AS_LORA], alora_invocation_tokens=None)
    return adapters, Expected(PeftReference(tiny_model_dir, adapters))


def engine_config(base, device, **changes) -> EngineConfig:
    return EngineConfig(
        model=str(base), device=device, dtype="float32", max_lora_rank=16, max_model_len=128, **changes
    )


def test_the_start_is_where_peft_places_the_invocation():
    """PEFT's offsets count back from the end (``calculate_alora_offsets``): the start of the
    invocation's last occurrence, None without one."""
    from peft import LoraConfig
    from peft.tuners.lora.variants import calculate_alora_offsets

    configs = {"a": LoraConfig(alora_invocation_tokens=INVOKE, task_type="CAUSAL_LM")}
    for prompt in (TWICE, AT_END, AT_START, WITHOUT, [1, 510, 510, 2300, 44], [510, 2300]):
        (offset,) = calculate_alora_offsets(configs, "a", torch.tensor([prompt]))
        assert adapter_start(prompt, tuple(INVOKE)) == (NEVER if offset is None else len(prompt) - offset)
    assert adapter_start(TWICE, tuple(INVOKE)) == 6
    assert adapter_start(WITHOUT, ()) == 0  # plain LoRA and the base: from the first token


@pytest.mark.slow(seconds=60)
@pytest.mark.parametrize("path", list(PATHS))
def test_alora_in_a_mixed_batch_matches_peft_generate(path, alora, tiny_model_dir, engine_device):
    adapters, expected = alora
    count = new_tokens(path, engine_device, NEW_TOKENS)
    params = SamplingParams(max_tokens=count, temperature=0, ignore_eos=True, logprobs=TOP)
    with Engine(engine_config(tiny_model_dir, engine_device, **PATHS[path])) as engine:
        for name, folder in adapters.items():
            engine.add_adapter(name, folder)
        kinds = {info.name: info.kind for info in engine.list_adapters()}
        outputs = engine.generate([p for p, _ in REQUESTS], [a for _, a in REQUESTS], params)
    assert kinds == {
        ALORA.name: "aLoRA",
        ALORA_BIAS.name: "aLoRA with bias",
        LORA.name: "LoRA",
        AS_LORA: "LoRA",
    }
    for (prompt, name), output in zip(REQUESTS, outputs, strict=True):
        tokens, logprobs = expected(name, prompt, count)  # logprobs [count, V]
        assert output.token_ids == tokens, (name, prompt)
        for step, (entry, token) in enumerate(zip(output.logprobs, tokens, strict=True)):
            assert abs(entry.logprob - float(logprobs[step, token])) < TOLERANCE, (name, step)
            for (top_id, top_lp), value in zip(entry.top, logprobs[step].topk(TOP).values, strict=True):
                assert abs(float(logprobs[step, top_id]) - top_lp) < TOLERANCE
                assert abs(top_lp - float(value)) < TOLERANCE
    served = {(tuple(p), a): o.token_ids for (p, a), o in zip(REQUESTS, outputs, strict=True)}
    assert served[(tuple(TWICE), ALORA.name)] != expected(None, TWICE, count)[0], "the adapter did nothing"
    # applied from the first token instead, the same factors give other tokens
    assert served[(tuple(TWICE), ALORA.name)] != served[(tuple(TWICE), AS_LORA)]
    assert served[(tuple(WITHOUT), ALORA.name)] == expected(None, WITHOUT, count)[0]


def test_alora_prompt_scores_in_chunked_prefill_match_peft(alora, tiny_model_dir, engine_device):
    """A prompt prefilled in 8-token chunks, its invocation across a chunk boundary: its tokens'
    log-probabilities are the base's up to the invocation and the adapter's from it on."""
    adapters, expected = alora
    rng = random.Random(7)
    prompt = [1, *(rng.randrange(100, 40000) for _ in range(20)), *INVOKE, 17, 23, 5]  # invocation at 21
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, prompt_logprobs=1)
    requests = [(prompt, ALORA.name), (prompt, LORA.name), (prompt, None)]
    config = engine_config(tiny_model_dir, engine_device, max_num_batched_tokens=8, max_num_seqs=4)
    with Engine(config) as engine:
        engine.add_adapter(ALORA.name, adapters[ALORA.name])
        engine.add_adapter(LORA.name, adapters[LORA.name])
        outputs = engine.generate([p for p, _ in requests], [a for _, a in requests], params)
    reference = expected.reference
    for (ids, name), output in zip(requests, outputs, strict=True):
        assert output.token_ids == expected(name, ids, NEW_TOKENS)[0], name
        scores = reference.logprobs(name, ids)  # [L, V]: PEFT's forward places the aLoRA as generate does
        for position in range(1, len(ids)):
            entry = output.prompt_logprobs[position]
            assert abs(entry.logprob - float(scores[position - 1, ids[position]])) < TOLERANCE, (
                name,
                position,
            )
    base = reference.logprobs(None, prompt)
    served = [entry.logprob for entry in outputs[0].prompt_logprobs[1:]]  # of positions 1 ...
    as_base = [float(base[p - 1, prompt[p]]) for p in range(1, len(prompt))]
    assert served[:21] == pytest.approx(as_base[:21], abs=TOLERANCE)  # through the invocation's first token
    assert served[21:] != pytest.approx(as_base[21:], abs=TOLERANCE)


@torch.inference_mode()
def test_eager_and_staged_steps_give_the_base_slot_before_the_start(runner_with_adapters):
    """The per-token slots of the eager step, of the mixed graphs' staging and of the decode
    graphs' staging: -1 before each sequence's ``adapter_start``; the staged forward equals
    the eager one."""
    runner, slot_of_name = runner_with_adapters
    slot_of: dict[str | None, int] = {None: -1, **slot_of_name}
    ranks = runner.lora.slot_ranks_host
    rng = random.Random(9)
    blocks = BlockManager(64, RUNNER_BLOCK)
    seqs = make_sequences(6, blocks, rng)
    for seq, name in zip(seqs, [None, *slot_of_name, "tiny-r8-all"], strict=True):
        seq.adapter = name
        seq.adapter_start = rng.randrange(1, len(seq.prompt_token_ids)) if name is not None else 0
    seqs[1].adapter_start = NEVER  # a prompt without the invocation
    seqs[2].adapter_start = len(seqs[2].prompt_token_ids) - 1  # the invocation ends the prompt
    width, num_slots = runner.max_blocks_per_seq, runner.lora.num_slots
    prefill = StepPlan([ScheduledChunk(s, 0, s.num_tokens - 1) for s in seqs])
    decode = StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs])
    for plan, staging in (
        (prefill, StepStaging(64, 8, width, num_slots, RUNNER_BLOCK, runner.device)),
        (decode, StepStaging(8, 8, width, num_slots, RUNNER_BLOCK, runner.device, one_token_per_seq=True)),
    ):
        slots = [
            slot_of[c.seq.adapter] if c.seq.adapter is not None and p >= c.seq.adapter_start else -1
            for c in plan.chunks
            for p in range(c.start, c.start + c.num_tokens)
        ]
        if plan is decode:  # a decode token gets the adapter, unless the prompt lacked the invocation
            assert slots == [-1, -1, *(slot_of[s.adapter] for s in seqs[2:])]
        inputs = eager_inputs(plan, blocks, slot_of, runner.lora, runner.device, None, 0)
        assert inputs.slot_ids.tolist() == slots
        logits = runner.run(inputs)[0].clone()  # [completing chunks, V]
        cache = runner.kv_cache.clone()
        staged = staging.stage(plan.chunks, slot_of, ranks)
        assert_lora_words(staging.lora_batch, slots, ranks)
        replayed = forward_staged(
            runner.model, runner.kv_caches, staging, staging.max_tokens, staged.uses_lora
        )
        torch.testing.assert_close(replayed[: logits.shape[0]], logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(runner.kv_cache, cache, rtol=1e-4, atol=1e-4)  # the same KV rewritten


def test_a_malformed_invocation_is_refused_by_name(alora, tiny_model_dir, tmp_path):
    adapters, _ = alora
    where = "adapter_config.json"
    raw = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}
    for value in ([], "510 2300", [510, -1], [510, 2.5], [510, True], {"ids": [510]}):
        with pytest.raises(AdapterError) as refused:
            parse_adapter_config({**raw, "alora_invocation_tokens": value}, where, 16)
        assert str(refused.value).startswith(
            f"{where}: 'alora_invocation_tokens' must be a non-empty list of token ids (>= 0) or null, got "
        )
    assert parse_adapter_config({**raw, "alora_invocation_tokens": None}, where, 16).kind == "LoRA"
    folder = shutil.copytree(adapters[ALORA.name], tmp_path / "outside")
    edit_config(folder, alora_invocation_tokens=[510, 49152])
    spec = spec_from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    outside = r"alora_invocation_tokens has token ids outside the base's vocabulary \[0, 49152\): \[49152\]"
    with pytest.raises(AdapterError, match=outside):
        inspect_peft_adapter(folder, spec.num_layers, spec.projection_shape, 16, spec.vocab)
    with Engine(engine_config(tiny_model_dir, "cpu")) as engine, pytest.raises(ValueError, match=outside):
        engine.add_adapter("outside", folder)


def test_alora_with_dora_or_token_rows_is_refused(tiny_model_dir, tmp_path):
    """What would not run as the base model before the invocation, or what PEFT refuses."""
    where = "adapter_config.json"
    raw = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "alora_invocation_tokens": INVOKE}
    with pytest.raises(AdapterError, match=r"with DoRA \(use_dora\) is not a PEFT adapter"):
        parse_adapter_config({**raw, "use_dora": True}, where, 16)
    for extra in ({"modules_to_save": ["lm_head"]}, {"trainable_token_indices": [5, 6]}):
        with pytest.raises(AdapterError, match=r"with embedding / LM-head rows .* is not served"):
            parse_adapter_config({**raw, **extra}, where, 16)
    added = AdapterSpec("alora-added", 4, 8, ("q_proj",), 34, (("alora_invocation_tokens", INVOKE),))
    folder = build_adapter(tiny_model_dir, added, tmp_path / added.name, added_tokens=2)
    spec = spec_from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    with pytest.raises(AdapterError, match="with embed_tokens / lm_head tensors is not served"):
        inspect_peft_adapter(folder, spec.num_layers, spec.projection_shape, 16, spec.vocab)


def test_an_alora_request_reuses_the_bases_cached_prefix(alora, tiny_model_dir, engine_device):
    """KV before the invocation is the base's: a base request's cached blocks serve the aLoRA
    request that follows, never a plain LoRA's, and the output stays PEFT's."""
    adapters, expected = alora
    rng = random.Random(11)
    context = [1, *(rng.randrange(100, 40000) for _ in range(39))]  # two full blocks and 8 tokens
    prompt = [*context, *INVOKE, 17, 23]  # the adapter starts at position 40
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    with Engine(engine_config(tiny_model_dir, engine_device, block_size=16)) as engine:
        for name in (ALORA.name, LORA.name):
            engine.add_adapter(name, adapters[name])
        engine.generate([[*context, 5, 6]], [None], params)  # the base computes the context
        (activated,) = engine.generate([prompt], [ALORA.name], params)
        (plain,) = engine.generate([prompt], [LORA.name], params)
        follow_up = [*prompt, *activated.token_ids[:8]]  # a chat's next turn: 52 tokens
        (again,) = engine.generate([follow_up], [ALORA.name], params)
    assert activated.num_cached_tokens == 32  # the base's two blocks before the invocation
    assert plain.num_cached_tokens == 0  # a plain LoRA's KV differs from the first token
    assert again.num_cached_tokens == 48  # and the adapter's block 32..47, the invocation at 40 in it
    assert again.token_ids == expected(ALORA.name, follow_up, NEW_TOKENS)[0]
    assert activated.token_ids == expected(ALORA.name, prompt, NEW_TOKENS)[0]
    assert plain.token_ids == expected(LORA.name, prompt, NEW_TOKENS)[0]
