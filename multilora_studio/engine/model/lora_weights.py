"""Adapter weights resident on the device: one slot per adapter, per layer and projection group.

Storage (allocated once, zeros; see ``multilora_studio.kernels.lora`` for the kernels' view):
    a[group]: [layers, slots, slices, max_rank, in_features]   (with the shrink in GEMM: a view
              of the rows after the base weight's, ``engine/model/weights.py``)
    b[group]: [layers, slots, out_total, max_rank]   slice s = rows offsets[s]:offsets[s+1]
              (on the CPU a transposed view of [layers, slots, max_rank, out_total] storage)
    slot_ranks: [slots] int32, 0 = empty slot
    row_scale[group], row_bias[group]: [layers, slots + 1, out_total], every group's of both
              kinds made when the first DoRA or LoRA-bias adapter is uploaded (so that every
              step with per-row terms runs one kernel variant, the one the warm-up compiles):
              each slot's per-row output scale (DoRA's magnitude / ||W + B A||, 1 elsewhere)
              and bias (lora_bias, 0 elsewhere); row ``slots`` is for tokens without an
              adapter (1 and 0)
    token_tables: the embedding / LM-head tables of the slots' adapters that have them
              (``engine/model/token_tables.py``), filled and cleared with the slot
The LoRA scale is folded into B when a slot is filled. Only the groups the base takes LoRA on
(``ModelSpec.lora_groups``: attention only on a mixture-of-experts base) have buffers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from multilora_studio.adapters.token_tables import TokenTables
from multilora_studio.engine.model.dora import BaseProjection, dora_row_scale
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.token_tables import TokenTablePool

# projection group (one kernel launch) -> the HF modules that are its slices, in row order
LORA_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
GROUP_OF = {
    module: (group, index) for group, modules in LORA_GROUPS.items() for index, module in enumerate(modules)
}


def group_widths(spec: ModelSpec, group: str) -> list[int]:
    """The output features of each projection of ``group``, in ``LORA_GROUPS`` order."""
    return [spec.projection_shape(module)[0] for module in LORA_GROUPS[group]]


def row_buffer_bytes(spec: ModelSpec, num_slots: int, dtype: torch.dtype) -> int:
    """Device memory of every group's ``row_scale`` and ``row_bias`` (``ensure_row_buffers``)."""
    out_total = sum(sum(group_widths(spec, group)) for group in spec.lora_groups)
    return 2 * spec.num_layers * (num_slots + 1) * out_total * dtype.itemsize


