"""Steps with prompt tokens staged on the host (one copy) for the mixed-step CUDA graphs.

The graphs read their inputs from these buffers; here the staged words are checked against
what the eager path builds (on the CPU: host bookkeeping), and the graphs' forward runs eagerly
on the test device over the tiny model with adapters in slots, padded to a larger token
bucket, against the eager step.
"""

from __future__ import annotations

import random

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.step.step_graphs import forward_staged, token_buckets
from multilora_studio.engine.step.step_staging import StepStaging
from tests.engine.conftest import RUNNER_BLOCK as BLOCK
from tests.engine.test_decode_staging import assert_lora_words, make_sequences


def mixed_plan(seqs, rng: random.Random) -> StepPlan:
    """Per sequence: a whole prompt, a partial chunk (samples nothing), or a decode token."""
    chunks = []
    for seq in seqs:
        kind = rng.choice(["prompt", "partial", "decode"])
        if kind == "decode" or seq.num_tokens < 3:
            chunks.append(ScheduledChunk(seq, seq.num_tokens - 1, 1))
        elif kind == "prompt":
            chunks.append(ScheduledChunk(seq, 0, seq.num_tokens))
        else:
            start = rng.randrange(0, seq.num_tokens - 2)
            chunks.append(ScheduledChunk(seq, start, rng.randrange(1, seq.num_tokens - start)))
    return StepPlan(chunks)


def test_staged_words_match_the_step():
    rng = random.Random(11)
    blocks = BlockManager(400, BLOCK)
    staging = StepStaging(96, 12, 8, 6, BLOCK, torch.device("cpu"))
    ranks = [8, 0, 16, 4, 32, 8]
    for _ in range(8):
        seqs = make_sequences(rng.randrange(1, 13), blocks, rng)
        slot_of: dict[str | None, int] = {None: -1}
        for seq in seqs:
            slot = rng.choice([-1, 0, 2, 3, 4, 5])
            seq.adapter = f"slot{slot}" if slot >= 0 else None
            slot_of[seq.adapter] = slot
        plan = mixed_plan(seqs, rng)
        assert staging.accepts(plan.chunks)
        staged = staging.stage(plan.chunks, slot_of, ranks)
        t, n = plan.num_tokens, len(plan.chunks)
        tokens, positions, cache_slots, token_slots, qsl, rows = [], [], [], [], [0], []
        for chunk in plan.chunks:
            span = range(chunk.start, chunk.start + chunk.num_tokens)
            tokens += [chunk.seq.token_at(p) for p in span]
            positions += list(span)
            cache_slots += [blocks.slot_of(chunk.seq, p) for p in span]
            token_slots += [slot_of[chunk.seq.adapter]] * chunk.num_tokens
            qsl.append(qsl[-1] + chunk.num_tokens)
            if chunk.completes:
                rows.append(qsl[-1] - 1)
        assert staged.num_tokens == t and staged.num_sampled == len(rows)
        assert staged.uses_lora == any(s >= 0 for s in token_slots)
        assert staging.input_ids[:t].tolist() == tokens and staging.input_ids[t:].eq(0).all()
        assert staging.positions[:t].tolist() == positions
        assert staging.slot_mapping[:t].tolist() == cache_slots and staging.slot_mapping[t:].eq(-1).all()
        assert staging.query_start_loc.tolist() == qsl + [t] * (12 - n)
        assert staging.seq_lens[:n].tolist() == [c.start + c.num_tokens for c in plan.chunks]
        assert staging.seq_lens[n:].eq(0).all()
        assert staging.logits_rows[: len(rows)].tolist() == rows
        for row, chunk in enumerate(plan.chunks):
            table = chunk.seq.block_table
            assert staging.block_tables[row, : len(table)].tolist() == table
        if staged.uses_lora:
            assert_lora_words(staging.lora_batch, token_slots, ranks)
        for seq in seqs:
            blocks.free(seq)


