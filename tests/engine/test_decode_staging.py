"""Decode steps staged on the host (one copy) against the step tensors the eager path builds.

The CUDA graphs read their inputs from these buffers; here the same forward runs eagerly on
the test device over the tiny model with adapters in slots, padded to a larger bucket. The
staged words are checked on the CPU (host bookkeeping).
"""

from __future__ import annotations

import random

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.sampling_params import SamplingParams
from multilora_studio.engine.step.step_graphs import batch_buckets, forward_staged
from multilora_studio.engine.step.step_staging import StepStaging
from multilora_studio.kernels.lora import LoRABatch
from tests.engine.conftest import RUNNER_BLOCK as BLOCK


def make_sequences(count: int, blocks: BlockManager, rng: random.Random) -> list[Sequence]:
    """Sequences of different lengths, each with blocks for its next decode token."""
    seqs = []
    for i in range(count):
        prompt = [rng.randrange(5, 200) for _ in range(rng.randrange(2, 11))]
        seq = Sequence(f"r{i}", prompt, None, SamplingParams(max_tokens=8), 0)
        seq.output_token_ids = [rng.randrange(5, 200) for _ in range(rng.randrange(0, 6))]
        blocks.grow(seq, seq.num_tokens)
        seqs.append(seq)
    return seqs


def assert_lora_words(staged: LoRABatch, slots: list[int], ranks: list[int]) -> None:
    """The staged LoRA metadata equals what ``LoRABatch.update`` computes on the device."""
    expected = LoRABatch.allocate(staged.max_tokens, len(ranks)).update(
        torch.tensor(slots, dtype=torch.int32), torch.tensor(ranks, dtype=torch.int32)
    )
    for field in ("token_slots", "token_ranks", "sorted_tokens", "slot_starts", "slot_counts"):
        assert torch.equal(getattr(staged, field).cpu(), getattr(expected, field)), field
    assert staged.num_tokens.item() == len(slots)


def decode_staging(
    max_batch: int, width: int, num_slots: int, device: str | torch.device = "cpu"
) -> StepStaging:
    return StepStaging(
        max_batch, max_batch, width, num_slots, BLOCK, torch.device(device), one_token_per_seq=True
    )


def decode_plan(seqs: list[Sequence]) -> StepPlan:
    return StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs])


def test_staged_words_match_the_step_tensors():
    rng = random.Random(3)
    blocks = BlockManager(200, BLOCK)
    staging = decode_staging(16, 8, 6)
    ranks = [8, 0, 16, 4, 32, 8]
    for _ in range(6):
        seqs = make_sequences(rng.randrange(1, 17), blocks, rng)
        slots = [rng.choice([-1, 0, 2, 3, 4, 5]) for _ in seqs]
        slot_of: dict[str | None, int] = {None: -1}
        for seq, slot in zip(seqs, slots, strict=True):
            seq.adapter = f"slot{slot}" if slot >= 0 else None
            slot_of[seq.adapter] = slot
        plan = decode_plan(seqs)
        assert staging.accepts(plan.chunks)
        staged = staging.stage(plan.chunks, slot_of, ranks)
        n = len(seqs)
        assert staged.num_tokens == n and staged.uses_lora == any(s >= 0 for s in slots)
        assert staging.input_ids[:n].tolist() == [s.token_at(s.num_tokens - 1) for s in seqs]
        assert staging.positions[:n].tolist() == [s.num_tokens - 1 for s in seqs]
        assert staging.slot_mapping[:n].tolist() == [blocks.slot_of(s, s.num_tokens - 1) for s in seqs]
        assert staging.slot_mapping[n:].eq(-1).all() and staging.seq_lens[n:].eq(0).all()
        assert staging.seq_lens[:n].tolist() == [s.num_tokens for s in seqs]
        # each row a sequence of one token that samples it, padding rows too
        assert staging.query_start_loc.tolist() == list(range(17))
        assert staging.logits_rows.tolist() == list(range(16)) and staged.num_sampled == n
        for row, seq in enumerate(seqs):
            assert staging.block_tables[row, : len(seq.block_table)].tolist() == seq.block_table
        if staged.uses_lora:
            assert_lora_words(staging.lora_batch, slots, ranks)
        for seq in seqs:
            blocks.free(seq)


def test_batch_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(130) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128, 130]
    assert batch_buckets(1) == [1] and batch_buckets(6) == [1, 2, 4, 6]


def test_prefill_and_oversized_steps_are_not_staged():
    blocks = BlockManager(50, BLOCK)
    staging = decode_staging(4, 8, 2)
    seqs = make_sequences(5, blocks, random.Random(0))
    assert not staging.accepts(decode_plan(seqs).chunks)  # 5 rows > 4
    prefill = ScheduledChunk(seqs[0], 0, seqs[0].num_tokens)
    assert not staging.accepts([prefill])
    assert not staging.accepts([])


