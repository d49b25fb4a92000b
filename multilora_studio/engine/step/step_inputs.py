"""A step's inputs for an eager forward pass, built on the host from the scheduler's plan and
copied to the device without waiting: tokens, positions, cache slots, the LoRA batch's slots and
strengths, the rows that sample or score, and the rows of adapters with token tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.model.llama import AttentionMetadata
from multilora_studio.engine.model.lora_weights import LoRASlotWeights
from multilora_studio.engine.model.token_tables import TokenTablePool, TokenTableStep, VocabRows
from multilora_studio.engine.sampling.logprobs import ScoredRows


@dataclass(frozen=True)
class PromptScoring:
    """Prompt positions of one step whose next token is scored (``SamplingParams.prompt_logprobs``)."""

    rows: torch.Tensor  # [R] int64: rows of the step's hidden states
    targets: torch.Tensor  # [R] int64: the prompt token after each row's position
    top_k: int  # the most alternatives any of the rows asks for
    groups: list[tuple[Sequence, int, int]]  # (sequence, its first scored position, positions), in row order

    def split(self, scores: ScoredRows) -> list[tuple[Sequence, int, ScoredRows]]:
        """The rows' scores (host) by sequence: (sequence, first scored position, its rows)."""
        result = []
        begin = 0
        for seq, first, count in self.groups:
            result.append((seq, first, scores.rows(slice(begin, begin + count))))
            begin += count
        return result


