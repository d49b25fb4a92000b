"""The storage moves under an engine's park (``engine/residency/device_parking.py``), run on the CPU with
the copies forced (as on CUDA): every tensor comes back bit for bit, views stay views of their
storage (a shrink-in-GEMM weight's layer rows and slot A rows, a tied LM head), and the memory
is freed while parked."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine.model.lora_weights import LoRASlotWeights
from multilora_studio.engine.model.model_source import resolve_model
from multilora_studio.engine.model.weights import GEMM_SLICES
from multilora_studio.engine.residency.adapter_packing import pack_adapter
from multilora_studio.engine.residency.device_parking import DeviceParking, tensors_of

CPU = torch.device("cpu")
SLOTS, MAX_RANK = 2, 8


def parked_state(model_dir, adapter_dir):
    """The base weights (with shrink-in-GEMM rows) and slots holding one adapter, as a runner has them."""
    base = resolve_model(str(model_dir), torch.float32, CPU, None, lora_rows=SLOTS * MAX_RANK)
    spec = base.spec
    lora = LoRASlotWeights(spec, SLOTS, MAX_RANK, torch.float32, CPU, base.weights.shrink_in_gemm_weights)
    host = load_peft_adapter("a", adapter_dir, spec.num_layers, spec.projection_shape, MAX_RANK)
    lora.upload(1, pack_adapter(host, spec, torch.float32, pin=False))
    own_memory(base.weights)
    return base.weights, lora


def own_memory(weights) -> None:
    """A CPU load keeps the checkpoint's own memory for the embedding and head, which cannot be
    resized (a CUDA load copies every tensor): give them memory of their own, ties kept."""
    tied = weights.lm_head is weights.embed
    weights.embed = weights.embed.clone()
    weights.lm_head = weights.embed if tied else weights.lm_head.clone()


def test_a_park_frees_every_storage_and_the_unpark_restores_it_with_its_views(tiny_model_dir, tiny_adapters):
    weights, lora = parked_state(tiny_model_dir, tiny_adapters["tiny-r8-all"])
    tensors = list(tensors_of(weights, *lora.device_state()))
    expected = [t.clone() for t in tensors]
    parking = DeviceParking(CPU, copy_kept=True)
    nbytes = parking.kept_bytes(tensors)
    # views are counted with their storage: the layers' GEMM weights and the A slots add nothing
    views = {id(getattr(layer, g)) for layer in weights.layers for g in GEMM_SLICES}
    views |= {id(a) for a in lora.a.values()}
    assert nbytes == parking.kept_bytes(t for t in tensors if id(t) not in views)
    assert nbytes < sum(t.nbytes for t in tensors)

    parking.park(tensors)
    assert parking.parked and parking.host is not None and parking.host.memory.numel() >= nbytes
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)  # freed
    parking.unpark()
    assert not parking.parked
    for tensor, before in zip(tensors, expected, strict=True):
        assert torch.equal(tensor, before)
    blocks = weights.shrink_in_gemm_weights
    for index, layer in enumerate(weights.layers):
        for group in GEMM_SLICES:
            assert getattr(layer, group).data_ptr() == blocks[group][index].data_ptr()  # still a view
    assert lora.a["qkv"].untyped_storage().data_ptr() == blocks["qkv"].untyped_storage().data_ptr()
    lora.a["qkv"][:, 0].fill_(3.0)  # written through the slot view: the GEMM weight sees it
    n = weights.layers[0].qkv.shape[0]
    assert torch.all(blocks["qkv"][:, n : n + 3 * MAX_RANK] == 3.0)

    host, expected = parking.host, [t.clone() for t in tensors]
    parking.park(tensors)  # a second park reuses the host buffer
    assert parking.host is host
    parking.unpark()
    assert all(torch.equal(t, e) for t, e in zip(tensors, expected, strict=True))


def test_a_tied_head_is_parked_once_and_stays_the_embedding(tiny_family_models):
    base = resolve_model(str(tiny_family_models["llama3.2-tied"]), torch.float32, CPU, None)
    weights = base.weights
    own_memory(weights)
    assert weights.lm_head is weights.embed
    tensors = list(tensors_of(weights))
    parking = DeviceParking(CPU, copy_kept=True)
    untied = tensors_of(weights.layers, weights.embed, weights.final_norm)  # the head left out
    assert parking.kept_bytes(tensors) == parking.kept_bytes(untied)
    embed = weights.embed.clone()
    parking.park(tensors)
    parking.unpark()
    assert weights.lm_head is weights.embed and torch.equal(weights.lm_head, embed)


def test_tensors_that_cannot_move_are_refused_before_anything_changes():
    shared = torch.ones(4)
    shared.numpy()  # memory shared with NumPy, as the CPU kernels do: not resizable
    parking = DeviceParking(CPU, copy_kept=True)
    free = torch.ones(3)
    with pytest.raises(ValueError, match="shared with NumPy"):
        parking.park([free, shared])
    assert not parking.parked and free.untyped_storage().nbytes() == 12 and torch.equal(shared, torch.ones(4))
