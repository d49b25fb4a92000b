"""CUDA graphs for decode steps, one per batch-size bucket and LoRA/no-LoRA.

A decode step (one token per sequence, every sequence sampling) is written into
static buffers padded to the next bucket (one host-to-device copy) and replayed. Padding rows write no KV
(slot -1), attend to nothing (seq_len 0) and use no adapter (slot -1). Steps
whose rows use no adapter replay a graph captured without any LoRA work.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from multilora_studio.engine.decode_staging import DecodeStaging, StagedDecode
from multilora_studio.engine.llama import AttentionMetadata, LoRAStep
from multilora_studio.engine.lora_weights import LORA_GROUPS

if TYPE_CHECKING:
    from multilora_studio.engine.runner import ModelRunner
    from multilora_studio.engine.scheduler import StepPlan

log = logging.getLogger(__name__)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 32, ending at ``max_num_seqs``."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    sizes += list(range(8, min(64, max_num_seqs) + 1, 8))
    sizes += list(range(96, max_num_seqs + 1, 32))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


def forward_staged(runner: ModelRunner, staging: DecodeStaging, batch: int, uses_lora: bool) -> torch.Tensor:
    """Logits [batch, V] float32 of the first ``batch`` staged rows, padding rows included.

    What a decode graph captures; on the CPU it runs eagerly (tests compare it with the
    eager path).
    """
    attn = AttentionMetadata(
        slot_mapping=staging.slot_mapping[:batch],
        block_tables=staging.block_tables[:batch],
        seq_lens=staging.seq_lens[:batch],
        query_start_loc=staging.query_start_loc[: batch + 1],
        max_query_len=1,
    )
    lora = LoRAStep(staging.lora_batch, frozenset(LORA_GROUPS)) if uses_lora else None
    hidden = runner.model.forward(
        staging.input_ids[:batch], staging.positions[:batch], attn, runner.kv_caches, lora
    )
    return runner.model.logits(hidden)


class DecodeGraphs:
    """Captured decode steps of a ``ModelRunner``, keyed by (bucket, uses_lora).

    Inputs come from a :class:`DecodeStaging` (one host-to-device copy a step, LoRA
    metadata included); the LoRA graphs read its ``lora_batch``.
    """

    def __init__(self, runner: ModelRunner, max_num_seqs: int) -> None:
        self.runner = runner
        self.buckets = batch_buckets(max_num_seqs)
        size = self.buckets[-1]
        self.staging = DecodeStaging(
            size, runner.max_blocks_per_seq, runner.lora.num_slots, runner.block_size, runner.device
        )
        self.logits = torch.zeros((size, runner.spec.vocab_size), dtype=torch.float32, device=runner.device)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_all()

    def _forward(self, batch: int, uses_lora: bool) -> None:
        self.logits[:batch] = forward_staged(self.runner, self.staging, batch, uses_lora)

    @torch.inference_mode()
    def capture_all(self) -> None:
        runner = self.runner
        self.staging.clear()  # padding rows only: captures write no KV and use no adapter
        for batch in reversed(self.buckets):
            for uses_lora in (False, True):
                self._forward(batch, uses_lora)  # warm-up: compiles kernels outside the capture
                torch.cuda.synchronize(runner.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self._forward(batch, uses_lora)
                self.graphs[(batch, uses_lora)] = graph
        torch.cuda.synchronize(runner.device)
        log.info("captured %d decode graphs (buckets %s)", len(self.graphs), self.buckets)

    def accepts(self, plan: StepPlan) -> bool:
        """Whether ``plan`` is a decode step a captured graph can run."""
        return self.staging.accepts(plan.chunks)

    def stage(self, plan: StepPlan, slot_of: dict[str | None, int]) -> StagedDecode:
        """Write ``plan``'s inputs to the staging buffers (one copy enqueued)."""
        return self.staging.stage(plan.chunks, slot_of, self.runner.lora.slot_ranks_host)

    def run(self, staged: StagedDecode) -> torch.Tensor:
        """Replay the graph of the step's bucket; logits [N, V] float32 (a view of a static buffer)."""
        tokens = staged.num_tokens
        batch = self.buckets[bisect.bisect_left(self.buckets, tokens)]
        self.graphs[(batch, staged.uses_lora)].replay()
        return self.logits[:tokens]

    def time_replay(self, batch: int, uses_lora: bool, iters: int) -> float:
        """Median device milliseconds of replaying the graph of ``batch`` as captured."""
        graph = self.graphs[(self.buckets[bisect.bisect_left(self.buckets, batch)], uses_lora)]
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]