class LoRASlotWeights:
    """The device-side LoRA factor buffers for ``num_slots`` adapters."""

    def __init__(
        self,
        spec: ModelSpec,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        shrink_in_gemm_weights: dict[str, torch.Tensor] | None = None,
        base: BaseProjection | None = None,
        token_tables: TokenTablePool | None = None,
    ) -> None:
        self.num_slots = num_slots
        self.token_tables = token_tables or TokenTablePool(0, 0, device)
        self.spec = spec
        self.dtype = dtype
        self.device = device
        self.base = base  # what DoRA's row norms are computed against
        # group -> [layers, N + slices * slots * max_rank, K] with the shrink in GEMM (weights.py)
        self.shrink_in_gemm_weights = shrink_in_gemm_weights or {}
        self.max_rank = max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.offsets: dict[str, tuple[int, ...]] = {}
        self.groups = spec.lora_groups  # the groups with buffers
        for group in self.groups:
            modules = LORA_GROUPS[group]
            in_features = spec.projection_shape(modules[0])[1]
            widths = group_widths(spec, group)
            self.offsets[group] = (0, *itertools.accumulate(widths))
            a_shape = (spec.num_layers, num_slots, len(modules), max_rank, in_features)
            out_total = sum(widths)
            if group in self.shrink_in_gemm_weights:
                weight = self.shrink_in_gemm_weights[group]  # [L, N + S * slots * R, K]
                if tuple(weight.shape) != (
                    spec.num_layers,
                    out_total + num_slots * len(modules) * max_rank,
                    in_features,
                ):
                    raise ValueError(
                        f"shrink-in-GEMM weight of {group} has shape {tuple(weight.shape)}, "
                        "not the slots' layout"
                    )
                self.a[group] = weight[:, out_total:].view(a_shape)
            else:
                self.a[group] = torch.zeros(a_shape, dtype=dtype, device=device)
            if torch.device(device).type == "cpu":
                # Rank-major storage, handed out as a transposed view: the CPU kernel's
                # expand then reads each rank's outputs contiguously (kernels/lora_cpu.py).
                b = torch.zeros((spec.num_layers, num_slots, max_rank, out_total), dtype=dtype)
                self.b[group] = b.transpose(2, 3)
            else:
                self.b[group] = torch.zeros(
                    (spec.num_layers, num_slots, out_total, max_rank), dtype=dtype, device=device
                )
        self.slot_ranks = torch.zeros(num_slots, dtype=torch.int32, device=device)  # [slots]
        self.slot_ranks_host = [0] * num_slots  # the same ranks, for metadata built on the host
        self.slot_groups: list[frozenset[str]] = [frozenset()] * num_slots
        # groups whose outputs a slot scales or shifts per row (DoRA, lora_bias)
        self.slot_row_groups: list[frozenset[str]] = [frozenset()] * num_slots
        self.slot_adapter: list[str | None] = [None] * num_slots
        self.row_scale: dict[str, torch.Tensor] = {}
        self.row_bias: dict[str, torch.Tensor] = {}

    def ensure_row_buffers(self) -> None:
        """Every group's ``row_scale`` (ones) and ``row_bias`` (zeros) [L, slots + 1, out_total],
        made once: what a step with per-row terms reads, eager or in a CUDA graph."""
        for group in self.groups:
            shape = (self.spec.num_layers, self.num_slots + 1, self.offsets[group][-1])
            if group not in self.row_scale:
                self.row_scale[group] = torch.ones(shape, dtype=self.dtype, device=self.device)
            if group not in self.row_bias:
                self.row_bias[group] = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def drop_row_buffers(self) -> None:
        """Forget the per-row buffers (their memory goes back to the allocator); only while no
        slot holds an adapter with per-row terms."""
        assert not any(self.slot_row_groups), "a slot's adapter has per-row terms"
        self.row_scale.clear()
        self.row_bias.clear()

    def _reset_rows(self, slot: int) -> None:
        for group in self.groups:  # every buffer made: one may exist for a group the slot lacks
            if group in self.row_scale:
                self.row_scale[group][:, slot].fill_(1.0)
            if group in self.row_bias:
                self.row_bias[group][:, slot].zero_()
        self.slot_row_groups[slot] = frozenset()

    def device_state(self) -> list[object]:
        """What the slots hold on the device: tensors, and the token tables' dataclasses that
        hold more (read by ``device_parking.tensors_of`` for a park of the engine)."""
        pool = self.token_tables
        norms = list(self.base.sq_norms.values()) if self.base is not None else []
        return [
            *self.a.values(), *self.b.values(), *self.row_scale.values(), *self.row_bias.values(),
            self.slot_ranks, *norms, *pool.tables.values(), pool.embed_swaps, pool.head_swaps,
        ]  # fmt: skip

    @property
    def nbytes(self) -> int:
        rows = itertools.chain(self.row_scale.values(), self.row_bias.values())
        return sum(t.nbytes for t in itertools.chain(self.a.values(), self.b.values(), rows))

    def shrink_in_gemm_rows(self, group: str, span: int) -> int:
        """Rows of ``group``'s shrink-in-GEMM weight up to the A rows of slot ``span`` (slot-major)."""
        return self.offsets[group][-1] + span * (len(self.offsets[group]) - 1) * self.max_rank

    def slot_span(self, highest_slot: int) -> int:
        """The leading slots a shrink-in-GEMM step multiplies when its highest slot is
        ``highest_slot``: the next power of two above it, at most every slot (few graphs)."""
        return min(self.num_slots, 1 << max(highest_slot, 0).bit_length())

    def split_shrink_in_gemm(self, group: str, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base output [T, N] and the shrink against the leading slots [T, span, S, R]
        (views) of a GEMM over ``group``'s shrink-in-GEMM weight up to slot ``span``,
        ``out`` [T, N + S * span * R]."""
        n = self.offsets[group][-1]
        slices = len(self.offsets[group]) - 1
        return out[:, :n], out[:, n:].view(out.shape[0], -1, slices, self.max_rank)

    def clear(self, slot: int) -> None:
        for group in self.groups:
            self.a[group][:, slot].zero_()
            self.b[group][:, slot].zero_()
        self.slot_ranks[slot].fill_(0)
        self.slot_ranks_host[slot] = 0
        self.slot_groups[slot] = frozenset()
        self._reset_rows(slot)
        self.token_tables.clear(slot)
        self.slot_adapter[slot] = None

    def upload(self, slot: int, packed: PackedAdapter) -> None:
        """Fill ``slot`` with ``packed`` (zeros where it has no factors), on the current stream.

        From pinned host memory the copies are asynchronous; the caller records an event on
        the stream and admits the adapter's requests once it has completed.
        """
        rank = packed.rank
        for group in self.groups:
            a_slot, b_slot = self.a[group][:, slot], self.b[group][:, slot]  # [L, S, R, in], [L, out, R]
            if group in packed.a:
                a_slot[:, :, :rank].copy_(packed.a[group], non_blocking=True)
                b_slot[:, :, :rank].copy_(packed.b[group], non_blocking=True)
                a_slot[:, :, rank:].zero_()
                b_slot[:, :, rank:].zero_()
            else:
                a_slot.zero_()
                b_slot.zero_()
        self.slot_ranks[slot].fill_(rank)  # a kernel on the current stream, no host sync
        self.slot_ranks_host[slot] = rank
        self.slot_groups[slot] = frozenset(packed.a)
        self._reset_rows(slot)
        self.token_tables.put(slot, packed.tokens)
        if packed.rows:
            self.ensure_row_buffers()
        for key, stored in packed.rows.items():  # [L, out_total]
            kind, group = key.split(":")
            rows = stored
            if kind == "magnitude":
                if self.base is None:
                    raise ValueError("DoRA adapters need the base weights: LoRASlotWeights(base=...)")
                a = self.a[group][:, slot, :, :rank]  # [L, S, r, in]
                b = self.b[group][:, slot, :, :rank]  # [L, out_total, r]
                rows = dora_row_scale(stored, a, b, self.offsets[group], group, self.base)
            (self.row_scale if kind == "magnitude" else self.row_bias)[group][:, slot].copy_(
                rows, non_blocking=True
            )
        self.slot_row_groups[slot] = frozenset(key.split(":")[1] for key in packed.rows)
        self.slot_adapter[slot] = packed.name


@dataclass
class PackedAdapter:
    """An adapter in slot layout and the engine's dtype, ready to copy into a slot.

    Storage (page-locked when ``pinned``: it can be copied into a slot asynchronously), for each
    group it targets,
        a[group]: [layers, slices, rank, in_features]
        b[group]: [layers, out_total, rank]   (scale folded in)
        rows["bias:group"]: [layers, out_total]   lora_bias times the scale (0 where none)
        rows["magnitude:group"]: [layers, out_total]   DoRA's magnitude (NaN: not DoRA)
    """

    name: str
    rank: int
    a: dict[str, torch.Tensor]
    b: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: TokenTables | None = None  # its embedding / LM-head tables (HostAdapter.tokens)
    pinned: bool = False  # a, b and rows lie in a block of a pinned arena

    @property
    def nbytes(self) -> int:
        tensors = itertools.chain(self.a.values(), self.b.values(), self.rows.values())
        return sum(t.nbytes for t in tensors) + (self.tokens.nbytes if self.tokens is not None else 0)
