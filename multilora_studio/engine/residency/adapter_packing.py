"""Adapters laid out as their GPU slot will hold them (``PackedAdapter``), in the engine's dtype:
packed once, off the worker thread, into a block of host memory where one is free.

Layout of each group an adapter targets (see ``PackedAdapter``):
    a[group]: [layers, slices, rank, in_features]
    b[group]: [layers, out_total, rank]   (scale folded in)
    rows["kind:group"]: [layers, out_total]   lora_bias or DoRA's magnitude
"""

from __future__ import annotations

import itertools

import torch

from multilora_studio.adapters.peft_adapter import HostAdapter
from multilora_studio.engine.model.lora_weights import GROUP_OF, LORA_GROUPS, PackedAdapter, group_widths
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.residency.pinned_arena import BlockSource, carve, carved_bytes


def packed_shapes(
    spec: ModelSpec, rank: int, groups: list[str], row_keys: tuple[str, ...] = ()
) -> list[tuple[int, ...]]:
    """Shapes of a packed adapter's tensors: a then b per group, in ``groups`` order, then the
    per-row vectors of ``row_keys`` ("kind:group")."""
    shapes: list[tuple[int, ...]] = []
    for group in groups:
        modules = LORA_GROUPS[group]
        in_features = spec.projection_shape(modules[0])[1]
        out_total = sum(group_widths(spec, group))
        shapes += [(spec.num_layers, len(modules), rank, in_features), (spec.num_layers, out_total, rank)]
    return shapes + [(spec.num_layers, sum(group_widths(spec, key.split(":")[1]))) for key in row_keys]


def max_packed_bytes(spec: ModelSpec, max_rank: int, dtype: torch.dtype) -> int:
    """Host bytes of the largest packed adapter: ``max_rank`` on every group the base takes LoRA on, with
    one per-row vector each (DoRA's magnitude or lora_bias; PEFT never has both)."""
    rows = tuple(f"magnitude:{group}" for group in spec.lora_groups)
    return carved_bytes(packed_shapes(spec, max_rank, list(spec.lora_groups), rows), dtype)


def row_keys_of(adapter: HostAdapter) -> tuple[str, ...]:
    """The "kind:group" keys of the per-row vectors ``adapter`` packs into."""
    keys = {f"bias:{GROUP_OF[module][0]}" for _, module in adapter.biases}
    keys |= {f"magnitude:{GROUP_OF[module][0]}" for _, module in adapter.magnitudes}
    return tuple(sorted(keys))


def pack_adapter(
    adapter: HostAdapter,
    spec: ModelSpec,
    dtype: torch.dtype,
    pin: bool,
    arena: BlockSource | None = None,
    keep: int = 0,
) -> PackedAdapter:
    """Lay ``adapter``'s factors out as its slot will hold them (done once, off the worker thread).

    With ``arena``, the tensors live in one of its blocks while more than ``keep`` are free (no
    page-locking now), else in pageable memory. ``pin`` page-locks the token tables.
    """
    rank = adapter.rank
    by_group: dict[str, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), (a, b) in adapter.weights.items():
        group, index = GROUP_OF[module]
        by_group.setdefault(group, []).append((layer, index, a, b))
    groups = list(by_group)
    row_keys = row_keys_of(adapter)
    shapes = packed_shapes(spec, rank, groups, row_keys)
    packed = PackedAdapter(adapter.name, rank, {}, {})
    block = None
    if arena is not None and carved_bytes(shapes, dtype) <= arena.block_bytes:
        block = arena.take(packed, keep)  # given back when ``packed`` is collected
        packed.pinned = block is not None and arena.pin
    if block is not None:
        # zeroed below only where the factors leave gaps: a block of a full adapter is overwritten
        tensors = carve(block, shapes, dtype, zero=False)
    else:
        tensors = [torch.zeros(shape, dtype=dtype) for shape in shapes]
    for g, group in enumerate(groups):
        modules = LORA_GROUPS[group]
        offsets = (0, *itertools.accumulate(spec.projection_shape(m)[0] for m in modules))
        a_all, b_all = tensors[2 * g], tensors[2 * g + 1]  # [L, S, r, in], [L, out_total, r]
        covered = len(by_group[group]) == spec.num_layers * len(modules)
        if block is not None and not (covered and all(a.shape[0] == rank for _, _, a, _ in by_group[group])):
            a_all.zero_()  # a module or layer it leaves out, or a rank below the adapter's
            b_all.zero_()
        for layer, index, a, b in by_group[group]:
            r = a.shape[0]
            a_all[layer, index, :r] = a
            b_all[layer, offsets[index] : offsets[index + 1], :r] = b
        packed.a[group] = a_all
        packed.b[group] = b_all
    vectors = {"bias": adapter.biases, "magnitude": adapter.magnitudes}
    for key, rows in zip(row_keys, tensors[2 * len(groups) :], strict=True):  # [L, out_total]
        kind, group = key.split(":")
        rows.fill_(float("nan") if kind == "magnitude" else 0.0)
        modules = LORA_GROUPS[group]
        offsets = (0, *itertools.accumulate(spec.projection_shape(m)[0] for m in modules))
        for (layer, module), vector in vectors[kind].items():
            owner, index = GROUP_OF[module]
            if owner == group:
                rows[layer, offsets[index] : offsets[index + 1]] = vector
        packed.rows[key] = rows
    if adapter.tokens is not None:
        packed.tokens = adapter.tokens.to(dtype, pin)
    return packed
