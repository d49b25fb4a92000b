"""Adapter weights resident on the device: one slot per adapter, per layer and projection group.

Storage (allocated once, zeros; see ``multilora_studio.kernels.lora`` for the kernels' view):
    a[group]: [layers, slots, slices, max_rank, in_features]
    b[group]: [layers, slots, out_total, max_rank]   slice s = rows offsets[s]:offsets[s+1]
    slot_ranks: [slots] int32, 0 = empty slot
The LoRA scale is folded into B when a slot is filled.
"""

from __future__ import annotations

import itertools

import torch

from multilora_studio.adapters.peft_adapter import HostAdapter
from multilora_studio.engine.model_spec import ModelSpec

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


class LoRASlotWeights:
    """The device-side LoRA factor buffers for ``num_slots`` adapters."""

    def __init__(
        self, spec: ModelSpec, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.offsets: dict[str, tuple[int, ...]] = {}
        for group, modules in LORA_GROUPS.items():
            in_features = spec.projection_shape(modules[0])[1]
            widths = [spec.projection_shape(module)[0] for module in modules]
            self.offsets[group] = (0, *itertools.accumulate(widths))
            self.a[group] = torch.zeros(
                (spec.num_layers, num_slots, len(modules), max_rank, in_features), dtype=dtype, device=device
            )
            self.b[group] = torch.zeros(
                (spec.num_layers, num_slots, sum(widths), max_rank), dtype=dtype, device=device
            )
        self.slot_ranks = torch.zeros(num_slots, dtype=torch.int32, device=device)  # [slots]
        self.slot_groups: list[frozenset[str]] = [frozenset()] * num_slots
        self.slot_adapter: list[str | None] = [None] * num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in itertools.chain(self.a.values(), self.b.values()))

    def clear(self, slot: int) -> None:
        for group in LORA_GROUPS:
            self.a[group][:, slot].zero_()
            self.b[group][:, slot].zero_()
        self.slot_ranks[slot] = 0
        self.slot_groups[slot] = frozenset()
        self.slot_adapter[slot] = None

    def load(self, slot: int, adapter: HostAdapter) -> None:
        """Fill ``slot`` with ``adapter``'s factors (zeros where it has none)."""
        self.clear(slot)
        groups = set()
        for (layer, module), (a, b) in adapter.weights.items():
            group, index = GROUP_OF[module]
            rank = a.shape[0]
            start, stop = self.offsets[group][index], self.offsets[group][index + 1]
            self.a[group][layer, slot, index, :rank].copy_(a, non_blocking=True)  # [r, in]
            self.b[group][layer, slot, start:stop, :rank].copy_(b, non_blocking=True)  # [out, r]
            groups.add(group)
        self.slot_ranks[slot] = adapter.rank
        self.slot_groups[slot] = frozenset(groups)
        self.slot_adapter[slot] = adapter.name
