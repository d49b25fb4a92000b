"""Every adapter kind in one mixed batch: vocabulary rows, DoRA, LoRA bias, plain LoRA, base.

PEFT builds each adapter in the test, every trained tensor perturbed: a saved ``lm_head``
(modules_to_save), a saved ``embed_tokens``, retrained tokens (``trainable_token_indices``,
tied into the tiny model's tied head as PEFT ties them), a resized vocabulary with 8 added
tokens, its own tokenizer and chat template, a DoRA and a lora_bias adapter. Greedy tokens of
every row equal PEFT's for that adapter alone (float32, 32 new tokens; 4 on the fused q/k/v
path under Triton's interpreter) on each LoRA path;
prompts hold the retrained and the added ids; log-probabilities of the added-token rows cover
their own vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.engine.reference import greedy_tokens
from tests.engine.test_model_families import PATHS, new_tokens
from tests.token_table_fixtures import ADDED, prompts_for

NEW_TOKENS = 32


def make_engine(base, adapters, engine_device, **config) -> Engine:
    engine = Engine(
        EngineConfig(
            model=str(base),
            device=engine_device,
            dtype="float32",
            max_lora_rank=16,
            max_model_len=128,
            **config,
        )
    )
    for name, path in adapters.items():
        engine.add_adapter(name, path)
    return engine


@pytest.mark.parametrize("path", list(PATHS))
def test_token_tables_in_a_mixed_batch_match_peft(
    path, table_adapters, references, tiny_model_dir, engine_device
):
    count = new_tokens(path, engine_device, NEW_TOKENS)
    with make_engine(tiny_model_dir, table_adapters, engine_device, **PATHS[path]) as engine:
        prompts = prompts_for(engine.spec.vocab_size)
        shown = {info.name: info.tokens for info in engine.list_adapters()}
        outputs = engine.generate(
            list(prompts.values()),
            list(prompts),
            SamplingParams(max_tokens=count, temperature=0, ignore_eos=True),
        )
    assert shown == {
        "head": "lm_head",
        "embed": "embed_tokens",
        "tokens": "3 trained tokens",
        "added": f"embed_tokens, lm_head, +{ADDED} tokens",
        "plain": "",
        "dora": "",
        "bias": "",
    }
    for (name, prompt), output in zip(prompts.items(), outputs, strict=True):
        assert output.token_ids == greedy_tokens(references[name], prompt, count), name
    for (name, prompt), output in zip(prompts.items(), outputs, strict=True):
        if name not in (None, "added"):  # (the base cannot read the added ids)
            assert output.token_ids != greedy_tokens(references[None], prompt, count), f"{name} did nothing"


def test_rows_of_an_added_vocabulary_score_over_it(table_adapters, references, tiny_model_dir, engine_device):
    """Prompt and sampled log-probabilities of each row are over its own vocabulary: the
    added-token adapter's include its new ids, a base row's in the same batch exclude them."""
    with make_engine(tiny_model_dir, table_adapters, engine_device) as engine:
        vocab = engine.spec.vocab_size
        prompts = prompts_for(vocab)
        outputs = engine.generate(
            [prompts["added"], prompts[None], prompts["tokens"]],
            ["added", None, "tokens"],
            SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=3, logprobs=3),
        )
    for name, output in zip(["added", None, "tokens"], outputs, strict=True):
        ids = prompts[name]
        with torch.no_grad():
            logits = references[name](input_ids=torch.tensor([ids])).logits[0].float()
        expected = torch.log_softmax(logits, dim=-1)  # [len, V_row]
        for position in range(1, len(ids)):
            entry = output.prompt_logprobs[position]
            assert entry.logprob == pytest.approx(float(expected[position - 1, ids[position]]), abs=1e-4)
        top = output.logprobs[0].top
        assert [t for t, _ in top] == expected[-1].topk(3).indices.tolist()
        assert expected.shape[1] == (vocab + ADDED if name == "added" else vocab)


def test_an_adapter_with_its_own_template_renders_chats_with_it(
    table_adapters, references, tiny_model_dir, engine_device
):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Name a colour."}]
    own = AutoTokenizer.from_pretrained(str(table_adapters["added"]))
    expected_ids = own.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected_ids = list(getattr(expected_ids, "input_ids", expected_ids))
    with make_engine(tiny_model_dir, table_adapters, engine_device) as engine:
        info = {i.name: i for i in engine.list_adapters()}
        assert info["added"].tokenizer == "own tokenizer / template"
        assert info["plain"].tokenizer == ""
        assert engine.encode(messages, adapter="added") == expected_ids
        assert engine.encode(messages) != expected_ids  # the base renders its own template
        [chat, base_chat] = engine.generate(
            [messages, messages], ["added", None], SamplingParams(max_tokens=12, temperature=0)
        )
    assert chat.prompt_token_ids == expected_ids
    reference = greedy_tokens(references["added"], expected_ids, 12)
    end = own.convert_tokens_to_ids("<|end|>")
    stop = reference.index(end) + 1 if end in reference else len(reference)
    assert chat.token_ids == reference[:stop]  # the adapter's EOS ends it
    assert chat.text == own.decode(reference[:stop], skip_special_tokens=True)
    assert base_chat.prompt_token_ids != expected_ids


def test_the_token_table_pool_keeps_to_its_count(table_adapters, references, tiny_model_dir, engine_device):
    """With room for one adapter's tables, four such adapters take turns: each one's rows
    still equal PEFT's (an evicted adapter's tables never serve another's rows)."""
    names = ["head", "embed", "tokens", "added", "plain"]
    with make_engine(tiny_model_dir, table_adapters, engine_device, max_token_tables=1) as engine:
        prompts = prompts_for(engine.spec.vocab_size)
        outputs = engine.generate(
            [prompts[n] for n in names], names, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        )
        pool = engine.runner.lora.token_tables
        assert len(pool.tables) <= 1
    for name, output in zip(names, outputs, strict=True):
        assert output.token_ids == greedy_tokens(references[name], prompts[name], 8), name


