"""One device buffer of step inputs, its pinned host mirror, and the copy between them.

The staged steps (``step_staging``) lay their arrays out as int64 words
followed by int32 words in one buffer, so that numpy fills the host mirror and one
``copy_`` sends a whole step. The host mirror is rewritten only after the device has read
the previous copy.
"""

from __future__ import annotations

import numpy as np
import torch


def round4(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (int32 arrays start on 16-byte boundaries)."""
    return -(-n // 4) * 4


class StagingWords:
    """``int64_words`` int64 words, then ``int32_words`` int32 words, on the device and pinned on the host."""

    def __init__(self, int64_words: int, int32_words: int, device: torch.device) -> None:
        self.int64_words = int64_words
        total64 = int64_words + -(-int32_words // 2)
        self.device_words = torch.zeros(total64, dtype=torch.int64, device=device)
        self.host_words = torch.zeros(total64, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.device64 = self.device_words[:int64_words]  # [int64_words] int64
        self.device32 = self.device_words[int64_words:].view(torch.int32)  # [>= int32_words] int32
        self.host64: np.ndarray = self.host_words[:int64_words].numpy()
        self.host32: np.ndarray = self.host_words[int64_words:].view(torch.int32).numpy()
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def send(self, int32_end: int) -> None:
        """Enqueue the copy of every int64 word and the int32 words before ``int32_end``."""
        end64 = self.int64_words + -(-int32_end // 2)
        self.device_words[:end64].copy_(self.host_words[:end64], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def wait_for_last_copy(self) -> None:
        """Block until the device has read the last copy (the host mirror may then change)."""
        if self._copied is not None:
            self._copied.synchronize()