@dataclass
class StepInputs:
    """Host-built tensors of one step (already on the device)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    slot_ids: torch.Tensor  # [T] int32, -1 = base model
    # [T] float32 adapter strength per token; None when every token's is 1.0 (costs nothing)
    token_scales: torch.Tensor | None
    logits_rows: torch.Tensor  # [N] int64: rows of the hidden states to sample from
    lora_groups: frozenset[str]
    scoring: PromptScoring | None = None
    row_groups: frozenset[str] = frozenset()  # groups with DoRA / lora_bias rows (LoRAStep)
    tokens: TokenTableStep | None = None  # the adapters with token tables, and their rows
    slot_span: int = 0  # the leading slots whose A rows the shrink in GEMM multiplies (LoRAStep)


def _on_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, copied without waiting."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def eager_inputs(
    plan: StepPlan,
    blocks: BlockManager,
    slot_of: dict[str | None, int],
    lora: LoRASlotWeights,
    device: torch.device,
    token_tables: TokenTableStep | None,
    slot_span: int,
) -> StepInputs:
    """Flatten the plan's chunks into the step's token, position and cache-slot arrays."""
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    slot_ids: list[int] = []
    token_scales: list[float] = []
    scaled = False  # whether some token's adapter strength is not 1.0
    seq_lens: list[int] = []
    query_start = [0]
    block_tables: list[list[int]] = []
    logits_rows: list[int] = []
    groups: set[str] = set()
    row_groups: set[str] = set()
    score_rows: list[int] = []
    score_targets: list[int] = []
    score_groups: list[tuple[Sequence, int, int]] = []
    for chunk in plan.chunks:
        seq = chunk.seq
        end = chunk.start + chunk.num_tokens
        input_ids.extend(seq.token_slice(chunk.start, end))
        span = range(chunk.start, end)
        positions.extend(span)
        slot_mapping.extend(blocks.slot_of(seq, p) for p in span)
        slot = slot_of.get(seq.adapter, -1)
        base = seq.base_prefix(chunk.start, end) if slot >= 0 else chunk.num_tokens  # before aLoRA's start
        adapted = chunk.num_tokens - base
        slot_ids.extend([-1] * base + [slot] * adapted)
        strength = seq.params.adapter_scale if adapted else 1.0
        token_scales.extend([1.0] * base + [strength] * adapted)
        scaled = scaled or strength != 1.0
        if adapted:
            groups |= lora.slot_groups[slot]
            row_groups |= lora.slot_row_groups[slot]
        seq_lens.append(end)
        scored = seq.prompt_positions_to_score(chunk.start, end)
        if scored:
            score_rows.extend(query_start[-1] + p - chunk.start for p in scored)
            score_targets.extend(seq.prompt_token_ids[scored.start + 1 : scored.stop + 1])
            score_groups.append((seq, scored.start, len(scored)))
        query_start.append(query_start[-1] + chunk.num_tokens)
        block_tables.append(seq.block_table)
        if chunk.completes:
            logits_rows.append(query_start[-1] - 1)
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    attn = AttentionMetadata(
        slot_mapping=_on_device(slot_mapping, torch.int64, device),
        block_tables=_on_device(padded, torch.int32, device),
        seq_lens=_on_device(seq_lens, torch.int32, device),
        query_start_loc=_on_device(query_start, torch.int32, device),
        max_query_len=max(chunk.num_tokens for chunk in plan.chunks),
    )
    scoring = None
    if score_groups:
        scoring = PromptScoring(
            rows=_on_device(score_rows, torch.int64, device),
            targets=_on_device(score_targets, torch.int64, device),
            top_k=max(seq.params.prompt_logprobs or 0 for seq, _, _ in score_groups),
            groups=score_groups,
        )
    return StepInputs(
        input_ids=_on_device(input_ids, torch.int64, device),
        positions=_on_device(positions, torch.int64, device),
        attn=attn,
        slot_ids=_on_device(slot_ids, torch.int32, device),
        token_scales=_on_device(token_scales, torch.float32, device) if scaled else None,
        logits_rows=_on_device(logits_rows, torch.int64, device),
        lora_groups=frozenset(groups),
        scoring=scoring,
        row_groups=frozenset(row_groups),
        tokens=token_tables,
        slot_span=slot_span,
    )


def token_table_step(
    plan: StepPlan,
    slot_of: dict[str | None, int],
    pool: TokenTablePool,
    vocab_size: int,
    device: torch.device,
) -> TokenTableStep:
    """What the step's adapters with token tables need: for the tokens (embedding), the
    sampled rows and the scored prompt rows (logits), the rows of each whole matrix and
    every row's slot for the retrained-row swaps."""
    slots: dict[str, list[int]] = {"embed": [], "head": [], "scored": []}  # each row's slot
    whole: dict[str, dict[int, list[int]]] = {"embed": {}, "head": {}, "scored": {}}  # slot -> rows
    for chunk in plan.chunks:
        seq, slot = chunk.seq, slot_of.get(chunk.seq.adapter, -1)
        scored = len(seq.prompt_positions_to_score(chunk.start, chunk.start + chunk.num_tokens))
        rows = {
            "embed": range(len(slots["embed"]), len(slots["embed"]) + chunk.num_tokens),
            "head": range(len(slots["head"]), len(slots["head"]) + int(chunk.completes)),
            "scored": range(len(slots["scored"]), len(slots["scored"]) + scored),
        }
        for key, span in rows.items():
            slots[key].extend([slot] * len(span))
            if pool.whole("embed" if key == "embed" else "head", slot) is not None:
                whole[key].setdefault(slot, []).extend(span)
    used = [pool.tables[s] for s in {*slots["embed"]} if s in pool.tables]

    def rows_of(key: str) -> VocabRows:
        side = "embed" if key == "embed" else "head"
        swaps = pool.embed_swaps if side == "embed" else pool.head_swaps
        has_swaps = any(getattr(t, f"{side}_ids") is not None for t in used)
        matrices = []
        for slot, rows in whole[key].items():
            matrix = pool.whole(side, slot)
            assert matrix is not None  # rows are listed only for slots with the matrix
            matrices.append((_on_device(rows, torch.int64, device), matrix))
        return VocabRows(matrices, _on_device(slots[key], torch.int32, device), swaps if has_swaps else None)

    width = max(vocab_size, *(t.vocab_size for t in used))
    return TokenTableStep(width, rows_of("embed"), rows_of("head"), rows_of("scored"))