def test_oversized_steps_are_not_staged():
    blocks = BlockManager(80, BLOCK)
    seqs = make_sequences(5, blocks, random.Random(0))
    prompts = [ScheduledChunk(s, 0, s.num_tokens) for s in seqs]
    total = sum(c.num_tokens for c in prompts)
    assert StepStaging(total, 5, 8, 2, BLOCK, torch.device("cpu")).accepts(prompts)
    assert not StepStaging(total - 1, 5, 8, 2, BLOCK, torch.device("cpu")).accepts(prompts)  # tokens
    assert not StepStaging(total, 4, 8, 2, BLOCK, torch.device("cpu")).accepts(prompts)  # sequences
    assert not StepStaging(total, 5, 8, 2, BLOCK, torch.device("cpu")).accepts([])


def test_token_buckets():
    assert token_buckets(512) == [32, 64, 96, 128, 192, 256, 384, 512]
    assert token_buckets(300) == [32, 64, 96, 128, 192, 256, 300]
    assert token_buckets(16) == [16]


@torch.inference_mode()
def test_staged_mixed_forward_equals_the_eager_step(runner_with_adapters):
    runner, slot_of_name = runner_with_adapters
    rng = random.Random(5)
    blocks = BlockManager(64, BLOCK)
    seqs = make_sequences(6, blocks, rng)
    adapters = [None, "tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r32-ko-down", "tiny-r8-all"]
    for seq, adapter in zip(seqs, adapters, strict=True):
        seq.adapter = adapter
    slot_of: dict[str | None, int] = {None: -1, **slot_of_name}
    # sequences 0-2 already hold their prompts but the last token in the cache (they decode);
    # 3 and 4 send their whole prompt, 5 its prompt in two chunks, the first one now
    runner.run(
        runner.prepare(StepPlan([ScheduledChunk(s, 0, s.num_tokens - 1) for s in seqs[:3]]), blocks, slot_of)
    )
    half = seqs[5].num_tokens // 2
    chunks = [ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs[:3]]
    chunks += [ScheduledChunk(s, 0, s.num_tokens) for s in seqs[3:5]]
    chunks.append(ScheduledChunk(seqs[5], 0, half))
    plan = StepPlan(chunks)
    eager = runner.run(runner.prepare(plan, blocks, slot_of))[0].clone()  # [5, V]: chunk 6 samples nothing
    cache_after_eager = runner.kv_cache.clone()
    staging = StepStaging(64, 8, runner.max_blocks_per_seq, runner.lora.num_slots, BLOCK, runner.device)
    staged = staging.stage(plan.chunks, slot_of, runner.lora.slot_ranks_host)
    assert staged.uses_lora and staged.num_sampled == 5 and staged.num_tokens < 32
    # bucket 32: padding tokens and sequences
    logits = forward_staged(runner.model, runner.kv_caches, staging, 32, staged.uses_lora)
    assert logits.shape[0] == 8
    torch.testing.assert_close(logits[:5], eager, rtol=1e-5, atol=1e-5)
    assert logits[:5].argmax(-1).tolist() == eager.argmax(-1).tolist()
    # the same tokens rewrote the same cache slots (to rounding); padding tokens wrote nothing
    written = torch.zeros(runner.kv_cache.shape[2] * BLOCK, dtype=torch.bool, device=runner.device)
    for chunk in plan.chunks:
        written[
            [blocks.slot_of(chunk.seq, p) for p in range(chunk.start, chunk.start + chunk.num_tokens)]
        ] = True
    flat = runner.kv_cache.flatten(2, 3)  # [L, 2, blocks * block_size, Hkv, D]
    flat_eager = cache_after_eager.flatten(2, 3)
    assert torch.equal(flat[:, :, ~written], flat_eager[:, :, ~written])
    torch.testing.assert_close(flat[:, :, written], flat_eager[:, :, written], rtol=1e-4, atol=1e-4)
    # the adapters matter: without them the adapter rows differ, the base row does not
    base_only = forward_staged(runner.model, runner.kv_caches, staging, 32, False)
    assert not torch.allclose(base_only[1:5], eager[1:5], atol=1e-4)
    torch.testing.assert_close(base_only[0], eager[0], rtol=1e-5, atol=1e-5)
