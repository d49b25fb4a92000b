"""Paged KV cache bookkeeping: which physical blocks each sequence owns (no torch)."""

from __future__ import annotations

from multilora_studio.engine.batch.sequence import Sequence


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """A free list of KV blocks; sequences grow their block tables one block at a time."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def extra_blocks_for(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` still needs so that its first ``num_tokens`` tokens fit."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.extra_blocks_for(seq, num_tokens) <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give ``seq`` enough blocks for ``num_tokens`` tokens (caller checked ``can_grow``)."""
        extra = self.extra_blocks_for(seq, num_tokens)
        if extra > len(self._free):
            raise RuntimeError("KV cache exhausted; the scheduler should have preempted first")
        for _ in range(extra):
            seq.block_table.append(self._free.pop())

    def free(self, seq: Sequence) -> None:
        self._free.extend(reversed(seq.block_table))
        seq.block_table = []

    def slot_of(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (block * block_size + offset) of token ``position`` of ``seq``."""
        if not 0 <= position < len(seq.block_table) * self.block_size:
            raise IndexError(f"position {position} is outside the blocks of request {seq.request_id}")
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
