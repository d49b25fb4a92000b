"""An engine's base swapped out and back in (``Engine.park`` / ``unpark``, BasePool's time-share
swap): its device memory freed while parked, the same tokens after as before, and its adapters,
pins and slots kept."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from multilora_studio.engine import Engine, EngineMetrics, SamplingParams
from multilora_studio.engine.residency.device_parking import tensors_of
from tests.engine.conftest import tiny_engine_config
from tests.waiting import wait_until

PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7], [1, 5, 6]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
ADAPTERS = ["tiny-r8-all", None, "tiny-r16-mlp"]


def weight_storages(engine: Engine) -> list[torch.UntypedStorage]:
    runner = engine.runner
    tensors = tensors_of(runner.weights, *runner.lora.device_state())
    return [t.untyped_storage() for t in tensors if t.layout == torch.strided]


def snapshot(engine: Engine) -> EngineMetrics:
    snap = engine.metrics(fresh=True)
    assert snap is not None
    return snap


def pinned_in_slot(engine: Engine, name: str) -> bool:
    return any(slot.adapter == name and slot.pinned for slot in snapshot(engine).slots)


@pytest.mark.parametrize(
    "options",
    [{}, {"lora_shrink_in_gemm": True}],  # with the slots' A rows inside the GEMM weights (views)
    ids=["plain", "shrink-in-gemm"],
)
def test_a_parked_engine_frees_its_memory_and_answers_the_same_after(
    tiny_model_dir, tiny_adapters, engine_device, options
):
    """On CUDA the weights leave the device; on the CPU they stay where they are (the CPU
    kernels share their memory with NumPy), and the rest of the swap runs the same way."""
    config = tiny_engine_config(tiny_model_dir, device=engine_device, **options)
    with Engine(config) as engine:
        moved = engine.device.type == "cuda"
        for name in ("tiny-r8-all", "tiny-r16-mlp"):
            engine.add_adapter(name, tiny_adapters[name])
        engine.pin_adapter("tiny-r8-all")
        before = [o.token_ids for o in engine.generate(PROMPTS, ADAPTERS, GREEDY)]
        wait_until(lambda: pinned_in_slot(engine, "tiny-r8-all"), 60, "the pinned adapter in its slot")
        if moved:  # every weight in a storage (no oneDNN packing): each storage's bytes once
            unique = {s.data_ptr(): s.nbytes() for s in weight_storages(engine)}
            assert engine.park_bytes() == sum(unique.values())
        kv_shape = engine.runner.kv_cache.shape
        kv = weakref.ref(engine.runner.kv_cache)

        before_steps = snapshot(engine).steps
        engine.park()
        assert engine.parked and snapshot(engine).state == "parked"
        gc.collect()
        assert kv() is None and engine.runner.kv_cache.numel() == 0  # the KV cache is freed
        assert all((s.nbytes() == 0) == moved for s in weight_storages(engine))
        # a parked engine keeps its registrations and pins (no device work while parked)
        assert {info.name for info in engine.list_adapters()} == {"tiny-r8-all", "tiny-r16-mlp"}
        assert engine.pinned_adapters() == ["tiny-r8-all"]
        with pytest.raises(RuntimeError, match="swapped out"):
            engine.remove_adapter("tiny-r16-mlp")
        waiting = engine.submit(PROMPTS[2], ADAPTERS[2], GREEDY)  # waits for the swap-in
        snap = snapshot(engine)
        assert snap.waiting == 1 and snap.steps == before_steps
        assert not waiting.finished

        engine.unpark()
        assert not engine.parked and engine.runner.kv_cache.shape == kv_shape
        assert waiting.result(60).token_ids == before[2]
        assert pinned_in_slot(engine, "tiny-r8-all")  # still in its slot, still pinned
        after = [o.token_ids for o in engine.generate(PROMPTS, ADAPTERS, GREEDY)]
        assert after == before


def test_park_is_refused_while_requests_are_queued(tiny_model_dir, engine_device):
    with Engine(tiny_engine_config(tiny_model_dir, device=engine_device)) as engine:
        engine.park()
        stream = engine.submit(PROMPTS[0], None, GREEDY)  # queued while parked: it waits
        with pytest.raises(RuntimeError, match="1 requests are queued or running"):
            engine.park()
        engine.unpark()
        assert len(stream.result(60).token_ids) == GREEDY.max_tokens
        engine.unpark()  # not parked: nothing to do
        assert not engine.parked
