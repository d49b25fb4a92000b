"""CUDA graphs for decode steps, one per batch-size bucket and LoRA/no-LoRA.

A decode step (one token per sequence, every sequence sampling) is copied into
static buffers padded to the next bucket and replayed. Padding rows write no KV
(slot -1), attend to nothing (seq_len 0) and use no adapter (slot -1). Steps
whose rows use no adapter replay a graph captured without any LoRA work.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from multilora_studio.engine.llama import AttentionMetadata, LoRAStep
from multilora_studio.engine.lora_weights import LORA_GROUPS

if TYPE_CHECKING:
    from multilora_studio.engine.runner import ModelRunner, StepInputs

log = logging.getLogger(__name__)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 32, ending at ``max_num_seqs``."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    sizes += list(range(8, min(64, max_num_seqs) + 1, 8))
    sizes += list(range(96, max_num_seqs + 1, 32))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


class DecodeGraphs:
    """Captured decode steps of a ``ModelRunner``, keyed by (bucket, uses_lora)."""

    def __init__(self, runner: ModelRunner, max_num_seqs: int) -> None:
        self.runner = runner
        self.buckets = batch_buckets(max_num_seqs)
        size, device = self.buckets[-1], runner.device
        width = runner.max_blocks_per_seq
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)  # [B]
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)  # [B]
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)  # [B]
        self.block_tables = torch.zeros((size, width), dtype=torch.int32, device=device)  # [B, W]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)  # [B]
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)  # [B + 1]
        self.slot_ids = torch.full((size,), -1, dtype=torch.int32, device=device)  # [B]
        self.logits = torch.zeros((size, runner.spec.vocab_size), dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_all()

    def _forward(self, batch: int, uses_lora: bool) -> None:
        runner = self.runner
        attn = AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch],
            block_tables=self.block_tables[:batch],
            seq_lens=self.seq_lens[:batch],
            query_start_loc=self.query_start_loc[: batch + 1],
            max_query_len=1,
        )
        lora = LoRAStep(runner.lora_batch, frozenset(LORA_GROUPS)) if uses_lora else None
        hidden = runner.model.forward(
            self.input_ids[:batch], self.positions[:batch], attn, runner.kv_caches, lora
        )
        self.logits[:batch] = runner.model.logits(hidden)

    @torch.inference_mode()
    def capture_all(self) -> None:
        runner = self.runner
        runner.lora_batch.update(self.slot_ids, runner.lora.slot_ranks)
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

    def can_run(self, inputs: StepInputs) -> bool:
        tokens = inputs.input_ids.shape[0]
        return (
            inputs.attn.max_query_len == 1
            and inputs.attn.seq_lens.shape[0] == tokens
            and inputs.logits_rows.shape[0] == tokens
            and tokens <= self.buckets[-1]
        )

    def run(self, inputs: StepInputs) -> torch.Tensor:
        tokens = inputs.input_ids.shape[0]
        batch = self.buckets[bisect.bisect_left(self.buckets, tokens)]
        width = inputs.attn.block_tables.shape[1]
        self.input_ids[:tokens].copy_(inputs.input_ids)
        self.positions[:tokens].copy_(inputs.positions)
        self.slot_mapping[:tokens].copy_(inputs.attn.slot_mapping)
        self.slot_mapping[tokens:batch].fill_(-1)
        self.block_tables[:tokens, :width].copy_(inputs.attn.block_tables)
        self.seq_lens[:tokens].copy_(inputs.attn.seq_lens)
        self.seq_lens[tokens:batch].fill_(0)
        uses_lora = bool(inputs.lora_groups)
        if uses_lora:
            self.slot_ids[:tokens].copy_(inputs.slot_ids)
            self.slot_ids[tokens:batch].fill_(-1)
            self.runner.lora_batch.update(self.slot_ids[:batch], self.runner.lora.slot_ranks)
        self.graphs[(batch, uses_lora)].replay()
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
