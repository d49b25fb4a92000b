"""Paged KV cache bookkeeping: which physical blocks each sequence holds, and which full blocks
the prefix cache can hand to the next sequence with the same prefix (no torch)."""

from __future__ import annotations

from multilora_studio.engine.batch.prefix_cache import PrefixCache, extend_block_keys
from multilora_studio.engine.batch.sequence import Sequence


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """Reference-counted KV blocks; sequences grow their block tables one block at a time.

    With ``prefix_caching``, a block filled by computed tokens is indexed by its key
    (``prefix_cache.py``); when its last sequence frees it, it keeps its KV until a block is
    needed and none is empty, and a sequence admitted with the same prefix takes it instead
    of computing it again. A shared block is never written: a sequence writes only past its
    computed tokens, and a hit covers whole blocks before them.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))  # blocks that hold nothing indexed
        self._users = [0] * num_blocks  # sequences holding each block
        self.cache = PrefixCache() if prefix_caching else None

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (empty, or kept for the prefix cache until needed)."""
        return len(self._empty) + (len(self.cache.unused) if self.cache is not None else 0)

    def users_of(self, block: int) -> int:
        """How many sequences hold ``block`` (more than one only for a shared cached prefix)."""
        return self._users[block]

    def extra_blocks_for(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` still needs so that its first ``num_tokens`` tokens fit."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.extra_blocks_for(seq, num_tokens) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give ``seq`` enough blocks for ``num_tokens`` tokens (caller checked ``can_grow``)."""
        extra = self.extra_blocks_for(seq, num_tokens)
        if extra > self.num_free:
            raise RuntimeError("KV cache exhausted; the scheduler should have preempted first")
        for _ in range(extra):
            seq.block_table.append(self._take_free())

    def _take_free(self) -> int:
        """An empty block, else the least recently freed cached one (dropped from the index)."""
        if self._empty:
            block = self._empty.pop()
        else:
            assert self.cache is not None
            block = next(iter(self.cache.unused))
            self.cache.forget(block)
        self._users[block] = 1
        return block

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; its last blocks are the first to be evicted."""
        if self.cache is not None and seq.num_planned_blocks > seq.num_indexed_blocks:
            self.cache.unplan(seq.block_keys[seq.num_indexed_blocks : seq.num_planned_blocks])
        seq.num_planned_blocks = 0
        for block in reversed(seq.block_table):
            self._users[block] -= 1
            if self._users[block] == 0:
                if self.cache is not None and self.cache.holds(block):
                    self.cache.unused[block] = None
                else:
                    self._empty.append(block)
        seq.block_table = []
        seq.num_indexed_blocks = 0

    def slot_of(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (block * block_size + offset) of token ``position`` of ``seq``."""
        if not 0 <= position < len(seq.block_table) * self.block_size:
            raise IndexError(f"position {position} is outside the blocks of request {seq.request_id}")
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    # ---------------------------------------------------------------- the prefix cache

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks of ``seq``'s longest known prefix (none once it has blocks)."""
        if self.cache is None or seq.block_table:
            return []
        usable = seq.max_cached_tokens // self.block_size
        return self.cache.lookup(extend_block_keys(seq, self.block_size, usable)[:usable])

    def waits_for_prefix(self, seq: Sequence, prefix: list[int]) -> bool:
        """Whether a running sequence is computing the block of ``seq``'s prompt after its cached
        ``prefix``: admitted a step later, ``seq`` finds that block cached instead of computing it
        too (requests sent together with one context, such as the choices of a question)."""
        if self.cache is None or seq.block_table:
            return False
        usable = seq.max_cached_tokens // self.block_size
        return len(prefix) < usable and self.cache.computing(seq.block_keys[len(prefix)])

    def can_take(self, prefix: list[int], num_tokens: int) -> bool:
        """Whether a sequence can hold ``prefix`` and blocks for its first ``num_tokens`` tokens."""
        reclaimed = sum(1 for block in prefix if self._users[block] == 0)  # leave the free pool
        extra = max(0, blocks_needed(num_tokens, self.block_size) - len(prefix))
        return extra + reclaimed <= self.num_free

    def take(self, seq: Sequence, prefix: list[int], num_tokens: int) -> None:
        """Give ``seq`` the cached ``prefix`` (its tokens count as computed) and blocks for its first
        ``num_tokens`` tokens (caller checked ``can_take``)."""
        for block in prefix:
            if self._users[block] == 0:
                assert self.cache is not None
                del self.cache.unused[block]
            self._users[block] += 1
        seq.block_table = list(prefix)
        seq.num_indexed_blocks = len(prefix)
        seq.num_computed_tokens = len(prefix) * self.block_size
        if self.cache is not None:
            self.cache.counters.queried_tokens += len(seq.prompt_token_ids)
            self.cache.counters.hit_tokens += seq.num_computed_tokens
            usable = seq.max_cached_tokens // self.block_size  # the blocks others could reuse
            self.cache.plan(extend_block_keys(seq, self.block_size, usable)[len(prefix) : usable])
            seq.num_planned_blocks = max(usable, len(prefix))
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = seq.num_computed_tokens
        self.grow(seq, num_tokens)

    def index_computed(self, seq: Sequence) -> None:
        """Index the blocks ``seq``'s computed tokens have filled (after the step that wrote them)."""
        full = seq.num_computed_tokens // self.block_size
        if self.cache is None or full <= seq.num_indexed_blocks:
            return
        keys = extend_block_keys(seq, self.block_size, full)
        for index in range(seq.num_indexed_blocks, full):
            self.cache.index(keys[index], seq.block_owner(index, self.block_size), seq.block_table[index])
        self.cache.unplan(keys[seq.num_indexed_blocks : min(full, seq.num_planned_blocks)])
        seq.num_indexed_blocks = full

    def drop_cached(self, adapter_version: int) -> int:
        """Take the blocks an adapter's weights made out of the cache (it was removed or replaced);
        blocks running sequences still hold stay theirs. Returns how many were dropped."""
        if self.cache is None:
            return 0
        dropped = self.cache.blocks_of(adapter_version)
        for block in dropped:
            self.cache.forget(block)
            if self._users[block] == 0:
                self._empty.append(block)
        return len(dropped)
