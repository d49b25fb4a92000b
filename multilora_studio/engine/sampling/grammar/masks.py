"""Token masks of a step's constrained rows: filled on the host, one copy to the device, applied there.

The host buffer is flat int32: the rows' bitmasks ([R, W], one bit per token of the tokenizer's
vocabulary, W = ceil(vocab / 32)) followed by the rows' indices among the step's sampling rows
([R]), so a single non-blocking copy carries both. Only rows with a grammar are in it; a step
without one builds nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import llguidance.numpy
import torch

MASK_THREADS = 8  # at most this many host threads compute a step's masks


@dataclass(frozen=True)
class DeviceMasks:
    """A step's masks on the device."""

    words: torch.Tensor  # [R, W] int32: bit t % 32 of word t // 32 set = token t allowed
    rows: torch.Tensor  # [R] int64: the sampling rows they belong to
    shifts: torch.Tensor  # [32] int32: 0..31


class TokenMasks:
    """The reusable host (pinned on CUDA) and device buffers of a step's masks."""

    def __init__(self, vocab_size: int, max_rows: int, device: torch.device) -> None:
        self.words = -(-vocab_size // 32)
        size = max_rows * (self.words + 1)
        pinned = device.type == "cuda"
        self._host = torch.zeros(size, dtype=torch.int32, pin_memory=pinned)
        self._device = torch.empty(size, dtype=torch.int32, device=device) if pinned else self._host
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        threads = max(1, min(MASK_THREADS, (os.cpu_count() or 1) // 2))
        self._executor = llguidance.LLExecutor(threads)

    def fill(self, rows: Sequence[tuple[int, llguidance.LLMatcher]]) -> DeviceMasks:
        """Compute each (sampling row, matcher)'s mask and start its copy to the device (no wait).

        The host buffer is reused: the previous step's copy has finished, since every step
        waits for its sampled tokens.
        """
        count, width = len(rows), self.words
        masks = self._host[: count * width].view(count, width)  # [R, W]
        llguidance.numpy.fill_next_token_bitmask_par(
            self._executor, [(matcher, i) for i, (_, matcher) in enumerate(rows)], masks.numpy()
        )
        self._host[count * width : count * (width + 1)] = torch.tensor([row for row, _ in rows])
        used = count * (width + 1)
        staged = self._device[:used]
        if staged.data_ptr() != self._host.data_ptr():
            staged.copy_(self._host[:used], non_blocking=True)
        return DeviceMasks(
            staged[: count * width].view(count, width), staged[count * width :].long(), self._shifts
        )


def apply_token_masks(logits: torch.Tensor, masks: DeviceMasks) -> torch.Tensor:
    """``logits`` [N, V] with every token a row's mask forbids at -inf (a new tensor: the raw
    logits stay for the log-probabilities). Columns past the mask's vocabulary (padding rows of
    the model's output embedding) are forbidden too."""
    count, width = masks.words.shape
    vocab = logits.shape[1]
    allowed = ((masks.words.unsqueeze(-1) >> masks.shifts) & 1).view(count, width * 32)  # [R, 32W]
    if width * 32 >= vocab:
        allowed = allowed[:, :vocab]
    else:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - width * 32))  # [R, V]
    rows = logits.index_select(0, masks.rows).masked_fill_(allowed == 0, float("-inf"))  # [R, V]
    return logits.index_copy(0, masks.rows, rows)
