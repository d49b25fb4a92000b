"""A decode step's inputs built on the host and sent to the device in one copy.

The CUDA graphs of decode steps read their inputs from fixed device buffers. Filling
them with torch ops costs about 30 small launches a step (tokens, positions, cache slots,
block tables, sequence lengths, and the LoRA metadata's sort and search); here numpy
writes the same values into a pinned host mirror and one ``copy_`` sends them.

Device words (one int64 buffer; the int32 arrays reinterpret int64 words):
    input_ids    [B] int64
    positions    [B] int64
    slot_mapping [B] int64        flat cache slot per row, -1 = padding row
    seq_lens     [B] int32        0 = padding row
    lora         LoRABatch words  (``LoRABatch.storage_layout(B, num_slots)``)
    block_tables [B, W] int32     last, so a step copies only the rows it uses
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from multilora_studio.engine.scheduler import ScheduledChunk
from multilora_studio.engine.staging_words import StagingWords, round4
from multilora_studio.kernels.lora_batch import LoRABatch, fill_lora_metadata


@dataclass(frozen=True)
class StagedDecode:
    """A decode step whose inputs are in the staging buffers (copy already enqueued)."""

    num_tokens: int
    uses_lora: bool


class DecodeStaging:
    """Fixed device buffers for decode steps of up to ``max_batch`` rows, and their host mirror."""

    def __init__(
        self, max_batch: int, max_blocks_per_seq: int, num_slots: int, block_size: int, device: torch.device
    ) -> None:
        self.max_batch = max_batch
        self.width = max_blocks_per_seq
        self.num_slots = num_slots
        self.block_size = block_size
        self.device = device
        b, w = max_batch, max_blocks_per_seq
        lora_words = LoRABatch.storage_layout(b, num_slots)["total"][1]
        # int32 offsets inside the int32 region (16-byte aligned)
        self._lora_at = round4(b)
        self._tables_at = self._lora_at + round4(lora_words)
        self.words = StagingWords(3 * b, self._tables_at + b * w, device)

        dev64, dev32 = self.words.device64, self.words.device32
        self.input_ids = dev64[0:b]  # [B] int64
        self.positions = dev64[b : 2 * b]  # [B] int64
        self.slot_mapping = dev64[2 * b : 3 * b]  # [B] int64
        self.seq_lens = dev32[0:b]  # [B] int32
        self.lora_batch = LoRABatch.on_storage(
            dev32[self._lora_at : self._lora_at + lora_words], b, num_slots
        )
        self.block_tables = dev32[self._tables_at : self._tables_at + b * w].view(b, w)  # [B, W]
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=device)  # [B + 1]

        host, host32 = self.words.host64, self.words.host32
        self._h_input_ids = host[0:b]
        self._h_positions = host[b : 2 * b]
        self._h_slot_mapping = host[2 * b : 3 * b]
        self._h_seq_lens = host32[0:b]
        self._h_lora = host32[self._lora_at : self._lora_at + lora_words]
        self._h_tables = host32[self._tables_at : self._tables_at + b * w].reshape(b, w)
        self.clear()

    def clear(self) -> None:
        """Every row a padding row (no token, no cache write, no adapter); copied now."""
        self.words.wait_for_last_copy()
        self._h_input_ids[:] = 0
        self._h_positions[:] = 0
        self._h_slot_mapping[:] = -1
        self._h_seq_lens[:] = 0
        self._h_tables[:] = 0
        fill_lora_metadata(self._h_lora, self.max_batch, self.num_slots, [], [0] * self.num_slots)
        self._copy(self.max_batch)
        self.lora_batch.mark_filled(0)

    def accepts(self, chunks: Sequence[ScheduledChunk]) -> bool:
        """Whether the step is a decode step that fits: one sampled token per sequence."""
        return 0 < len(chunks) <= self.max_batch and all(c.num_tokens == 1 and c.completes for c in chunks)

    def stage(
        self,
        chunks: Sequence[ScheduledChunk],
        slot_of: dict[str | None, int],
        slot_ranks: Sequence[int],
    ) -> StagedDecode:
        """Write the step's rows (then padding rows) and enqueue their copy to the device.

        ``slot_of`` maps each chunk's adapter to its GPU slot (None -> -1); ``slot_ranks``
        is the rank held in each slot (the host view of the slot table).
        """
        self.words.wait_for_last_copy()
        n, bs, width = len(chunks), self.block_size, self.width
        slots = [0] * n
        for i, chunk in enumerate(chunks):
            seq, position = chunk.seq, chunk.start
            table = seq.block_table
            self._h_input_ids[i] = seq.token_at(position)
            self._h_positions[i] = position
            self._h_slot_mapping[i] = table[position // bs] * bs + position % bs
            self._h_seq_lens[i] = position + 1
            if len(table) > width:
                raise ValueError(f"request {seq.request_id} has {len(table)} KV blocks, more than {width}")
            self._h_tables[i, : len(table)] = table
            slots[i] = slot_of.get(seq.adapter, -1)
        self._h_slot_mapping[n:] = -1
        self._h_seq_lens[n:] = 0
        uses_lora = any(s >= 0 for s in slots)
        if uses_lora:
            fill_lora_metadata(self._h_lora, self.max_batch, self.num_slots, slots, slot_ranks)
        self._copy(n)
        if uses_lora:
            self.lora_batch.mark_filled(n)
        return StagedDecode(n, uses_lora)

    def _copy(self, rows: int) -> None:
        """Send every word up to the end of block-table row ``rows`` (padding rows need none)."""
        self.words.send(self._tables_at + rows * self.width)
