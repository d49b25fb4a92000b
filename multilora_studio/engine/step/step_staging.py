"""A step's inputs built on the host and sent to the device in one copy, for the CUDA graphs.

The captured graphs read their inputs from fixed device buffers. Filling them with torch
ops costs about 30 small launches a step (tokens, positions, cache slots, block tables,
sequence lengths, and the LoRA metadata's sort and search); here numpy writes the same
values into a pinned host mirror and one ``copy_`` sends them.

A staging holds steps of up to ``max_tokens`` tokens over up to ``max_seqs`` sequences.
Tokens past the step's count are padding (no cache write, no adapter); sequences past its
count are padding too (length 0, so nothing attends to them). A decode staging
(``one_token_per_seq``, ``max_tokens == max_seqs``) takes only steps of one sampled token a
sequence, and each padding sequence owns the padding token of its row: its
``query_start_loc`` and ``logits_rows`` are always ``0, 1, 2, ...`` (written once). Otherwise
padding sequences own no token: padding tokens come after ``query_start_loc[-1]``.

Device words (one int64 buffer; the int32 arrays reinterpret int64 words):
    input_ids       [T] int64
    positions       [T] int64
    slot_mapping    [T] int64       flat cache slot per token, -1 = padding
    logits_rows     [S] int64       token row whose hidden state each sampling sequence reads
    seq_lens        [S] int32       0 = padding sequence
    query_start_loc [S + 1] int32
    lora            LoRABatch words (``LoRABatch.storage_layout(T, num_slots)``; the
                    per-token adapter strengths among them, float32 bits)
    block_tables    [S, W] int32    last, so a step copies only the rows it uses
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from multilora_studio.engine.batch.scheduler import ScheduledChunk
from multilora_studio.engine.step.staging_words import StagingWords, round4
from multilora_studio.kernels.lora_batch import LoRABatch, fill_lora_metadata


@dataclass(frozen=True)
class StagedStep:
    """A step whose inputs are in the staging buffers (copy already enqueued)."""

    num_tokens: int
    num_sampled: int  # sequences that sample a token this step (the first logits rows)
    uses_lora: bool


class StepStaging:
    """Fixed device buffers for steps of up to ``max_tokens`` tokens and ``max_seqs`` sequences."""

    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        num_slots: int,
        block_size: int,
        device: torch.device,
        one_token_per_seq: bool = False,
    ) -> None:
        if one_token_per_seq and max_tokens != max_seqs:
            raise ValueError(f"a decode staging has one token a sequence: {max_tokens} != {max_seqs}")
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.width = max_blocks_per_seq
        self.num_slots = num_slots
        self.block_size = block_size
        self.one_token_per_seq = one_token_per_seq
        t, s, w = max_tokens, max_seqs, max_blocks_per_seq
        lora_words = LoRABatch.storage_layout(t, num_slots)["total"][1]
        # int32 offsets inside the int32 region (16-byte aligned)
        self._qsl_at = round4(s)
        self._lora_at = self._qsl_at + round4(s + 1)
        self._tables_at = self._lora_at + round4(lora_words)
        self.words = StagingWords(3 * t + round4(s), self._tables_at + s * w, device)

        dev64, dev32 = self.words.device64, self.words.device32
        self.input_ids = dev64[0:t]  # [T] int64
        self.positions = dev64[t : 2 * t]  # [T] int64
        self.slot_mapping = dev64[2 * t : 3 * t]  # [T] int64
        self.logits_rows = dev64[3 * t : 3 * t + s]  # [S] int64
        self.seq_lens = dev32[0:s]  # [S] int32
        self.query_start_loc = dev32[self._qsl_at : self._qsl_at + s + 1]  # [S + 1] int32
        lora_words_dev = dev32[self._lora_at : self._lora_at + lora_words]
        self.lora_batch = LoRABatch.on_storage(lora_words_dev, t, num_slots)
        self.block_tables = dev32[self._tables_at : self._tables_at + s * w].view(s, w)  # [S, W]

        host, host32 = self.words.host64, self.words.host32
        self._h_input_ids = host[0:t]
        self._h_positions = host[t : 2 * t]
        self._h_slot_mapping = host[2 * t : 3 * t]
        self._h_logits_rows = host[3 * t : 3 * t + s]
        self._h_seq_lens = host32[0:s]
        self._h_qsl = host32[self._qsl_at : self._qsl_at + s + 1]
        self._h_lora = host32[self._lora_at : self._lora_at + lora_words]
        self._h_tables = host32[self._tables_at : self._tables_at + s * w].reshape(s, w)
        self._token_slots = np.full(t, -1, dtype=np.int64)  # [T] scratch: adapter slot per token
        self._token_scales = np.ones(t, dtype=np.float32)  # [T] scratch: adapter strength per token
        self._scaled = False  # whether _token_scales holds a strength other than 1.0
        self.clear()

    def clear(self) -> None:
        """An empty step: every token and sequence padding; copied now."""
        self.words.wait_for_last_copy()
        self._h_tables[:] = 0
        self._h_qsl[:] = 0
        if self.one_token_per_seq:  # each row a sequence that samples its one token: fixed words
            self._h_qsl[:] = np.arange(self.max_seqs + 1)
            self._h_logits_rows[:] = np.arange(self.max_seqs)
        self._pad(0, 0, 0)
        fill_lora_metadata(self._h_lora, self.max_tokens, self.num_slots, [], [0] * self.num_slots)
        self._copy(self.max_seqs)
        self.lora_batch.mark_filled(0)

    def accepts(self, chunks: Sequence[ScheduledChunk]) -> bool:
        """Whether the step fits the buffers (a decode staging: one sampled token a sequence)."""
        if not 0 < len(chunks) <= self.max_seqs:
            return False
        if self.one_token_per_seq:
            return all(c.num_tokens == 1 and c.completes for c in chunks)
        return sum(c.num_tokens for c in chunks) <= self.max_tokens

    def stage(
        self,
        chunks: Sequence[ScheduledChunk],
        slot_of: dict[str | None, int],
        slot_ranks: Sequence[int],
    ) -> StagedStep:
        """Write the step's tokens and sequences (then padding) and enqueue their copy.

        ``slot_of`` maps each chunk's adapter to its GPU slot (None -> -1); ``slot_ranks``
        is the rank held in each slot (the host view of the slot table).
        """
        self.words.wait_for_last_copy()
        bs, width = self.block_size, self.width
        token_slots = self._token_slots
        token_slots[:] = -1
        token_scales = self._token_scales  # all 1.0 unless the last step had strengths
        if self._scaled:
            token_scales[:] = 1.0
        scaled = False  # whether some token's adapter strength is not 1.0
        t = 0
        sampled = 0
        for i, chunk in enumerate(chunks):
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            table = seq.block_table
            if len(table) > width:
                raise ValueError(f"request {seq.request_id} has {len(table)} KV blocks, more than {width}")
            slot = slot_of.get(seq.adapter, -1)
            base = seq.base_prefix(start, start + n) if slot >= 0 else n  # before aLoRA's start
            strength = seq.params.adapter_scale
            if strength != 1.0 and base < n:
                token_scales[t + base : t + n] = strength
                scaled = True
            if n == 1:  # a decode token: scalar writes cost less than numpy's calls
                self._h_input_ids[t] = seq.token_at(start)
                self._h_positions[t] = start
                self._h_slot_mapping[t] = table[start // bs] * bs + start % bs
                token_slots[t] = -1 if base else slot
            else:
                span = np.arange(start, start + n)  # [n] positions
                self._h_input_ids[t : t + n] = seq.token_slice(start, start + n)
                self._h_positions[t : t + n] = span
                self._h_slot_mapping[t : t + n] = np.asarray(table)[span // bs] * bs + span % bs
                token_slots[t + base : t + n] = slot  # its first `base` stay -1 (cleared above)
            self._h_seq_lens[i] = start + n
            self._h_tables[i, : len(table)] = table
            t += n
            if not self.one_token_per_seq:
                self._h_qsl[i + 1] = t
                if chunk.completes:
                    self._h_logits_rows[sampled] = t - 1
                    sampled += 1
        count = len(chunks)
        if self.one_token_per_seq:
            sampled = count
        self._pad(t, count, sampled)
        uses_lora = bool((token_slots[:t] >= 0).any())
        if uses_lora:
            fill_lora_metadata(
                self._h_lora,
                self.max_tokens,
                self.num_slots,
                token_slots[:t],
                slot_ranks,
                token_scales[:t] if scaled else None,
            )
        self._copy(count)
        self._scaled = scaled
        if uses_lora:
            self.lora_batch.mark_filled(t, scaled)
        return StagedStep(t, sampled, uses_lora)

    def _pad(self, tokens: int, seqs: int, sampled: int) -> None:
        """Padding after the step's ``tokens`` tokens, ``seqs`` sequences and ``sampled`` rows."""
        self._h_input_ids[tokens:] = 0
        self._h_positions[tokens:] = 0
        self._h_slot_mapping[tokens:] = -1
        self._h_seq_lens[seqs:] = 0
        if not self.one_token_per_seq:
            self._h_qsl[seqs + 1 :] = tokens  # padding sequences own no token
            self._h_logits_rows[sampled:] = 0

    def _copy(self, seqs: int) -> None:
        """Send every word up to the end of block-table row ``seqs`` (padding rows need none)."""
        self.words.send(self._tables_at + seqs * self.width)
