"""Per-row logits processors of one step: bans, logit_bias and penalties, as sparse updates.

Order (vLLM v1's): bad words, min_tokens and logit_bias are added first (bans as -inf), then
repetition_penalty, then frequency and presence penalties. Temperature, min_p, top-k and
top-p follow in the sampler (engine/sampling/sampler.py). The host (numpy, O(history)) lists the
(row, token) pairs each processor touches: the additive entries, and for a penalised row the
unique tokens of its prompt and output with their output counts. The device gathers those
pairs, applies the formulas and writes them back: O(pairs) work, never a dense [R, V] temporary;
nothing waits for the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch

from multilora_studio.engine.sampling.sampling_batch import SamplingBatch
from multilora_studio.engine.sampling_params import SamplingParams


def _penalised(p: SamplingParams) -> bool:
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def _additive(p: SamplingParams, generated: int) -> bool:
    return bool(p.logit_bias) or bool(p.bad_words_token_ids) or generated < p.min_tokens


def needs_processing(batch: SamplingBatch) -> bool:
    """Whether any row of the step uses a processor (else ``apply_processors`` is the identity)."""
    return any(_penalised(r.params) or _additive(r.params, len(r.output_token_ids)) for r in batch.rows)


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


class _PromptTokens:
    """The unique tokens of each prompt, computed once per request (a prompt never changes).

    Keyed by the prompt list's identity; the entry keeps the list alive, so an id is not reused
    while it is cached. The oldest entries go once ``capacity`` prompts are cached.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.entries: dict[int, tuple[Sequence[int], np.ndarray]] = {}

    def unique(self, prompt: Sequence[int]) -> np.ndarray:
        entry = self.entries.get(id(prompt))
        if entry is not None and entry[0] is prompt:
            return entry[1]
        tokens = np.unique(np.asarray(prompt, dtype=np.int64))  # [P'] sorted
        if len(self.entries) >= self.capacity:
            del self.entries[next(iter(self.entries))]
        self.entries[id(prompt)] = (prompt, tokens)
        return tokens


_prompt_tokens = _PromptTokens()


def _penalty_pairs(batch: SamplingBatch, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The penalised rows' (row, token) pairs [M] (unique), their repetition penalties [M] and the
    values subtracted from them [M]: ``frequency * count + presence * (count > 0)``, counts over
    the output. A row's prompt tokens are touched (count 0) only when its repetition penalty is on."""
    params = [r.params for r in batch.rows]
    rows = [row for row, p in enumerate(params) if _penalised(p)]
    outputs = [batch.rows[row].output_token_ids for row in rows]
    lengths = np.fromiter((len(out) for out in outputs), dtype=np.int64, count=len(rows))  # [R]
    out_tokens = np.fromiter(chain.from_iterable(outputs), dtype=np.int64, count=int(lengths.sum()))
    out_keys = (
        np.repeat(np.asarray(rows, dtype=np.int64) * vocab, lengths) + out_tokens
    )  # [Lo]: row * V + token
    repeating = [row for row in rows if params[row].repetition_penalty != 1.0]
    prompts = [_prompt_tokens.unique(batch.rows[row].prompt_token_ids) for row in repeating]
    prompt_rows = np.repeat(np.asarray(repeating, dtype=np.int64) * vocab, [len(t) for t in prompts])
    prompt_keys = prompt_rows + np.concatenate(prompts) if prompts else prompt_rows  # [Lp]
    keys, inverse = np.unique(np.concatenate([out_keys, prompt_keys]), return_inverse=True)  # [M], [Lo + Lp]
    counts = np.bincount(inverse[: len(out_keys)], minlength=len(keys))  # [M]
    pair_rows = keys // vocab  # [M]
    table = np.array(
        [(p.repetition_penalty, p.frequency_penalty, p.presence_penalty) for p in params], dtype=np.float64
    )  # [N, 3]
    repetition, frequency, presence = table[pair_rows].T  # [M] each
    pairs = np.stack([pair_rows, keys % vocab])  # [2, M]: rows, tokens
    return pairs, repetition, frequency * counts + presence * (counts > 0)


def apply_processors(logits: torch.Tensor, batch: SamplingBatch, *, in_place: bool = False) -> torch.Tensor:
    """``logits`` [N, V] float32 with the processors of each of ``batch``'s rows applied (its EOS
    tokens are banned before its ``min_tokens``).

    By default the result is a new tensor and ``logits`` stays as it was (the caller scores
    log-probabilities from it). With ``in_place`` the caller gives up ``logits``: it is updated
    and returned, with no [N, V] copy. Returns ``logits`` itself, untouched, when no row uses
    any processor.
    """
    if not needs_processing(batch):
        return logits
    device = logits.device
    # additive entries (row, token, value): bans (-inf) and logit_bias
    add_rows: list[int] = []
    add_tokens: list[int] = []
    add_values: list[float] = []
    for row, r in enumerate(batch.rows):
        p, output = r.params, r.output_token_ids
        if not _additive(p, len(output)):
            continue
        for token in banned_tokens(p, output, r.eos_token_ids):
            add_rows.append(row)
            add_tokens.append(token)
            add_values.append(float("-inf"))
        for token, bias in p.logit_bias.items():
            add_rows.append(row)
            add_tokens.append(token)
            add_values.append(bias)
    # penalty pairs (row, token): unique, so one index_put without accumulate
    pairs, repetition, subtract = _penalty_pairs(batch, logits.shape[-1])  # [2, M], [M], [M]
    entries, count = len(add_rows), pairs.shape[1]
    # one host buffer per dtype, one non-blocking copy each
    ints = np.concatenate([np.asarray(add_rows + add_tokens, dtype=np.int64), pairs.reshape(-1)])
    floats = np.concatenate([np.asarray(add_values, dtype=np.float64), repetition, subtract]).astype(
        np.float32
    )
    ints_device = _to_device(torch.from_numpy(ints), device)  # [2E + 2M]
    floats_device = _to_device(torch.from_numpy(floats), device)  # [E + 2M]
    result = logits if in_place else logits.clone()  # [N, V]
    if entries:
        index = (ints_device[:entries], ints_device[entries : 2 * entries])
        result.index_put_(index, floats_device[:entries], accumulate=True)
    if count:
        pair_index = ints_device[2 * entries :].view(2, count)  # [2, M]: rows, tokens
        penalty, minus = floats_device[entries:].view(2, count)  # [M] each
        chosen = result[pair_index[0], pair_index[1]]  # [M]
        scaled = torch.where(chosen > 0, chosen / penalty, chosen * penalty)  # [M]
        result.index_put_((pair_index[0], pair_index[1]), scaled - minus)
    return result


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``, copied without blocking (from pinned memory on CUDA)."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