def test_token_ids_outside_an_adapters_vocabulary_are_refused(table_adapters, tiny_model_dir, engine_device):
    with make_engine(tiny_model_dir, table_adapters, engine_device) as engine:
        vocab = engine.spec.vocab_size
        with pytest.raises(ValueError, match="out of range"):
            engine.submit([1, vocab + 1], None)
        with pytest.raises(ValueError, match="out of range"):
            engine.submit([1, vocab + ADDED], "added")
        engine.generate([[1, vocab + ADDED - 1]], ["added"], SamplingParams(max_tokens=1))


def test_a_table_budget_too_small_for_the_adapter_is_refused(table_adapters, tiny_model_dir, engine_device):
    config = EngineConfig(
        model=str(tiny_model_dir), device=engine_device, dtype="float32", max_lora_rank=16,
        token_table_memory_gb=1e-4,
    )  # fmt: skip
    with Engine(config) as engine:
        with pytest.raises(ValueError, match="token_table_memory_gb"):
            engine.add_adapter("head", table_adapters["head"])
        engine.add_adapter("tokens", table_adapters["tokens"])  # retrained rows only: a few KB


def test_each_kind_round_trips_through_the_library(table_adapters, tiny_model_dir, tmp_path, engine_device):
    """Imported into a real library (SQLite), the vocabulary side and the tokenizer files are
    recorded and copied; reopened, the records are the same and the copies serve as the originals."""
    from multilora_studio.adapters.registry import Registry
    from multilora_studio.cli.shared import describe_base

    base = describe_base(str(tiny_model_dir))
    registry = Registry(tmp_path / "library")
    records = {name: registry.import_folder(path, base, name=name) for name, path in table_adapters.items()}
    assert {n: r.contents_label for n, r in records.items()} == {
        "head": "LoRA; lm_head",
        "embed": "LoRA; embed_tokens",
        "tokens": "LoRA; 3 trained tokens",
        "added": f"LoRA; embed_tokens, lm_head, +{ADDED} tokens; own tokenizer / template",
        "plain": "LoRA",
        "dora": "DoRA",
        "bias": "LoRA with bias",
    }
    assert records["head"].rank_label == "8 (LoRA; lm_head)"
    assert (records["added"].path / "tokenizer.json").is_file()
    assert Registry(tmp_path / "library").list_adapters() == registry.list_adapters()
    copies = {name: record.path for name, record in records.items()}
    with make_engine(tiny_model_dir, copies, engine_device) as engine:
        prompts = prompts_for(engine.spec.vocab_size)
        from_library = engine.generate(
            [prompts["added"]], ["added"], SamplingParams(max_tokens=8, temperature=0)
        )
    with make_engine(tiny_model_dir, {"added": table_adapters["added"]}, engine_device) as engine:
        original = engine.generate([prompts["added"]], ["added"], SamplingParams(max_tokens=8, temperature=0))
    assert from_library[0].token_ids == original[0].token_ids


