"""CUDA graphs for steps with prompt tokens, one per token bucket and LoRA/no-LoRA.

An eager step of an 8B model costs about 26 ms of host time launching ~550 kernels (Triton
launches dominate) whatever its size, against 5-7 ms for a replayed decode step: every
prompt that joined a running batch made one step four times slower (docs/engine.md). Steps
of up to ``MAX_TOKENS`` tokens and ``max_num_seqs`` sequences are padded to a token bucket
and replayed. The graphs take every sequence slot (padding sequences have no query) and the
attention kernel's prefill variant with ``max_query_len`` = the bucket, so their launch
grids depend on the bucket alone; the logits of the ``max_num_seqs`` sampling rows come out
of a fixed buffer.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any

import torch

from multilora_studio.engine.llama import AttentionMetadata, LoRAStep
from multilora_studio.engine.lora_weights import LORA_GROUPS
from multilora_studio.engine.mixed_staging import MixedStaging, StagedMixed

if TYPE_CHECKING:
    from multilora_studio.engine.runner import ModelRunner
    from multilora_studio.engine.scheduler import StepPlan

log = logging.getLogger(__name__)

# Steps with more tokens than this run eagerly: their device time (tens of ms) dwarfs the launches.
MAX_TOKENS = 512


def token_buckets(max_tokens: int) -> list[int]:
    """32, 64, 96, 128, 192, 256, 384, 512, capped at ``max_tokens`` (which ends the list)."""
    sizes = [b for b in (32, 64, 96, 128, 192, 256, 384, 512) if b < max_tokens]
    return [*sizes, max_tokens]


def forward_mixed(runner: ModelRunner, staging: MixedStaging, tokens: int, uses_lora: bool) -> torch.Tensor:
    """Logits [S, V] float32 of every sequence slot's sampling row for the first ``tokens``
    staged tokens (padding included). What a mixed graph captures; eager on the CPU (tests)."""
    attn = AttentionMetadata(
        slot_mapping=staging.slot_mapping[:tokens],
        block_tables=staging.block_tables,
        seq_lens=staging.seq_lens,
        query_start_loc=staging.query_start_loc,
        max_query_len=tokens,
    )
    lora = LoRAStep(staging.lora_batch, frozenset(LORA_GROUPS)) if uses_lora else None
    hidden = runner.model.forward(
        staging.input_ids[:tokens], staging.positions[:tokens], attn, runner.kv_caches, lora
    )  # [T, H]
    return runner.model.logits(hidden.index_select(0, staging.logits_rows))


class MixedGraphs:
    """Captured steps with prompt tokens of a ``ModelRunner``, keyed by (token bucket, uses_lora)."""

    def __init__(self, runner: ModelRunner, max_num_seqs: int, max_tokens: int, pool: Any) -> None:
        self.runner = runner
        self.buckets = token_buckets(max_tokens)
        self.staging = MixedStaging(
            self.buckets[-1],
            max_num_seqs,
            runner.max_blocks_per_seq,
            runner.lora.num_slots,
            runner.block_size,
            runner.device,
        )
        self.logits = torch.zeros(
            (max_num_seqs, runner.spec.vocab_size), dtype=torch.float32, device=runner.device
        )  # [S, V]
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.pool = pool
        self.capture_all()

    def _forward(self, tokens: int, uses_lora: bool) -> None:
        self.logits.copy_(forward_mixed(self.runner, self.staging, tokens, uses_lora))

    @torch.inference_mode()
    def capture_all(self) -> None:
        device = self.runner.device
        self.staging.clear()  # padding only: captures write no KV and use no adapter
        for tokens in reversed(self.buckets):
            for uses_lora in (False, True):
                self._forward(tokens, uses_lora)  # warm-up: compiles kernels outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self._forward(tokens, uses_lora)
                self.graphs[(tokens, uses_lora)] = graph
        torch.cuda.synchronize(device)
        log.info(
            "captured %d graphs for steps with prompt tokens (buckets %s)", len(self.graphs), self.buckets
        )

    def accepts(self, plan: StepPlan) -> bool:
        return self.staging.accepts(plan.chunks)

    def stage(self, plan: StepPlan, slot_of: dict[str | None, int]) -> StagedMixed:
        return self.staging.stage(plan.chunks, slot_of, self.runner.lora.slot_ranks_host)

    def run(self, staged: StagedMixed) -> torch.Tensor:
        """Replay the graph of the step's bucket; logits [N, V] float32 of the sampling sequences."""
        tokens = self.buckets[bisect.bisect_left(self.buckets, staged.num_tokens)]
        self.graphs[(tokens, staged.uses_lora)].replay()
        return self.logits[: staged.num_sampled]
