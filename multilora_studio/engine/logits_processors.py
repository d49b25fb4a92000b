"""Per-row logits processors of one step: bans, logit_bias and penalties, vectorised on the device.

Order (vLLM v1's): bad words, min_tokens and logit_bias are added first (bans as -inf), then
repetition_penalty, then frequency and presence penalties. Temperature, min_p, top-k and
top-p follow in the sampler (engine/sampler.py). The host builds small padded index tensors
(O(history)); the device does O(rows x V) elementwise work; nothing waits for the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multilora_studio.engine.config import SamplingParams

History = tuple[Sequence[int], Sequence[int]]  # (prompt token ids, output token ids) of one row


def _penalised(p: SamplingParams) -> bool:
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def _additive(p: SamplingParams, generated: int) -> bool:
    return bool(p.logit_bias) or bool(p.bad_words_token_ids) or generated < p.min_tokens


def needs_processing(params: Sequence[SamplingParams], histories: Sequence[History]) -> bool:
    """Whether any row of the step uses a processor (else ``apply_processors`` is the identity)."""
    return any(_penalised(p) or _additive(p, len(out)) for p, (_, out) in zip(params, histories, strict=True))


def banned_tokens(p: SamplingParams, output: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
    """Tokens of one row set to -inf this step: completed bad words, and stops before min_tokens."""
    banned = []
    for word in p.bad_words_token_ids:
        prefix = len(word) - 1
        if prefix == 0 or (prefix <= len(output) and list(output[len(output) - prefix :]) == list(word[:-1])):
            banned.append(word[-1])
    if len(output) < p.min_tokens:
        banned.extend(p.stop_token_ids)
        if not p.ignore_eos:
            banned.extend(eos_token_ids)
    return banned


def _padded(lists: list[Sequence[int]], pad: int) -> list[int]:
    width = max((len(ids) for ids in lists), default=0) or 1
    return [t for ids in lists for t in (*ids, *[pad] * (width - len(ids)))]


def apply_processors(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[History],
    eos_token_ids: Sequence[int],
) -> torch.Tensor:
    """``logits`` [N, V] float32 with every row's processors applied (a new tensor; the input stays).

    Returns ``logits`` itself, untouched, when no row uses any processor.
    """
    if not needs_processing(params, histories):
        return logits
    vocab = logits.shape[-1]
    device = logits.device
    # additive entries (row, token, value): bans (-inf) and logit_bias
    add_rows: list[int] = []
    add_tokens: list[int] = []
    add_values: list[float] = []
    for row, (p, (_, output)) in enumerate(zip(params, histories, strict=True)):
        if not _additive(p, len(output)):
            continue
        for token in banned_tokens(p, output, eos_token_ids):
            add_rows.append(row)
            add_tokens.append(token)
            add_values.append(float("-inf"))
        for token, bias in p.logit_bias.items():
            add_rows.append(row)
            add_tokens.append(token)
            add_values.append(bias)
    pen_rows = [row for row, p in enumerate(params) if _penalised(p)]
    repetition = any(params[row].repetition_penalty != 1.0 for row in pen_rows)
    outputs = [histories[row][1] for row in pen_rows]
    prompts = [histories[row][0] for row in pen_rows] if repetition else []
    out_flat, prompt_flat = _padded(outputs, vocab), _padded(prompts, vocab) if repetition else []
    # one host buffer per dtype, one non-blocking copy each
    ints = torch.tensor([*add_rows, *add_tokens, *pen_rows, *out_flat, *prompt_flat], dtype=torch.int64)
    floats = torch.tensor(
        [
            *add_values,
            *(params[r].repetition_penalty for r in pen_rows),
            *(params[r].frequency_penalty for r in pen_rows),
            *(params[r].presence_penalty for r in pen_rows),
        ],
        dtype=torch.float32,
    )
    ints = ints.to(device, non_blocking=True)
    floats = floats.to(device, non_blocking=True)
    entries, rows = len(add_rows), len(pen_rows)
    result = logits.clone()  # [N, V]
    if entries:
        index = (ints[:entries], ints[entries : 2 * entries])
        result.index_put_(index, floats[:entries], accumulate=True)
    if rows:
        start = 2 * entries
        row_index = ints[start : start + rows]  # [R]
        start += rows
        out_ids = ints[start : start + len(out_flat)].view(rows, -1)  # [R, Lo], padded with V
        start += len(out_flat)
        repetition_penalty, frequency, presence = floats[entries:].view(3, rows, 1)  # [R, 1] each
        counts = torch.zeros(rows, vocab + 1, dtype=torch.float32, device=device)  # [R, V + 1]
        counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=torch.float32))
        counts = counts[:, :vocab]  # [R, V]: the padding column dropped
        chosen = result[row_index]  # [R, V]
        if repetition:
            prompt_ids = ints[start:].view(rows, -1)  # [R, Lp], padded with V
            seen = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=device)  # [R, V + 1]
            seen.scatter_(1, prompt_ids, True)
            seen = seen[:, :vocab] | (counts > 0)  # [R, V]
            scaled = torch.where(chosen > 0, chosen / repetition_penalty, chosen * repetition_penalty)
            chosen = torch.where(seen, scaled, chosen)
        chosen = chosen - frequency * counts - presence * (counts > 0).float()
        result[row_index] = chosen
    return result
