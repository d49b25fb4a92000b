"""Shrink-in-GEMM weights: each layer's base weight followed by every LoRA slot's A rows, in one tensor."""

from __future__ import annotations

import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine.model.lora_weights import LORA_GROUPS, LoRASlotWeights
from multilora_studio.engine.model.model_source import resolve_model
from multilora_studio.engine.model.weights import GEMM_SLICES, gemm_shape
from multilora_studio.engine.residency.adapter_packing import pack_adapter

SLOTS, MAX_RANK = 3, 32
CPU = torch.device("cpu")


def test_weights_hold_the_checkpoint_weights_and_zero_lora_rows(tiny_model_dir):
    plain = resolve_model(str(tiny_model_dir), torch.float32, CPU, None)
    blocked = resolve_model(str(tiny_model_dir), torch.float32, CPU, None, lora_rows=SLOTS * MAX_RANK)
    assert not plain.weights.shrink_in_gemm_weights
    spec = blocked.spec
    for group, slices in GEMM_SLICES.items():
        n, k = gemm_shape(spec, group)
        block = blocked.weights.shrink_in_gemm_weights[group]
        assert block.shape == (spec.num_layers, n + slices * SLOTS * MAX_RANK, k)
        assert torch.count_nonzero(block[:, n:]) == 0  # empty slots
        for index, (layer, reference) in enumerate(
            zip(blocked.weights.layers, plain.weights.layers, strict=True)
        ):
            weight = getattr(layer, group)
            assert torch.equal(weight, getattr(reference, group)), (group, index)
            assert weight.data_ptr() == block[index].data_ptr()  # a view of the block, not a copy


def test_slot_uploads_land_in_the_rows_a_gemm_reads(tiny_model_dir, tiny_adapters):
    base = resolve_model(str(tiny_model_dir), torch.float32, CPU, None, lora_rows=SLOTS * MAX_RANK)
    spec, blocks = base.spec, base.weights.shrink_in_gemm_weights
    lora = LoRASlotWeights(spec, SLOTS, MAX_RANK, torch.float32, CPU, blocks)
    name = "tiny-r8-all"
    host = load_peft_adapter(name, tiny_adapters[name], spec.num_layers, spec.projection_shape, MAX_RANK)
    packed = pack_adapter(host, spec, torch.float32, pin=False)
    lora.upload(1, packed)
    x = torch.randn(5, spec.hidden_size, generator=torch.Generator().manual_seed(0))  # [T, H]
    layer = 2
    for group in ("qkv", "gate_up"):
        out = x @ blocks[group][layer].T  # [T, N + S * slots * R]
        y, shrunk = lora.split_shrink_in_gemm(group, out)  # [T, N], [T, slots, S, R]
        assert torch.allclose(y, x @ getattr(base.weights.layers[layer], group).T, atol=1e-5)
        a = packed.a[group][layer]  # [S, r, K]
        expected = torch.einsum("tk,srk->tsr", x, a)  # [T, S, r]
        assert torch.allclose(shrunk[:, 1, :, : packed.rank], expected, atol=1e-5)
        assert torch.count_nonzero(shrunk[:, 1, :, packed.rank :]) == 0  # rank padding
        assert torch.count_nonzero(shrunk[:, [0, 2]]) == 0  # the other slots are empty
    lora.clear(1)
    for group in LORA_GROUPS:
        n = gemm_shape(spec, group)[0]
        assert torch.count_nonzero(blocks[group][:, n:]) == 0, group  # no stale factors left behind