@torch.inference_mode()
def test_step_graphs_between_the_token_tables_equal_the_eager_step(
    table_adapters, tiny_model_dir, engine_device, monkeypatch
):
    """A decode step of rows with token tables replays the graph that starts from the taken
    embeddings and ends at the hidden rows: its logits equal the eager step's (graph capture
    stood in by eager replay on the CPU)."""
    import random

    from multilora_studio.engine.batch.block_manager import BlockManager
    from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
    from multilora_studio.engine.step.step_graphs import GraphStep, StepGraphs, batch_buckets
    from multilora_studio.engine.step.step_staging import StepStaging
    from tests.engine.conftest import RUNNER_BLOCK, capture_graphs_on, tiny_runner
    from tests.engine.test_decode_staging import make_sequences

    capture_graphs_on(engine_device, monkeypatch)
    names = ["head", "embed", "tokens", "added", "plain"]
    adapters = {n: table_adapters[n] for n in names}
    runner, slot_of = tiny_runner(
        tiny_model_dir, adapters, engine_device, max_loras=5, max_lora_rank=16, max_num_seqs=8
    )
    staging = StepStaging(
        8, 8, runner.max_blocks_per_seq, 5, RUNNER_BLOCK, runner.device, one_token_per_seq=True
    )
    decode = StepGraphs(runner.model, runner.kv_caches, staging, batch_buckets(8), None)
    runner.decode_graphs = decode
    blocks = BlockManager(64, RUNNER_BLOCK)
    seqs = make_sequences(6, blocks, random.Random(5))
    vocab = runner.spec.vocab_size
    for seq, adapter in zip(seqs, [*names, None], strict=True):
        seq.adapter = adapter
    seqs[3].output_token_ids.append(vocab + 2)  # the added-token row decodes one of its new tokens
    seqs[2].output_token_ids.append(510)  # a retrained token
    for seq in seqs[2:4]:
        blocks.grow(seq, seq.num_tokens)
    plan = StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs])
    staged = runner.prepare(plan, blocks, slot_of)
    assert isinstance(staged, GraphStep) and staged.tokens is not None
    replayed = runner.run(staged)[0].clone()
    assert (8, True, False, True, 0) in decode.graphs
    runner.decode_graphs = None
    eager = runner.run(runner.prepare(plan, blocks, slot_of))[0]
    assert replayed.shape == (6, vocab + ADDED)
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    assert torch.isinf(replayed[[0, 1, 2, 4, 5], vocab:]).all()  # only the added-token row has those columns
    assert torch.isfinite(replayed[3]).all()


def test_pinning_keeps_room_for_other_adapters_with_token_tables(
    table_adapters, tiny_model_dir, engine_device
):
    with make_engine(tiny_model_dir, table_adapters, engine_device, max_token_tables=2) as engine:
        engine.pin_adapter("head")
        with pytest.raises(ValueError, match="at most 1 adapters with token tables can be pinned"):
            engine.pin_adapter("embed")
        engine.pin_adapter("plain")  # no tables: pinned as before
        prompts = prompts_for(engine.spec.vocab_size)
        outputs = engine.generate(
            [prompts["embed"], prompts["tokens"]],
            ["embed", "tokens"],
            SamplingParams(max_tokens=4, temperature=0),
        )
        assert all(o.error is None and len(o.token_ids) == 4 for o in outputs)
