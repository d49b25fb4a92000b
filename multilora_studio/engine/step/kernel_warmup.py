"""Compile, at start-up, the Triton kernel variants that prefill and mixed steps select.

Decode steps are captured in CUDA graphs, which compiles their kernels. Steps with a
prompt chunk run eagerly, and their kernels pick tile sizes and integer specialisations
from the token count and the longest query: the first step of a new kind would compile
(about 0.1-1 s a kernel) while every running request waits. One forward pass per kind,
without LoRA, with LoRA, and with LoRA and the per-row terms of DoRA and lora_bias adapters
(and, for steps with the shrink in the GEMM over a narrow slot span, with LoRA over such
spans), on scratch KV blocks, compiles them all before the first request.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.llama import AttentionMetadata, LlamaModel, LoRAStep
from multilora_studio.engine.model.lora_weights import LoRASlotWeights
from multilora_studio.engine.sampling.logprobs import score_rows
from multilora_studio.engine.sampling.sampler import make_generator, sample
from multilora_studio.engine.sampling.sampling_batch import SamplingBatch, SamplingRow
from multilora_studio.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from multilora_studio.kernels import fused_ops_cpu, lora_cpu, paged_attention_cpu
from multilora_studio.kernels.lora import LoRABatch, LoRAPlan

log = logging.getLogger(__name__)


def warmup_token_counts(max_tokens: int) -> list[int]:
    """2, 3, 4, 5, 8, 9, ... (each power of two and the count after it), up to ``max_tokens``.

    Powers of two cross every tile-size threshold of the kernels; the odd neighbour gives
    the integer specialisations of counts that are not multiples of 16.
    """
    counts = {max_tokens}
    power = 2
    while power <= max_tokens:
        counts.add(power)
        if power + 1 <= max_tokens:
            counts.add(power + 1)
        power *= 2
    return sorted(c for c in counts if c >= 2)


def prefill_lengths(tokens: int, max_model_len: int) -> list[int]:
    """``tokens`` prompt tokens as sequences of at most ``max_model_len``."""
    return [max_model_len] * (tokens // max_model_len) + (
        [tokens % max_model_len] if tokens % max_model_len else []
    )


def _metadata(
    lengths: list[int], block_size: int, num_blocks: int, device: torch.device
) -> AttentionMetadata | None:
    """Sequences of ``lengths`` prompt tokens on scratch blocks 0.., or None if they do not fit."""
    tables: list[list[int]] = []
    slots: list[int] = []
    next_block = 0
    for length in lengths:
        count = -(-length // block_size)
        table = list(range(next_block, next_block + count))
        next_block += count
        tables.append(table)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(length))
    if next_block > num_blocks:
        return None  # more than the KV cache holds: no step can have them either
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device
        ),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device),
        max_query_len=max(lengths),
    )


def warmup_steps(config: EngineConfig, decode_graphs: bool) -> list[list[int]]:
    """Sequence lengths of each warm-up step: prompt chunks of every token count, and
    decode steps of every batch size unless CUDA graphs run them (``decode_graphs``)."""
    steps = [
        prefill_lengths(t, config.max_model_len) for t in warmup_token_counts(config.max_num_batched_tokens)
    ]
    if not decode_graphs:
        steps += [[1] * n for n in [1, *warmup_token_counts(config.max_num_seqs)]]
    return steps


def narrow_slot_spans(plan: LoRAPlan, num_slots: int, max_rank: int) -> list[int]:
    """The slot spans (powers of two) over which steps above ``plan.bgmv_max_tokens`` tokens
    compute their shrink in the GEMM, one for each alignment of the rows it appends (once a
    span's rows are a multiple of 16, wider spans compile nothing new); none without it."""
    if not plan.shrink_in_gemm or max_rank < 1:
        return []
    spans, span = [], 1
    while span <= num_slots and plan.shrinks_in_gemm(plan.bgmv_max_tokens + 1, span * max_rank):
        spans.append(span)
        if span * max_rank % 16 == 0:
            break
        span *= 2
    return spans


@torch.inference_mode()
def warm_up_kernels(
    model: LlamaModel,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    lora: LoRASlotWeights,
    max_tokens: int,
    steps: list[list[int]],
) -> tuple[int, float]:
    """Run the eager forward once per step of ``steps`` (:func:`warmup_steps`) without LoRA,
    with LoRA, and with LoRA and every group's per-row terms (every token on slot 0; the LoRA
    metadata sized for ``max_tokens``, as the runner's is). Returns (forward passes, seconds).

    Writes only KV blocks that no sequence owns yet (the cache is empty at start-up) and
    leaves the LoRA slots, their per-row buffers and the step buffers as they were.
    """
    started = time.perf_counter()
    keys = kv_caches[0][0]  # [blocks, block_size, Hkv, D]
    num_blocks, block_size, device = keys.shape[0], keys.shape[1], keys.device
    batch = LoRABatch.allocate(max_tokens, lora.num_slots, device)
    groups = frozenset(lora.groups)
    kinds = (None, LoRAStep(batch, groups), LoRAStep(batch, groups, row_groups=groups))
    # steps above the token-major kernels over a narrow slot span: the shrink in the GEMM, whose
    # output rows are wider by the span's A rows (each span whose row stride aligns differently)
    narrow = tuple(
        LoRAStep(batch, groups, row_groups=rows, slot_span=span)
        for span in narrow_slot_spans(model.plan, lora.num_slots, lora.max_rank)
        for rows in (frozenset(), groups)
    )
    made_rows = not lora.row_scale  # (made for the warm-up, dropped after it)
    lora.ensure_row_buffers()
    passes = 0
    for lengths in steps:
        attn = _metadata(lengths, block_size, num_blocks, device)
        if attn is None:
            continue
        tokens = sum(lengths)
        input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        batch.update(torch.zeros(tokens, dtype=torch.int32, device=device), lora.slot_ranks)
        last_rows = torch.tensor(  # each sequence's last token: the rows a step samples
            [end - 1 for end in itertools.accumulate(lengths)], dtype=torch.int64, device=device
        )
        large = tokens > model.plan.bgmv_max_tokens
        for step_lora in (*kinds, *narrow) if large else kinds:
            hidden = model.forward(input_ids, positions, attn, kv_caches, step_lora)
            model.logits(hidden[last_rows])
            passes += 1
    if made_rows:
        lora.drop_row_buffers()
    warm_up_sampling(torch.zeros(1, model.spec.vocab_size, device=device), model.weights.lm_head.dtype)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    log.info("warmed the step kernels: %d forward passes in %.1f s", passes, seconds)
    return passes, seconds


def warm_up_sampling(logits: torch.Tensor, head_dtype: torch.dtype) -> None:
    """Sample once with temperature, top-k and top-p, and score the tokens with top-k
    log-probabilities, so the first such request does not load those CUDA kernels (sort, top-k,
    multinomial) or compile the scoring kernels while a batch waits: measured on the H200, that
    first load stalled every running request for 150-195 ms. Scoring runs on float32 logits
    (sampled rows) and on ``head_dtype`` logits (scored prompt rows, the LM head's output)."""
    rows = logits[:1].expand(2, -1).contiguous()  # [2, V]: one row per set of parameters
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=0), SamplingParams(seed=1)]
    batch = SamplingBatch([SamplingRow(p, make_generator(p, logits.device, 0), (), (), ()) for p in params])
    tokens = sample(rows, batch)
    score_rows(rows, tokens, MAX_LOGPROBS)
    score_rows(rows.to(head_dtype), tokens, MAX_LOGPROBS)


def compile_cpu_kernels(dtype: torch.dtype, batch_invariant: bool) -> None:
    """The CPU kernels compiled now (or Numba's cached build loaded), not in the first step: all
    of them for float32, the batch-invariant attention (float32 whatever the dtype) for others."""
    if dtype == torch.float32:
        lora_cpu.compile_now()
        fused_ops_cpu.compile_now()
        paged_attention_cpu.compile_now()
    elif batch_invariant:
        paged_attention_cpu.compile_now()