@torch.inference_mode()
def test_staged_decode_forward_equals_the_eager_step(runner_with_adapters):
    runner, slot_of_name = runner_with_adapters
    rng = random.Random(7)
    blocks = BlockManager(64, BLOCK)
    seqs = make_sequences(5, blocks, rng)
    adapters = [None, "tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r32-ko-down"]
    for seq, adapter in zip(seqs, adapters, strict=True):
        seq.adapter = adapter
    slot_of: dict[str | None, int] = {None: -1, **slot_of_name}
    # prefill everything but the last token of each sequence, eagerly
    prefill = StepPlan([ScheduledChunk(s, 0, s.num_tokens - 1) for s in seqs])
    runner.run(runner.prepare(prefill, blocks, slot_of))
    plan = decode_plan(seqs)
    eager = runner.run(runner.prepare(plan, blocks, slot_of))[0].clone()  # [5, V]
    cache_after_eager = runner.kv_cache.clone()
    staging = decode_staging(16, runner.max_blocks_per_seq, runner.lora.num_slots, runner.device)
    staged = staging.stage(plan.chunks, slot_of, runner.lora.slot_ranks_host)
    assert staged.uses_lora
    # bucket 8: three padding rows
    logits = forward_staged(runner.model, runner.kv_caches, staging, 8, staged.uses_lora)
    torch.testing.assert_close(logits[:5], eager, rtol=1e-5, atol=1e-5)
    assert logits[:5].argmax(-1).tolist() == eager.argmax(-1).tolist()
    # the same tokens rewrote the same cache slots (to rounding); padding rows wrote nothing
    written = torch.zeros(runner.kv_cache.shape[2] * BLOCK, dtype=torch.bool, device=runner.device)
    written[[blocks.slot_of(s, s.num_tokens - 1) for s in seqs]] = True
    flat = runner.kv_cache.flatten(2, 3)  # [L, 2, blocks * block_size, Hkv, D]
    flat_eager = cache_after_eager.flatten(2, 3)
    assert torch.equal(flat[:, :, ~written], flat_eager[:, :, ~written])
    torch.testing.assert_close(flat[:, :, written], flat_eager[:, :, written], rtol=1e-4, atol=1e-4)
    # the adapters matter: without them the staged rows differ
    base_only = forward_staged(runner.model, runner.kv_caches, staging, 8, False)
    assert not torch.allclose(base_only[1:5], eager[1:5], atol=1e-4)
    torch.testing.assert_close(base_only[0], eager[0], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_staged_strengths_equal_the_eager_step_and_never_linger(runner_with_adapters):
    """Adapter strengths reach the staged LoRA words (the graphs' inputs): the staged forward
    equals the eager step with the same strengths, and the next step without strengths reads 1.0."""
    runner, slot_of_name = runner_with_adapters
    rng = random.Random(11)
    blocks = BlockManager(64, BLOCK)
    seqs = make_sequences(5, blocks, rng)
    # the same adapter at three strengths, another at 2, a base row
    setup = [
        ("tiny-r8-all", 0.5),
        ("tiny-r8-all", 0.0),
        ("tiny-r8-all", 1.0),
        ("tiny-r16-mlp", 2.0),
        (None, 1.0),
    ]
    for seq, (adapter, strength) in zip(seqs, setup, strict=True):
        seq.adapter = adapter
        seq.params = SamplingParams(max_tokens=8, adapter_scale=strength) if adapter else seq.params
    slot_of: dict[str | None, int] = {None: -1, **slot_of_name}
    prefill = StepPlan([ScheduledChunk(s, 0, s.num_tokens - 1) for s in seqs])
    runner.run(runner.prepare(prefill, blocks, slot_of))
    plan = decode_plan(seqs)
    eager = runner.run(runner.prepare(plan, blocks, slot_of))[0].clone()  # [5, V]
    staging = decode_staging(16, runner.max_blocks_per_seq, runner.lora.num_slots, runner.device)
    staged = staging.stage(plan.chunks, slot_of, runner.lora.slot_ranks_host)
    batch = staging.lora_batch
    assert batch.scaled
    assert batch.token_scales.tolist() == [0.5, 0.0, 1.0, 2.0, 1.0] + [1.0] * 11
    logits = forward_staged(runner.model, runner.kv_caches, staging, 8, staged.uses_lora)
    torch.testing.assert_close(logits[:5], eager, rtol=1e-5, atol=1e-5)
    full = [SamplingParams(max_tokens=8) for _ in seqs]
    for seq, params in zip(seqs, full, strict=True):
        seq.params = params
    staging.stage(plan.chunks, slot_of, runner.lora.slot_ranks_host)
    assert not batch.scaled and batch.token_scales.eq(1.0).all()
    unscaled = forward_staged(runner.model, runner.kv_caches, staging, 8, True)
    assert not torch.allclose(unscaled[:2], logits[:2], atol=1e-4)  # strengths 0.5 and 0 mattered
    torch.testing.assert_close(unscaled[2], logits[2], rtol=0, atol=0)  # strength 1.0 is unchanged
