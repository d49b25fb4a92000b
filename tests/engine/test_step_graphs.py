"""The step graphs' staging, bucket choice and replay against the eager step, on the test device.

A CUDA graph replays the work it captured on the same buffers: on CUDA the graphs are real;
on the CPU ``capture_graph`` is replaced by a stand-in whose ``replay`` runs that work again
eagerly, so everything else (the capture loop, staging, buckets, the logits rows a replay
returns) runs as on CUDA.
"""

from __future__ import annotations

import random

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.step.step_graphs import GraphStep, StepGraphs, batch_buckets, token_buckets
from multilora_studio.engine.step.step_staging import StepStaging
from tests.engine.conftest import RUNNER_BLOCK as BLOCK
from tests.engine.conftest import capture_graphs_on
from tests.engine.test_decode_staging import make_sequences


@torch.inference_mode()
def test_replayed_steps_equal_the_eager_steps(runner_with_adapters, engine_device, monkeypatch):
    capture_graphs_on(engine_device, monkeypatch)
    runner, slot_of_name = runner_with_adapters
    device = runner.device
    width, slots = runner.max_blocks_per_seq, runner.lora.num_slots
    decode = StepGraphs(
        runner.model,
        runner.kv_caches,
        StepStaging(8, 8, width, slots, BLOCK, device, one_token_per_seq=True),
        batch_buckets(8),
        None,
    )
    mixed = StepGraphs(
        runner.model,
        runner.kv_caches,
        StepStaging(96, 8, width, slots, BLOCK, device),
        token_buckets(96),
        None,
    )
    assert sorted(decode.graphs) == [
        (b, lora, False, False, 0) for b in (1, 2, 4, 8) for lora in (False, True)
    ]
    assert sorted(mixed.graphs) == [
        (b, lora, False, False, 0) for b in (32, 64, 96) for lora in (False, True)
    ]
    rng = random.Random(9)
    blocks = BlockManager(64, BLOCK)
    seqs = make_sequences(5, blocks, rng)
    for seq, adapter in zip(seqs, [None, "tiny-r4-qv", None, "tiny-r16-mlp", "tiny-r8-all"], strict=True):
        seq.adapter = adapter
    slot_of: dict[str | None, int] = {None: -1, **slot_of_name}
    ranks = runner.lora.slot_ranks_host

    def both(graphs: StepGraphs, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        assert graphs.accepts(plan)
        eager = runner.run(runner.prepare(plan, blocks, slot_of))[0].clone()
        step = graphs.stage(plan, slot_of, ranks)
        assert isinstance(step, GraphStep)
        return runner.run(step)[0].clone(), eager

    # prompts of three sequences (one in two chunks, the first samples nothing), then all decode
    half = seqs[2].num_tokens // 2
    first = StepPlan(
        [ScheduledChunk(s, 0, s.num_tokens - 1) for s in seqs[:2]] + [ScheduledChunk(seqs[2], 0, half)]
    )
    replayed, eager = both(mixed, first)
    assert replayed.shape[0] == 0 == eager.shape[0]  # no chunk reaches its sequence's end
    second = StepPlan(
        [ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs[:2]]
        + [ScheduledChunk(seqs[2], half, seqs[2].num_tokens - half)]
        + [ScheduledChunk(s, 0, s.num_tokens) for s in seqs[3:]]
    )
    replayed, eager = both(mixed, second)
    assert replayed.shape[0] == 5
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    for count in (5, 3, 1):  # buckets 8, 4 and 1
        step = StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs[:count]])
        replayed, eager = both(decode, step)
        assert replayed.shape[0] == count
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        assert replayed.argmax(-1).tolist() == eager.argmax(-1).tolist()
    assert not decode.accepts(second)
