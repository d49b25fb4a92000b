"""Which KV blocks hold a known prefix: full blocks keyed by a hash chain of their tokens and of
what made their KV (no torch).

A block's key is ``blake2b(previous block's key, its salt, its tokens)``: equal keys mean the
same tokens after the same prefix, computed with the same base, adapter weights and strength
(the sequence's salts, ``Sequence.block_salt``). Blocks stay indexed after their last user
frees them and are evicted least recently freed first, only when a block is needed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from multilora_studio.engine.batch.sequence import Sequence

KEY_BYTES = 16  # 128-bit block keys: a collision between two prefixes is not a practical risk


def kv_salt(*parts: object) -> bytes:
    """A salt from what makes KV what it is (digests, versions, strengths), in a fixed order."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=KEY_BYTES).digest()


def extend_block_keys(seq: Sequence, block_size: int, num_blocks: int) -> list[bytes]:
    """``seq.block_keys``, extended to its first ``num_blocks`` full blocks of known tokens."""
    keys = seq.block_keys
    while len(keys) < num_blocks:
        index = len(keys)
        tokens = array("q", seq.token_slice(index * block_size, (index + 1) * block_size))
        digest = hashlib.blake2b(digest_size=KEY_BYTES)
        digest.update(keys[-1] if keys else b"")
        digest.update(seq.block_salt(index, block_size))
        digest.update(tokens.tobytes())
        keys.append(digest.digest())
    return keys


@dataclass
class PrefixCacheCounters:
    """Prompt tokens looked up and found since the engine started (as vLLM counts them)."""

    queried_tokens: int = 0
    hit_tokens: int = 0


class PrefixCache:
    """Key -> block for full computed blocks; the unused ones in least-recently-freed order."""

    def __init__(self) -> None:
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._owner_of: dict[int, int] = {}  # the adapter version whose weights made a block's KV
        self.unused: OrderedDict[int, None] = OrderedDict()  # indexed, no sequence holds them
        self._computing: dict[bytes, int] = {}  # keys running sequences will index, and how many
        self.counters = PrefixCacheCounters()

    @property
    def num_blocks(self) -> int:
        """Blocks indexed, in use or not."""
        return len(self._key_of)

    def holds(self, block: int) -> bool:
        return block in self._key_of

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The blocks of the longest indexed prefix of ``keys``."""
        found = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def computing(self, key: bytes) -> bool:
        """Whether a running sequence is computing ``key``'s block now."""
        return key in self._computing

    def plan(self, keys: list[bytes]) -> None:
        """A sequence was admitted to compute these blocks."""
        for key in keys:
            self._computing[key] = self._computing.get(key, 0) + 1

    def unplan(self, keys: list[bytes]) -> None:
        """A sequence computed these blocks, or will not (it ended or was preempted)."""
        for key in keys:
            left = self._computing[key] - 1
            if left:
                self._computing[key] = left
            else:
                del self._computing[key]

    def index(self, key: bytes, owner: int | None, block: int) -> None:
        """``block`` now holds ``key``'s KV, made with adapter version ``owner`` (None: the base alone);
        a key another block holds already keeps that one."""
        if key not in self._block_of and block not in self._key_of:
            self._block_of[key] = block
            self._key_of[block] = key
            if owner is not None:
                self._owner_of[block] = owner

    def forget(self, block: int) -> None:
        """``block`` is about to hold other KV: take it out of the index."""
        key = self._key_of.pop(block)
        del self._block_of[key]
        self._owner_of.pop(block, None)
        self.unused.pop(block, None)

    def blocks_of(self, owner: int) -> list[int]:
        """The indexed blocks whose KV adapter version ``owner`` made."""
        return [block for block, made_by in self._owner_of.items() if made_by == owner]
